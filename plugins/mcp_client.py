"""Talking to MCP servers over streamable HTTP: list their tools, call one.

Both are coroutines for one short-lived connection each; `plugins.services` runs them in a
worker thread under the tool time limit, so a slow server never blocks the caller.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types import TextContent

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


@asynccontextmanager
async def _connect(url: str, headers: dict[str, str], seconds: float) -> AsyncIterator[Client]:
    async with (
        create_mcp_http_client(headers=headers, timeout=httpx2.Timeout(seconds)) as http,
        Client(
            streamable_http_client(url, http_client=http),
            read_timeout_seconds=seconds,
            cache=None,
            raise_exceptions=True,
        ) as client,
    ):
        yield client


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
