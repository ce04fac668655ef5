"""Talking to MCP servers over streamable HTTP: list their tools, call one.

Both are coroutines for one short-lived connection each; `plugins.services` runs them in a
worker thread under the tool time limit, so a slow server never blocks the caller.

Every connection passes the address policy (`chatsite.netpolicy`) with the networks of
`PLUGINS_MCP_ALLOWED_NETWORKS`: the server's host name is resolved, each of its addresses
judged, and the socket connects to a judged address, never to the name again (`_PolicyBackend`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpcore2
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import TextContent

from chatsite.netpolicy import AddressPolicy, AddressRefused

from .models import MCP_NETWORKS_SETTING

# The most tool pages one listing follows: a server that pages forever is cut off here.
MAX_LIST_PAGES = 20


class McpCallError(Exception):
    """The server answered the call with an error result."""


@dataclass(frozen=True)
class McpTool:
    """A tool as an MCP server lists it."""

    name: str
    description: str
    input_schema: dict[str, Any]


class _PolicyBackend(httpcore2.AsyncNetworkBackend):
    """httpcore2's network layer, connecting only to addresses the address policy allows."""

    def __init__(self, policy: AddressPolicy) -> None:
        self._policy = policy
        self._inner = httpcore2.AnyIOBackend()

    # The signatures are httpcore2's, timeouts included.
    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                addresses = await self._policy.aresolve(host, port)
        except TimeoutError as exc:
            raise httpcore2.ConnectTimeout(f"'{host}' was not resolved in time.") from exc
        except AddressRefused as exc:
            # httpx2 maps this to its own ConnectError; `_connect` finds the refusal again.
            raise httpcore2.ConnectError(exc.strerror or str(exc)) from exc
        except OSError as exc:
            raise httpcore2.ConnectError(f"'{host}' could not be resolved.") from exc
        failure: Exception | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(
                    address,
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
                failure = exc
        raise failure or httpcore2.ConnectError(f"Could not connect to '{host}'.")

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109
        socket_options: Any = None,
    ) -> httpcore2.AsyncNetworkStream:
        raise httpcore2.ConnectError("MCP servers are reached over TCP only.")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _PolicyTransport(httpx2.AsyncHTTPTransport):
    """httpx2's transport over `_PolicyBackend`.

    httpx2 takes no network backend, so the pool it made is replaced by one over ours (one
    short-lived client per call: the pool's own limits do). No proxy of the environment is
    used (httpx2 mounts none over a transport it is given): the policy judges the address
    connected to, which a proxy would hide."""

    def __init__(self, policy: AddressPolicy) -> None:
        super().__init__()
        self._pool = httpcore2.AsyncConnectionPool(
            ssl_context=httpx2.create_ssl_context(), network_backend=_PolicyBackend(policy)
        )


def _http_client(headers: dict[str, str], seconds: float) -> httpx2.AsyncClient:
    """An HTTP client for MCP's transports, as `mcp.shared._httpx_utils.create_mcp_http_client`
    makes one (no redirects followed by httpx2; the transports follow those within the
    endpoint's origin), over the address policy."""
    return httpx2.AsyncClient(
        headers=headers,
        timeout=httpx2.Timeout(seconds),
        transport=_PolicyTransport(AddressPolicy.from_setting(MCP_NETWORKS_SETTING)),
    )


def _refusal_in(exc: BaseException | None) -> AddressRefused | None:
    """The address policy's refusal behind `exc`, if that is why it failed: MCP's task groups
    wrap it in exception groups, httpx2 and httpcore2 in their ConnectErrors (re-raised
    while handling it, so it is their context rather than their cause)."""
    if exc is None or isinstance(exc, AddressRefused):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if (found := _refusal_in(inner)) is not None:
                return found
    return _refusal_in(exc.__cause__ or exc.__context__)


@asynccontextmanager
async def _connect(url: str, headers: dict[str, str], seconds: float) -> AsyncIterator[Client]:
    try:
        async with (
            _http_client(headers, seconds) as http,
            Client(
                streamable_http_client(url, http_client=http),
                read_timeout_seconds=seconds,
                cache=None,
                raise_exceptions=True,
            ) as client,
        ):
            yield client
    except Exception as exc:
        refusal = _refusal_in(exc)
        if refusal is None:
            raise
        # Said as what it is (the staff console names the failure's type), not as a group.
        raise AddressRefused(refusal.strerror or str(refusal)) from exc


async def list_tools(*, url: str, headers: dict[str, str], seconds: float) -> list[McpTool]:
    """Every tool the server lists, following its pages."""
    tools: list[McpTool] = []
    cursor: str | None = None
    async with _connect(url, headers, seconds) as client:
        for _ in range(MAX_LIST_PAGES):
            page = await client.list_tools(cursor=cursor)
            tools.extend(
                McpTool(
                    name=tool.name,
                    description=tool.description or "",
                    input_schema=dict(tool.input_schema),
                )
                for tool in page.tools
            )
            cursor = page.next_cursor
            if not cursor:
                break
    return tools


async def call_tool(
    *, url: str, headers: dict[str, str], seconds: float, name: str, arguments: dict[str, Any]
) -> str:
    """The tool's answer as text (its text parts joined, or its structured content as JSON).

    Raises McpCallError with the server's text when the result is an error.
    """
    async with _connect(url, headers, seconds) as client:
        result = await client.call_tool(name, arguments, read_timeout_seconds=seconds)
    texts = [part.text for part in result.content if isinstance(part, TextContent)]
    text = "\n".join(texts)
    if result.is_error:
        raise McpCallError(text or "The MCP tool reported an error.")
    if not text and result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False)
    return text
