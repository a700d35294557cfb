"""Which webhook URLs are refused before anything is sent, and signatures the client accepts."""

from __future__ import annotations

import json

import pytest
from gpupool_client import InvalidSignature, verify_signature

from gpupool.errors import WebhookUrlRefused
from gpupool.webhooks import allowed_networks, check_destination, signature_header


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/hook", "http://[::1]/hook", "http://[::ffff:127.0.0.1]/hook", "http://localhost:8080/hook",
        "http://10.0.0.1/hook", "http://172.16.5.4/hook", "http://192.168.1.1/hook", "http://100.64.0.1/hook",
        "http://169.254.169.254/latest/meta-data/", "http://[fd00:ec2::254]/", "http://[fe80::1]/", "http://0.0.0.0/",
        "http://224.0.0.1/", "ftp://example.com/hook", "http://user:pw@93.184.216.34/hook", "https:///nohost",
        "http://93.184.216.34:99999/",
        # Found by schemathesis: urlsplit raises on it, which was a 500.
        'http://[3EUtBtbMyaAD:YsLs[P:"#FtA%J,J:L4',
    ],
)
def test_internal_or_malformed_destinations_are_refused(url: str) -> None:
    with pytest.raises(WebhookUrlRefused):
        check_destination(url, ())


def test_public_and_allowlisted_addresses_pass_and_are_pinned() -> None:
    public = check_destination("https://93.184.216.34/events?x=1", ())
    assert public.pinned_url() == "https://93.184.216.34:443/events?x=1"
    assert public.host_header() == "93.184.216.34"
    allow = allowed_networks(["127.0.0.0/8", "::1/128"])
    local = check_destination("http://localhost:8123/hook", allow)
    assert {str(address) for address in local.addresses} <= {"127.0.0.1", "::1"}
    assert local.host_header() == "localhost:8123"
    with pytest.raises(WebhookUrlRefused):
        check_destination("http://10.0.0.1/", allow)  # allowlisting loopback opens nothing else


def test_the_servers_signature_is_what_the_client_verifies() -> None:
    body = json.dumps({"id": "evt_1", "type": "job.ended"}).encode()
    header = signature_header(body, "whsec_x", 1_000_000)
    assert verify_signature(body, header, "whsec_x", now=1_000_010)["id"] == "evt_1"
    with pytest.raises(InvalidSignature):
        verify_signature(body + b" ", header, "whsec_x", now=1_000_010)
