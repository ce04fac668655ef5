"""url_fetch: the SSRF guard refuses every non-public address, at every hop; limits hold.

Refusals are tested without any network (the guard refuses before a socket is opened; a test
fails if one is). The happy paths run against a real HTTP server on 127.0.0.1 that the test
names in `PLUGINS_URL_FETCH_ALLOWED_ADDRESSES` (address AND port), so that server is the only
local thing the tool can reach.
"""

from __future__ import annotations

import http.server
import ipaddress
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpcore
import pytest

from chatsite import netpolicy
from plugins.builtin import netguard
from plugins.builtin.url_fetch import fetch, plugin
from plugins.sdk import ToolContext, ToolError

PAGE = b"""<!doctype html><html><head><title>Bread &amp; Butter</title>
<style>body { color: red }</style><script>steal(document.cookie)</script></head>
<body><nav>Home | About</nav><h1>Sourdough</h1><p>Feed the starter   daily.</p>
<ul><li>flour</li><li>water</li></ul><noscript>enable js</noscript></body></html>"""

_stop = threading.Event()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen_hosts: list[str] = []

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, content_type: str, **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        url = urlparse(self.path)
        query = parse_qs(url.query)
        self.seen_hosts.append(self.headers.get("Host", ""))
        if url.path == "/page":
            self._send(200, PAGE, "text/html; charset=utf-8")
        elif url.path == "/text":
            self._send(200, "plain caf\u00e9".encode("latin-1"), "text/plain; charset=iso-8859-1")
        elif url.path == "/json":
            self._send(200, b'{ "a" : [1, 2],\n "b": "c" }', "application/json")
        elif url.path == "/image":
            self._send(200, b"\x89PNG\r\n\x1a\n" + b"\0" * 100, "image/png")
        elif url.path == "/missing":
            self._send(404, b"gone", "text/plain")
        elif url.path == "/redirect":
            self._send(302, b"", "text/plain", Location=query["to"][0])
        elif url.path == "/loop":
            self._send(302, b"", "text/plain", Location="/loop")
        elif url.path == "/endless":
            # Never ends: a fetch that did not stop at its byte limit would hang here.
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = b"x" * 4096
            try:
                while not _stop.is_set():
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except OSError:
                return
        elif url.path == "/slow":
            # Silent for 5 s after the request came: a fetch whose 1 s deadline was set before
            # it sent the request gives up 4 s before the answer, however slow the machine; one
            # with a longer deadline (the call's 9.5 s) or none gets the answer instead.
            _stop.wait(5)
            self._send(200, b"late", "text/plain")
        elif url.path == "/dribble":
            # Headers at once, then a byte every 0.2 s: no single read ever times out, and the
            # body is whole only after 200 s, long past any limit of the tests.
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", "1000")
            self.end_headers()
            try:
                for _ in range(1000):
                    if _stop.wait(0.2):
                        return
                    self.wfile.write(b"x")
                    self.wfile.flush()
            except OSError:
                return
        else:
            self._send(404, b"no route", "text/plain")


@pytest.fixture
def server(settings: Any) -> Iterator[str]:
    """A local HTTP server, allowlisted by exact address and port; yields its base URL."""
    _stop.clear()
    _Handler.seen_hosts = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    port = httpd.server_address[1]
    settings.PLUGINS_URL_FETCH_ALLOWED_ADDRESSES = [f"127.0.0.1:{port}"]
    yield f"http://127.0.0.1:{port}"
    _stop.set()
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def no_sockets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything tries to open a connection."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        pytest.fail("a connection was attempted")

    monkeypatch.setattr(httpcore.SyncBackend, "connect_tcp", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def fake_dns(monkeypatch: pytest.MonkeyPatch, answers: dict[str, list[list[str]]]) -> list[str]:
    """Make `getaddrinfo` answer `answers[host]`, one list of addresses per successive call
    (the last one repeats); real resolution for other names. Returns the names looked up."""
    real = socket.getaddrinfo
    asked: list[str] = []

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host not in answers:
            return real(host, port, *args, **kwargs)
        asked.append(host)
        calls = asked.count(host)
        addresses = answers[host][min(calls, len(answers[host])) - 1]
        return [
            (
                socket.AF_INET6 if ":" in a else socket.AF_INET,
                socket.SOCK_STREAM,
                6,
                "",
                (a, port, 0, 0) if ":" in a else (a, port),
            )
            for a in addresses
        ]

    monkeypatch.setattr(netguard.socket, "getaddrinfo", getaddrinfo)
    return asked


def ctx(**config: Any) -> ToolContext:
    # The fetches' time limit (9.5 s) is only a failure point here: a local page of a few
    # kilobytes comes in milliseconds.
    return ToolContext(user_id=1, conversation_id=None, config=config, timeout_seconds=10)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/",
        "http://127.1.2.3:8080/admin",
        "http://10.0.0.1/",
        "http://192.168.1.1/",
        "http://172.16.0.1/",
        "http://169.254.169.254/latest/meta-data/",
        "http://100.64.0.1/",
        "http://0.0.0.0:8000/",
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://[::ffff:169.254.169.254]/",
        "http://[fd00:ec2::254]/latest/meta-data/",
        "http://[fe80::1]/",
        "http://[fc00::1]/",
        "http://[2002:7f00:1::]/",
        "http://224.0.0.1/",
        "http://2130706433/",
        "http://0x7f.1/",
        "https://localhost/",
    ],
)
def test_refuses_non_public_addresses_without_connecting(url: str, no_sockets: None) -> None:
    with pytest.raises(netguard.AddressRefused, match="Refused"):
        fetch(ctx(), {"url": url})


def test_refuses_a_hostname_that_resolves_to_loopback(monkeypatch, no_sockets) -> None:
    asked = fake_dns(monkeypatch, {"innocent.example": [["127.0.0.1"]]})
    with pytest.raises(netguard.AddressRefused, match="resolves to a loopback address"):
        fetch(ctx(), {"url": "http://innocent.example/"})
    assert asked == ["innocent.example"]


def test_refuses_a_hostname_with_any_private_answer(monkeypatch, no_sockets) -> None:
    fake_dns(monkeypatch, {"mixed.example": [["93.184.215.14", "10.0.0.7"]]})
    with pytest.raises(netguard.AddressRefused, match="private address"):
        fetch(ctx(), {"url": "https://mixed.example/"})


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "ftp://example.com/file",
        "gopher://example.com/",
        "javascript:alert(1)",
        "//example.com/",
        "not a url",
        "http://user:secret@example.com/",
    ],
)
def test_refuses_other_schemes_and_credentials(url: str, no_sockets: None) -> None:
    with pytest.raises(ToolError):
        fetch(ctx(), {"url": url})


def test_the_allowlist_is_exact_address_and_port(settings, no_sockets) -> None:
    settings.PLUGINS_URL_FETCH_ALLOWED_ADDRESSES = ["127.0.0.1:9"]
    with pytest.raises(netguard.AddressRefused):
        fetch(ctx(), {"url": "http://127.0.0.1:10/"})
    with pytest.raises(netguard.AddressRefused):
        fetch(ctx(), {"url": "http://127.0.0.2:9/"})


def test_address_rules_are_the_services_one_policy() -> None:
    refused = ["127.0.0.1", "10.1.2.3", "169.254.169.254", "fd00:ec2::254", "::", "ff02::1"]
    allowed = ["93.184.215.14", "1.1.1.1", "2606:4700:4700::1111"]
    assert netguard.address_refusal is netpolicy.address_refusal
    for text in refused:
        assert netpolicy.address_refusal(ipaddress.ip_address(text)) is not None, text
    for text in allowed:
        assert netpolicy.address_refusal(ipaddress.ip_address(text)) is None, text


def test_fetches_html_as_readable_text(server: str) -> None:
    result = fetch(ctx(), {"url": f"{server}/page"})
    assert result["status"] == 200
    assert result["content_type"] == "text/html"
    assert result["title"] == "Bread & Butter"
    assert result["text"] == "Sourdough\nFeed the starter daily.\n- flour\n- water"
    assert result["truncated"] is False


def test_plain_text_uses_its_charset_and_json_is_compacted(server: str) -> None:
    assert fetch(ctx(), {"url": f"{server}/text"})["text"] == "plain caf\u00e9"
    result = fetch(ctx(), {"url": f"{server}/json"})
    assert json.loads(result["text"]) == {"a": [1, 2], "b": "c"}
    assert result["text"] == '{"a":[1,2],"b":"c"}'


def test_binary_content_and_http_errors_are_tool_errors(server: str) -> None:
    with pytest.raises(ToolError, match="image/png"):
        fetch(ctx(), {"url": f"{server}/image"})
    with pytest.raises(ToolError, match="HTTP 404"):
        fetch(ctx(), {"url": f"{server}/missing"})


@pytest.mark.parametrize(
    "target",
    [
        "http://127.0.0.1/",
        "http://127.0.0.1:1/secret",
        "http://10.0.0.1/",
        "http://169.254.169.254/latest/meta-data/iam/",
        "http://[::1]/",
        "http://loopback.example/",
    ],
)
def test_a_redirect_to_a_refused_address_is_refused(monkeypatch, server: str, target) -> None:
    fake_dns(monkeypatch, {"loopback.example": [["127.0.0.1"]]})
    with pytest.raises(netguard.AddressRefused):
        fetch(ctx(), {"url": f"{server}/redirect?to={target}"})


def test_a_redirect_to_another_scheme_is_refused(server: str) -> None:
    with pytest.raises(ToolError, match="http and https"):
        fetch(ctx(), {"url": f"{server}/redirect?to=file:///etc/passwd"})


def test_redirects_are_followed_and_capped(server: str) -> None:
    result = fetch(ctx(), {"url": f"{server}/redirect?to=/page"})
    assert result["url"] == f"{server}/page"
    assert result["title"] == "Bread & Butter"
    with pytest.raises(ToolError, match="More than 5 redirects"):
        fetch(ctx(), {"url": f"{server}/loop"})


def test_connects_to_the_vetted_address_with_the_original_host(monkeypatch, server) -> None:
    """DNS rebinding: the name is resolved once; a second answer would be 10.0.0.1."""
    port = server.rsplit(":", 1)[1]
    asked = fake_dns(monkeypatch, {"rebind.example": [["127.0.0.1"], ["10.0.0.1"]]})
    result = fetch(ctx(), {"url": f"http://rebind.example:{port}/page"})
    assert result["title"] == "Bread & Butter"
    assert asked == ["rebind.example"]
    assert _Handler.seen_hosts == [f"rebind.example:{port}"]


def test_an_oversized_body_is_cut_at_max_bytes(server: str) -> None:
    # The body never ends: a fetch that did not stop at its byte limit would read on until
    # its time limit and fail, so no clock is needed here.
    result = fetch(ctx(max_bytes=5000, max_chars=50_000), {"url": f"{server}/endless"})
    assert result["truncated"] is True
    assert result["text"] == "x" * 5000


def test_text_is_cut_at_max_chars(server: str) -> None:
    result = fetch(ctx(max_bytes=100_000, max_chars=300), {"url": f"{server}/endless"})
    assert result["truncated"] is True
    assert len(result["text"]) == 300


@pytest.mark.parametrize("path", ["/slow", "/dribble"])
def test_a_slow_server_times_out(server: str, path: str) -> None:
    # The server answers (or ends its body) only long after the 1 s limit: the error, rather
    # than its answer, shows that the fetch gave up at its own deadline, at any speed.
    with pytest.raises(ToolError, match="longer than 1 seconds"):
        fetch(ctx(timeout_seconds=1), {"url": f"{server}{path}"})


def test_the_time_limit_of_the_call_bounds_the_fetch(server: str) -> None:
    # The call's 1.5 s less the margin, not the setting's 10 s (which would get the answer).
    short = ToolContext(user_id=1, conversation_id=None, config={}, timeout_seconds=1.5)
    with pytest.raises(ToolError, match="longer than 1 seconds"):
        fetch(short, {"url": f"{server}/slow"})


def test_the_plugin_declares_its_tool_and_settings() -> None:
    (tool,) = plugin.tools
    assert tool.name == "url_fetch"
    assert tool.parameters["required"] == ["url"]
    assert set(plugin.config_schema["properties"]) == {
        "max_bytes",
        "max_chars",
        "timeout_seconds",
        "user_agent",
    }
