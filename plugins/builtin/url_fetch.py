"""Fetch a web page for the model, without letting the model reach the service's own network.

Every connection goes through `netguard.GuardedBackend` (resolve, refuse any non-public
address, connect to the vetted address). Redirects are followed here, one hop at a time (at
most `MAX_REDIRECTS`), so each hop's URL is checked again: scheme, credentials, and through
the backend its addresses. One deadline covers the whole call, every hop included; the body
is streamed and cut at `max_bytes`; what comes back is readable text (HTML without scripts,
styles and navigation; plain text; JSON), cut to `max_chars`.

There is no way past the guard except `settings.PLUGINS_URL_FETCH_ALLOWED_ADDRESSES`, exact
"address:port" pairs (empty by default; the tests name their own local server there).
"""

from __future__ import annotations

import codecs
import contextlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin

import httpcore
import httpx
from django.conf import settings

from plugins.sdk import Plugin, Tool, ToolContext, ToolError

from .htmltext import html_to_text
from .netguard import GuardedBackend, parse_allowlist

MAX_REDIRECTS = 5
MAX_URL_CHARS = 2048
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
# Seconds kept back from the framework's time limit, so that our own clear error wins.
TIME_LIMIT_MARGIN = 0.5

CONFIG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "max_bytes": {
            "type": "integer",
            "title": "Largest body read (bytes)",
            "minimum": 1024,
            "maximum": 10_000_000,
            "default": 1_000_000,
        },
        "max_chars": {
            "type": "integer",
            "title": "Longest text given to the model (characters)",
            "minimum": 200,
            "maximum": 50_000,
            "default": 6000,
        },
        "timeout_seconds": {
            "type": "number",
            "title": "Time limit of one fetch, redirects included (seconds)",
            "minimum": 1,
            "maximum": 60,
            "default": 10,
        },
        "user_agent": {
            "type": "string",
            "title": "User-Agent header",
            "maxLength": 200,
            "default": "ChatsiteFetch/1.0",
        },
    },
}


@dataclass(frozen=True)
class FetchConfig:
    """The plugin's settings for one call, defaults filled in from `CONFIG_SCHEMA`."""

    max_bytes: int
    max_chars: int
    timeout_seconds: float
    user_agent: str

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> FetchConfig:
        props = CONFIG_SCHEMA["properties"]

        def value(key: str) -> Any:
            given = config.get(key)
            return props[key]["default"] if given in (None, "") else given

        return cls(
            max_bytes=int(value("max_bytes")),
            max_chars=int(value("max_chars")),
            timeout_seconds=float(value("timeout_seconds")),
            user_agent=str(value("user_agent")),
        )


@dataclass
class _Body:
    status: int
    url: str
    content_type: str
    charset: str | None
    data: bytes
    truncated: bool


def _checked_url(raw: Any) -> httpx.URL:
    if not isinstance(raw, str) or not raw.strip():
        raise ToolError("'url' must be an http or https URL.")
    if len(raw) > MAX_URL_CHARS:
        raise ToolError(f"The URL is longer than {MAX_URL_CHARS} characters.")
    try:
        url = httpx.URL(raw.strip())
    except (httpx.InvalidURL, ValueError) as exc:
        raise ToolError("The URL is not valid.") from exc
    if url.scheme not in ("http", "https"):
        raise ToolError("Only http and https URLs are fetched.")
    if not url.host:
        raise ToolError("The URL has no host.")
    if url.userinfo:
        raise ToolError("URLs with a user name or password are not fetched.")
    return url.copy_with(fragment=None)


def _headers(url: httpx.URL, config: FetchConfig) -> list[tuple[bytes, bytes]]:
    return [
        (b"Host", url.netloc),
        (b"User-Agent", config.user_agent.encode("latin-1", "replace")),
        (b"Accept", b"text/html,application/xhtml+xml,text/plain,application/json;q=0.9,*/*;q=0.1"),
        # Compressed bodies would need decoding and would defeat the byte limit (a zip bomb).
        (b"Accept-Encoding", b"identity"),
        (b"Connection", b"close"),
    ]


def _content_type(headers: list[tuple[bytes, bytes]]) -> tuple[str, str | None]:
    for name, value in headers:
        if name.lower() == b"content-type":
            mime, _, params = value.decode("latin-1").partition(";")
            charset = None
            for param in params.split(";"):
                key, _, val = param.strip().partition("=")
                if key.lower() == "charset" and val:
                    charset = val.strip("\"' ")
            return mime.strip().lower(), charset
    return "", None


def _location(headers: list[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name.lower() == b"location":
            return value.decode("latin-1")
    return None


def _is_text(mime: str) -> bool:
    return (
        not mime
        or mime.startswith("text/")
        or mime in HTML_TYPES
        or mime == "application/json"
        or mime.endswith("+json")
        or mime in {"application/xml", "application/javascript"}
    )


def _get(url: httpx.URL, config: FetchConfig, deadline: float) -> _Body:
    """GET `url`, following redirects by hand so that every hop passes the guard."""
    allowed = parse_allowlist(settings.PLUGINS_URL_FETCH_ALLOWED_ADDRESSES)
    backend = GuardedBackend(deadline=deadline, allowed=allowed)
    with httpcore.ConnectionPool(network_backend=backend, max_connections=1, retries=0) as pool:
        for _hop in range(MAX_REDIRECTS + 1):
            left = deadline - time.monotonic()
            if left <= 0:
                raise httpcore.ReadTimeout("The overall time limit was reached.")
            timeouts = {"connect": left, "read": left, "write": left, "pool": left}
            with pool.stream(
                "GET",
                str(url),
                headers=_headers(url, config),
                extensions={"timeout": timeouts},
            ) as response:
                location = _location(response.headers)
                if response.status in REDIRECT_STATUSES and location:
                    url = _checked_url(urljoin(str(url), location.strip()))
                    continue
                if response.status >= 400:
                    raise ToolError(f"The server answered HTTP {response.status}.")
                mime, charset = _content_type(response.headers)
                if not _is_text(mime):
                    raise ToolError(f"The URL serves {mime}, which is not text.")
                data = bytearray()
                truncated = False
                for chunk in response.iter_stream():
                    data.extend(chunk)
                    if len(data) >= config.max_bytes:
                        del data[config.max_bytes :]
                        truncated = True
                        break
                return _Body(response.status, str(url), mime, charset, bytes(data), truncated)
    raise ToolError(f"More than {MAX_REDIRECTS} redirects.")


def _decode(data: bytes, charset: str | None) -> str:
    if charset:
        try:
            codecs.lookup(charset)
        except LookupError:
            charset = None
    return data.decode(charset or "utf-8", errors="replace")


def fetch(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Handler of `url_fetch`: the readable text of a public web page, cut to a short size."""
    config = FetchConfig.from_mapping(ctx.config)
    url = _checked_url(args.get("url"))
    limit = min(config.timeout_seconds, max(ctx.timeout_seconds - TIME_LIMIT_MARGIN, 0.5))
    deadline = time.monotonic() + limit
    try:
        body = _get(url, config, deadline)
    except httpcore.TimeoutException as exc:
        raise ToolError(f"The fetch took longer than {limit:g} seconds.") from exc
    except httpcore.ConnectError as exc:
        raise ToolError(f"Could not connect to {url.host}.") from exc
    except (httpcore.ProtocolError, httpcore.NetworkError) as exc:
        raise ToolError(f"{url.host} did not answer with valid HTTP.") from exc
    except httpcore.UnsupportedProtocol as exc:
        raise ToolError("Only http and https URLs are fetched.") from exc
    text = _decode(body.data, body.charset)
    title = ""
    if body.content_type in HTML_TYPES or (not body.content_type and "<html" in text[:1000]):
        title, text = html_to_text(text)
    elif body.content_type == "application/json" or body.content_type.endswith("+json"):
        # A cut or broken document is still worth reading as text.
        with contextlib.suppress(ValueError):
            text = json.dumps(json.loads(text), ensure_ascii=False, separators=(",", ":"))
    truncated = body.truncated or len(text) > config.max_chars
    return {
        "url": body.url,
        "status": body.status,
        "content_type": body.content_type or "unknown",
        "title": title,
        "text": text[: config.max_chars],
        "truncated": truncated,
    }


plugin = Plugin(
    slug="url_fetch",
    name="URL fetch",
    version="1.0",
    description="Reads a public web page (text only), never the service's own network.",
    tools=[
        Tool(
            name="url_fetch",
            description=(
                "Fetch a public http(s) URL and return its readable text (HTML is reduced to "
                "text; long pages are cut). Private and local addresses are refused."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "url": {
                        "type": "string",
                        "maxLength": MAX_URL_CHARS,
                        "description": "The absolute http:// or https:// URL.",
                    }
                },
                "required": ["url"],
                "additionalProperties": False,
            },
            handler=fetch,
        )
    ],
    config_schema=CONFIG_SCHEMA,
)
