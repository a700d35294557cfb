"""What a webhook may point at: a URL whose host resolves only to public (or operator-allowlisted) addresses.

Checked when the URL is registered and again before every attempt, after
resolving the name; the sender then connects to the address that was checked
(``Destination.pinned_url``), so a name cannot re-resolve elsewhere in
between. IPv6 forms that embed an IPv4 address (mapped, compatible, NAT64)
are refused whatever that address is.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from gpupool.config import Network
from gpupool.errors import WebhookUrlRefused

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def url_origin(url: str) -> str:
    """scheme://host[:port] of a receiver's URL: its path and query may hold the receiver's own secret (Slack's do)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    shown = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{shown}" + (f":{parts.port}" if parts.port else "")


# IPv6 forms that carry an IPv4 address and reach it: IPv4-mapped (a dual-stack socket
# connects to the IPv4 host), IPv4-translated (SIIT), IPv4-compatible (deprecated, still
# routed by some stacks) and NAT64 (the well-known and the local-use prefix: a NAT64
# gateway forwards to the embedded address, which may be 10.0.0.1 or 169.254.169.254).
# Refused whatever the embedded address: no receiver needs them, and judging the
# embedded address would mean trusting every translator on the path to map it faithfully.
EMBEDDED_IPV4_NETWORKS: tuple[ipaddress.IPv6Network, ...] = tuple(
    ipaddress.IPv6Network(cidr) for cidr in ("::ffff:0:0/96", "::ffff:0:0:0/96", "::/96", "64:ff9b::/96", "64:ff9b:1::/48")
)


def _address_allowed(address: Address, allow: Sequence[Network]) -> bool:
    if any(address in network for network in allow):
        return True  # an operator's allowlist names exact networks, translated ones included
    if isinstance(address, ipaddress.IPv6Address) and any(address in network for network in EMBEDDED_IPV4_NETWORKS):
        return False
    # Not global: loopback, private, link-local (169.254.169.254, the cloud metadata
    # service, among them), shared, reserved, multicast and unspecified addresses.
    return address.is_global and not address.is_multicast


@dataclass(frozen=True)
class Destination:
    """A receiver URL and the addresses its host resolved to, every one of them allowed."""

    url: str
    scheme: str
    host: str
    port: int
    target: str  # path and query
    addresses: tuple[Address, ...]

    def pinned_url(self) -> str:
        address = self.addresses[0]
        literal = f"[{address}]" if address.version == 6 else str(address)
        return f"{self.scheme}://{literal}:{self.port}{self.target}"

    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"


def check_destination(url: str, allow: Sequence[Network]) -> Destination:
    """Resolve ``url``'s host and refuse it unless every address is public or allowlisted; sends nothing."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # "Invalid IPv6 URL" and the like: not a URL at all
        raise WebhookUrlRefused(f"the webhook URL is not a valid URL: {exc}", errors=[{"field": "url", "message": "not a URL"}]) from exc
    if parts.scheme not in ("http", "https"):
        raise WebhookUrlRefused("a webhook URL must start with https:// or http://", errors=[{"field": "url", "message": "not http(s)"}])
    if not parts.hostname:
        raise WebhookUrlRefused("the webhook URL has no host", errors=[{"field": "url", "message": "no host"}])
    if parts.username or parts.password:
        raise WebhookUrlRefused(
            "put no credentials in a webhook URL; verify the Gpupool-Signature header instead",
            errors=[{"field": "url", "message": "credentials in the URL"}],
        )
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise WebhookUrlRefused("the webhook URL's port is not a number from 1 to 65535", errors=[{"field": "url", "message": "bad port"}]) from exc
    host = parts.hostname
    try:
        addresses: tuple[Address, ...] = (ipaddress.ip_address(host),)
    except ValueError:
        try:
            answers = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise WebhookUrlRefused(
                f"the webhook host {host!r} does not resolve", errors=[{"field": "url", "message": "does not resolve"}]
            ) from exc
        addresses = tuple(dict.fromkeys(ipaddress.ip_address(str(answer[4][0]).split("%")[0]) for answer in answers))
    refused = [address for address in addresses if not _address_allowed(address, allow)]
    if refused or not addresses:
        raise WebhookUrlRefused(
            f"the webhook host {host!r} is at {refused[0] if refused else 'no address'}: loopback, private, link-local "
            "and metadata addresses are not sent to (ask the operator to allowlist a network)",
            errors=[{"field": "url", "message": "address not allowed"}],
        )
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Destination(url=url, scheme=parts.scheme, host=host, port=port, target=target, addresses=addresses)
