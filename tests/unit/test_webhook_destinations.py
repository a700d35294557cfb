"""Which webhook URLs are refused before anything is sent, and signatures the client accepts."""

from __future__ import annotations

import json

import pytest
from gpupool_client import InvalidSignature, verify_signature

from gpupool.config import allowed_networks
from gpupool.errors import WebhookUrlRefused
from gpupool.webhooks.destinations import check_destination
from gpupool.webhooks.sender import signature_header


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


@pytest.mark.parametrize(
    "address",
    [
        # NAT64, well-known prefix: a gateway would forward to the embedded IPv4 address.
        "64:ff9b::7f00:1", "64:ff9b::a00:1", "64:ff9b::a9fe:a9fe", "64:ff9b::5db8:d822",
        # NAT64, local-use prefix.
        "64:ff9b:1::a00:1", "64:ff9b:1:ffff::5db8:d822",
        # IPv4-compatible (::a.b.c.d), private and public alike.
        "::127.0.0.1", "::10.0.0.1", "::169.254.169.254", "::93.184.216.34",
        # IPv4-mapped and IPv4-translated, private and public alike.
        "::ffff:10.0.0.1", "::ffff:169.254.169.254", "::ffff:93.184.216.34", "::ffff:0:10.0.0.1", "::ffff:0:93.184.216.34",
    ],
)
def test_ipv6_forms_embedding_an_ipv4_address_are_refused_whatever_it_is(address: str) -> None:
    with pytest.raises(WebhookUrlRefused) as refused:
        check_destination(f"http://[{address}]/hook", ())
    assert refused.value.details["errors"] == [{"field": "url", "message": "address not allowed"}]
    # Allowlisting the IPv4 network the address embeds does not open its IPv6 forms either.
    with pytest.raises(WebhookUrlRefused):
        check_destination(f"http://[{address}]/hook", allowed_networks(["0.0.0.0/0"], "webhook_allow_cidrs"))


def test_an_explicitly_allowlisted_nat64_network_is_reached() -> None:
    # An operator whose intranet receiver only has a NAT64 address may name that network.
    destination = check_destination("http://[64:ff9b::a00:1]:8080/hook", allowed_networks(["64:ff9b::a00:0/120"], "webhook_allow_cidrs"))
    assert destination.pinned_url() == "http://[64:ff9b::a00:1]:8080/hook"


def test_a_public_ipv6_address_still_passes() -> None:
    assert check_destination("https://[2606:2800:220:1:248:1893:25c8:1946]/hook", ()).host_header() == "[2606:2800:220:1:248:1893:25c8:1946]"


def test_public_and_allowlisted_addresses_pass_and_are_pinned() -> None:
    public = check_destination("https://93.184.216.34/events?x=1", ())
    assert public.pinned_url() == "https://93.184.216.34:443/events?x=1"
    assert public.host_header() == "93.184.216.34"
    allow = allowed_networks(["127.0.0.0/8", "::1/128"], "webhook_allow_cidrs")
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
