"""The address policy (chatsite/netpolicy.py): which addresses outbound connections may reach,
what a setting may allow besides, and host names judged by every address they resolve to."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from chatsite.netpolicy import AddressPolicy, AddressRefused, address_refusal, parse_networks

REFUSED = [
    ("127.0.0.1", "a loopback address"),
    ("127.8.9.10", "a loopback address"),
    ("::1", "a loopback address"),
    ("10.1.2.3", "a private address"),
    ("172.16.0.1", "a private address"),
    ("172.31.255.254", "a private address"),
    ("192.168.1.1", "a private address"),
    ("fc00::1", "a private address"),
    ("fd12:3456::1", "a private address"),
    ("169.254.169.254", "a cloud metadata address"),
    ("fd00:ec2::254", "a cloud metadata address"),
    ("169.254.1.1", "a link-local address"),
    ("fe80::1", "a link-local address"),
    ("0.0.0.0", "an unspecified address"),  # noqa: S104 (refused, not bound)
    ("::", "an unspecified address"),
    ("224.0.0.1", "a multicast address"),
    ("ff02::1", "a multicast address"),
    ("100.64.0.1", "a carrier-grade NAT address"),
    ("::ffff:127.0.0.1", "a loopback address"),
    ("::ffff:169.254.169.254", "a cloud metadata address"),
    ("2002:7f00:1::", "a loopback address"),
    ("64:ff9b::a00:1", "a NAT64 address"),
    ("240.0.0.1", "a private address"),
    ("192.0.2.1", "a private address"),
]
PUBLIC = ["93.184.215.14", "1.1.1.1", "8.8.8.8", "2606:4700:4700::1111", "2a00:1450::1"]


@pytest.mark.parametrize(("address", "reason"), REFUSED)
def test_non_public_addresses_are_refused_with_their_reason(address: str, reason: str) -> None:
    assert address_refusal(ipaddress.ip_address(address)) == reason


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_may_be_reached(address: str) -> None:
    assert address_refusal(ipaddress.ip_address(address)) is None
    assert AddressPolicy().refusal(ipaddress.ip_address(address)) is None


def test_allowed_networks_open_exactly_their_addresses() -> None:
    policy = AddressPolicy(parse_networks(["10.0.0.0/8", "127.0.0.1", "::1"]))

    assert policy.refusal(ipaddress.ip_address("10.200.0.5")) is None
    assert policy.refusal(ipaddress.ip_address("127.0.0.1")) is None
    assert policy.refusal(ipaddress.ip_address("::ffff:127.0.0.1")) is None
    assert policy.refusal(ipaddress.ip_address("::1")) is None
    assert policy.refusal(ipaddress.ip_address("127.0.0.2")) == "a loopback address"
    assert policy.refusal(ipaddress.ip_address("192.168.0.1")) == "a private address"
    assert policy.refusal(ipaddress.ip_address("169.254.169.254")) == "a cloud metadata address"


def test_a_bad_network_in_a_setting_is_a_configuration_error(settings: Any) -> None:
    settings.INFERENCE_WORKER_ALLOWED_NETWORKS = ["10.0.0.0/8", "ten dot zero"]

    with pytest.raises(ImproperlyConfigured, match="INFERENCE_WORKER_ALLOWED_NETWORKS"):
        AddressPolicy.from_setting("INFERENCE_WORKER_ALLOWED_NETWORKS")


def test_the_policy_follows_its_setting(settings: Any) -> None:
    settings.PLUGINS_MCP_ALLOWED_NETWORKS = []
    closed = AddressPolicy.from_setting("PLUGINS_MCP_ALLOWED_NETWORKS")
    settings.PLUGINS_MCP_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    opened = AddressPolicy.from_setting("PLUGINS_MCP_ALLOWED_NETWORKS")

    assert closed.url_refusal("http://127.0.0.1:6379") is not None
    assert opened.url_refusal("http://127.0.0.1:6379") is None


def fake_dns(monkeypatch: pytest.MonkeyPatch, answers: dict[str, list[str]]) -> None:
    """`getaddrinfo` answers `answers[host]` for the names given; real resolution otherwise."""
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host not in answers:
            return real(host, port, *args, **kwargs)
        return [
            (
                socket.AF_INET6 if ":" in a else socket.AF_INET,
                socket.SOCK_STREAM,
                6,
                "",
                (a, port, 0, 0) if ":" in a else (a, port),
            )
            for a in answers[host]
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://169.254.169.254/", "'169.254.169.254' is a cloud metadata address"),
        ("http://127.0.0.1:6379", "'127.0.0.1' is a loopback address"),
        ("http://[::1]:8000/v1", "'::1' is a loopback address"),
        ("http://10.0.0.5:8000", "'10.0.0.5' is a private address"),
        ("http://0.0.0.0:8000", "'0.0.0.0' is an unspecified address"),
        ("http://2130706433/", "resolves to 127.0.0.1, a loopback address"),
        ("http://localhost:8101", "'localhost' resolves to"),
        ("http://innocent.example/", "'innocent.example' resolves to 127.0.0.1"),
        ("http://mixed.example/", "resolves to 10.0.0.7, a private address"),
        ("http:///nohost", "no host"),
        ("http://example.com:99999/", "not valid"),
    ],
)
def test_a_url_staff_save_is_judged_by_its_addresses(
    monkeypatch: pytest.MonkeyPatch, url: str, says: str
) -> None:
    fake_dns(
        monkeypatch,
        {"innocent.example": ["127.0.0.1"], "mixed.example": ["93.184.215.14", "10.0.0.7"]},
    )
    policy = AddressPolicy(setting="SOME_ALLOWED_NETWORKS")

    refusal = policy.url_refusal(url)

    assert refusal is not None
    assert says in refusal
    if "no host" not in says and "not valid" not in says:
        assert refusal.endswith("which SOME_ALLOWED_NETWORKS does not allow.")


def test_a_public_url_and_a_name_that_does_not_resolve_yet_are_accepted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_dns(monkeypatch, {"tools.example": ["93.184.215.14"]})

    def unknown(*args: Any, **kwargs: Any) -> Any:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    assert AddressPolicy().url_refusal("https://tools.example/mcp") is None
    monkeypatch.setattr(socket, "getaddrinfo", unknown)
    assert AddressPolicy().url_refusal("https://not-yet.example/mcp") is None


def test_resolving_refuses_a_name_if_any_answer_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_dns(monkeypatch, {"mixed.example": ["93.184.215.14", "10.0.0.7"]})

    with pytest.raises(AddressRefused) as refused:
        AddressPolicy().resolve("mixed.example", 443)

    assert refused.value.strerror == (
        "Refused: 'mixed.example' resolves to 10.0.0.7, a private address."
    )
    assert isinstance(refused.value, OSError)


async def test_resolving_without_blocking_judges_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_dns(monkeypatch, {"rebound.example": ["127.0.0.1"], "ok.example": ["1.1.1.1"]})

    with pytest.raises(AddressRefused, match="loopback"):
        await AddressPolicy().aresolve("rebound.example", 80)
    assert await AddressPolicy().aresolve("ok.example", 80) == ["1.1.1.1"]
