"""Outbound connections that cannot be pointed at the service's own network (SSRF guard).

A tool that fetches URLs for a model fetches them for whoever wrote the prompt, so the URL is
hostile input: it may name `127.0.0.1`, the cloud metadata service, an address on the private
network, or a hostname whose DNS answer is one of those. The guard therefore works on
addresses, not names:

1. the hostname is resolved once (`socket.getaddrinfo`);
2. if ANY resolved address is not a public unicast address, the connection is refused (an
   attacker's DNS that answers both a public and a private address gets nothing);
3. the socket connects to the address that was vetted, never to the name again, so a DNS
   answer that changes between the check and the connection (rebinding) cannot swap it.
   TLS still verifies the certificate against the hostname (httpcore passes the URL's host as
   SNI), and the request still carries the original Host header.

`GuardedBackend` plugs the three steps into httpcore's connection pool, so they run for
every connection the pool opens, including each redirect hop. Which addresses are public is
the service's one address policy (`chatsite.netpolicy.address_refusal`); the only way past it
here is an exact address-and-port pair (`parse_allowlist`).
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Collection, Iterable
from typing import Any

import httpcore

from chatsite.netpolicy import IPAddress, address_refusal
from plugins.sdk import ToolError


class AddressRefused(ToolError):
    """The URL leads to an address the service must not reach on a user's behalf."""


def parse_allowlist(entries: Iterable[str]) -> frozenset[tuple[IPAddress, int]]:
    """`["127.0.0.1:8080", "[::1]:9000"]` as (address, port) pairs; bad entries raise ValueError."""
    pairs = set()
    for entry in entries:
        host, sep, port = entry.strip().rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"Allowlist entry {entry!r} is not address:port.")
        pairs.add((ipaddress.ip_address(host.strip("[]")), int(port)))
    return frozenset(pairs)


def resolve_vetted(
    host: str, port: int, *, allowed: Collection[tuple[IPAddress, int]] = ()
) -> list[str]:
    """Every address `host` resolves to, if every one of them may be reached; else refuse.

    `allowed` lists exact (address, port) pairs that pass despite the rules (a test's local
    server); it does not open the address on any other port.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ToolError(f"The host name '{host}' could not be resolved.") from exc
    addresses: list[str] = []
    for _family, _type, _proto, _canon, sockaddr in infos:
        text = str(sockaddr[0]).split("%", 1)[0]  # an IPv6 zone id ("fe80::1%eth0")
        try:
            address = ipaddress.ip_address(text)
        except ValueError as exc:
            raise AddressRefused(f"'{host}' resolves to an unusable address.") from exc
        if (address, port) not in allowed:
            reason = address_refusal(address)
            if reason is not None:
                where = "is" if text == host.strip("[]") else "resolves to"
                raise AddressRefused(
                    f"Refused: '{host}' {where} {reason}; only public addresses are fetched."
                )
        if str(address) not in addresses:
            addresses.append(str(address))
    if not addresses:
        raise ToolError(f"The host name '{host}' could not be resolved.")
    return addresses


class _DeadlineStream(httpcore.NetworkStream):
    """A socket whose every read and write also respects one overall deadline.

    httpcore's timeouts apply to each operation; a server that sends a byte every few
    seconds would never trip them, so each operation gets at most the time left.
    """

    def __init__(self, inner: httpcore.NetworkStream, deadline: float) -> None:
        self._inner = inner
        self._deadline = deadline

    def _left(self, timeout: float | None, error: type[Exception]) -> float:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise error("The overall time limit was reached.")
        return left if timeout is None else min(timeout, left)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, self._left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, self._left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: Any,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        inner = self._inner.start_tls(
            ssl_context, server_hostname, self._left(timeout, httpcore.ConnectTimeout)
        )
        return _DeadlineStream(inner, self._deadline)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class GuardedBackend(httpcore.NetworkBackend):
    """httpcore's network layer, connecting only to vetted addresses and before `deadline`."""

    def __init__(
        self,
        *,
        deadline: float,
        allowed: Collection[tuple[IPAddress, int]] = (),
        inner: httpcore.NetworkBackend | None = None,
    ) -> None:
        self._deadline = deadline
        self._allowed = allowed
        self._inner = inner or httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        addresses = resolve_vetted(host, port, allowed=self._allowed)
        failure: Exception | None = None
        for address in addresses:
            left = self._deadline - time.monotonic()
            if left <= 0:
                raise httpcore.ConnectTimeout("The overall time limit was reached.")
            try:
                stream = self._inner.connect_tcp(
                    address,
                    port,
                    timeout=left if timeout is None else min(timeout, left),
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
                continue
            return _DeadlineStream(stream, self._deadline)
        raise failure or httpcore.ConnectError(f"Could not connect to '{host}'.")

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.NetworkStream:
        raise AddressRefused("Unix sockets are never fetched.")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)
