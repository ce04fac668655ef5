"""The one address policy for connections to a place someone else named (an SSRF guard).

Three kinds of outbound connection go where a URL says: `url_fetch` (a URL a model wrote, for
whoever wrote the prompt), MCP servers and inference workers (URLs staff wrote, or a setting).
Each must not become a way into the service's own network: the cloud metadata service, Redis
on 127.0.0.1, the database on 10.0.0.5. So every such connection is judged by address, never
by name:

- `address_refusal` is the rule: only public unicast addresses may be reached. It names why
  an address is refused ("a loopback address"), so that the refusal can say so.
- `AddressPolicy` adds what one kind of connection may reach besides: networks a setting names
  (`INFERENCE_WORKER_ALLOWED_NETWORKS`: workers usually sit on a private network;
  `PLUGINS_MCP_ALLOWED_NETWORKS`; both empty by default, loopback in `make run` and the suite).
  It checks twice: a URL when staff save it (`url_refusal`, a field error in admin), and every
  connection, where the host name is resolved and each address is checked (`resolve`,
  `check`), so that a name resolving to 127.0.0.1, or a DNS answer changed after the save
  (rebinding), is refused too. The callers connect to the address that was checked, never to
  the name again (inference/client.py checks the socket's own address; plugins/mcp_client.py
  connects to the vetted address).

`url_fetch` (plugins/builtin/netguard.py) uses `address_refusal` with its own exact
address-and-port allowlist.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Named first so that the refusal says which rule matched; the property checks below catch
# the rest of the special-purpose space (benchmarking, documentation, 240/4, ...).
_NAMED_NETWORKS: list[tuple[IPNetwork, str]] = [
    (ipaddress.ip_network("169.254.169.254/32"), "a cloud metadata address"),
    (ipaddress.ip_network("fd00:ec2::254/128"), "a cloud metadata address"),
    (ipaddress.ip_network("100.64.0.0/10"), "a carrier-grade NAT address"),
    (ipaddress.ip_network("64:ff9b::/96"), "a NAT64 address"),
    (ipaddress.ip_network("64:ff9b:1::/48"), "a NAT64 address"),
]

_DEFAULT_PORTS = {"http": 80, "https": 443}


def address_refusal(address: IPAddress) -> str | None:
    """Why `address` may not be reached (e.g. "a loopback address"), or None if it may: the
    rule with nothing allowed besides, public unicast addresses only."""
    for network, reason in _NAMED_NETWORKS:
        if address.version == network.version and address in network:
            return reason
    if isinstance(address, ipaddress.IPv6Address):
        # An IPv6 address that carries an IPv4 one reaches that IPv4 address.
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is not None:
            return address_refusal(embedded)
        if address.teredo is not None:
            return "a Teredo address"
        if address.is_site_local:
            return "a site-local address"
    checks = [
        (address.is_unspecified, "an unspecified address"),
        (address.is_loopback, "a loopback address"),
        (address.is_link_local, "a link-local address"),
        (address.is_multicast, "a multicast address"),
        (address.is_private, "a private address"),
        (address.is_reserved, "a reserved address"),
        (not address.is_global, "a non-public address"),
    ]
    for refused, reason in checks:
        if refused:
            return reason
    return None


def parse_networks(entries: Iterable[str]) -> tuple[IPNetwork, ...]:
    """`["10.0.0.0/8", "::1"]` as networks (a bare address is its own /32 or /128); a bad
    entry raises ValueError naming it."""
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError as exc:
            raise ValueError(f"{entry!r} is not an address or a network (CIDR).") from exc
    return tuple(networks)


class AddressRefused(ConnectionError):
    """A connection the address policy does not allow.

    An OSError, as a refused connection is: HTTP clients report it as the connection failure
    it is (aiohttp as `ClientConnectorError`), and its `strerror` is the reason.
    """

    def __init__(self, message: str) -> None:
        super().__init__(errno.EACCES, message)


@functools.cache
def _networks_of(setting: str, entries: tuple[str, ...]) -> tuple[IPNetwork, ...]:
    try:
        return parse_networks(entries)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{setting}: {exc}") from exc


@dataclass(frozen=True)
class AddressPolicy:
    """What one kind of connection may reach: public addresses, and those in `allowed`.

    `setting` names the setting that widens it, for the refusals to point at.
    """

    allowed: tuple[IPNetwork, ...] = ()
    setting: str = ""

    @classmethod
    def from_setting(cls, setting: str) -> AddressPolicy:
        """The policy whose allowed networks are `settings.<setting>` (a list of CIDRs)."""
        return cls(_networks_of(setting, tuple(getattr(settings, setting))), setting)

    def refusal(self, address: IPAddress) -> str | None:
        """Why `address` may not be reached, or None if it may."""
        # An IPv4-mapped address is that IPv4 address: allowing 127.0.0.0/8 allows it too.
        plain = (
            address.ipv4_mapped or address
            if isinstance(address, ipaddress.IPv6Address)
            else address
        )
        if any(plain.version == net.version and plain in net for net in self.allowed):
            return None
        return address_refusal(plain)

    def _refused(self, host: str, address: str, reason: str) -> AddressRefused:
        shown = host.strip("[]")
        where = f"'{shown}' is" if shown == address else f"'{shown}' resolves to {address},"
        widen = f", which {self.setting} does not allow" if self.setting else ""
        return AddressRefused(f"Refused: {where} {reason}{widen}.")

    def check(self, host: str, address: str) -> None:
        """Refuse (AddressRefused) a connection to `address`, which `host` resolved to."""
        text = address.split("%", 1)[0]  # an IPv6 zone id ("fe80::1%eth0")
        try:
            parsed = ipaddress.ip_address(text)
        except ValueError as exc:
            raise AddressRefused(f"Refused: '{host}' resolves to an unusable address.") from exc
        reason = self.refusal(parsed)
        if reason is not None:
            raise self._refused(host, text, reason)

    def _vetted(self, host: str, infos: Iterable[tuple[Any, ...]]) -> list[str]:
        addresses: list[str] = []
        for _family, _type, _proto, _canon, sockaddr in infos:
            address = str(sockaddr[0]).split("%", 1)[0]
            self.check(host, address)
            if address not in addresses:
                addresses.append(address)
        if not addresses:
            raise socket.gaierror(f"'{host}' resolves to no address.")
        return addresses

    def resolve(self, host: str, port: int) -> list[str]:
        """Every address `host` resolves to, if each of them may be reached; one that may
        not refuses them all (AddressRefused), as a DNS answer mixing a public and a private
        address is an attack. A name that does not resolve raises socket.gaierror."""
        return self._vetted(host, socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))

    async def aresolve(self, host: str, port: int) -> list[str]:
        """`resolve` without blocking the event loop."""
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        return self._vetted(host, infos)

    def url_refusal(self, url: str) -> str | None:
        """Why a connection to `url` would be refused, as a sentence; None if it would not
        be, as far as can be told now. For the check when staff save a URL: an address is
        judged, a host name resolved and its addresses judged; a name that does not resolve
        (yet) is not refused here, since each connection checks again."""
        try:
            parts = urlsplit(url)
            port = parts.port or _DEFAULT_PORTS.get(parts.scheme, 80)
        except ValueError:
            return "The URL is not valid."
        host = parts.hostname
        if not host:
            return "The URL has no host."
        try:
            self.resolve(host, port)
        except AddressRefused as exc:
            return exc.strerror
        except (OSError, UnicodeError):
            return None
        return None
