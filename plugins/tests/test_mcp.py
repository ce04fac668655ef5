"""MCP servers as tool providers, against a real MCP server (streamable HTTP) on a free port."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from django.urls import reverse
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError as McpToolError

from chatsite.errors import ServiceError
from chatsite.testing import budget, wait_until
from conversations.tests.factories import ConversationFactory
from plugins.models import McpServer
from plugins.selectors import tools_for_conversation
from plugins.services import mcp_server_refresh_tools, mcp_server_set_secrets, tool_run

TOKEN = "mcp-token-5e1f0c2a9d"
# Ends the `slow` tool's wait early, once a test has seen what it wanted.
release_slow = threading.Event()


def _build_server() -> Any:
    server = MCPServer("test-tools")

    @server.tool(description="Add two integers.")
    def add(a: int, b: int) -> int:
        return a + b

    @server.tool(description="Answers after a while.")
    async def slow(seconds: float) -> str:
        await asyncio.to_thread(release_slow.wait, seconds)
        return "finally"

    @server.tool(description="Always fails.")
    def fail() -> str:
        raise McpToolError("upstream said no")

    app = server.streamable_http_app()

    async def require_token(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            if headers.get(b"authorization") != f"Bearer {TOKEN}".encode():
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"no"})
                return
        await app(scope, receive, send)

    return require_token


@pytest.fixture(scope="module")
def mcp_url() -> Iterator[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(_build_server(), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), what="the MCP server started")
    assert server.started, "the MCP server did not start"
    yield f"http://127.0.0.1:{port}/mcp"
    server.should_exit = True
    thread.join(10)  # a daemon thread: one slow to stop fails nothing


@pytest.fixture
def mcp_server(db: Any, mcp_url: str, fake_registry: Any) -> McpServer:
    server = McpServer.objects.create(slug="calc", name="Calc tools", url=mcp_url, enabled=True)
    mcp_server_set_secrets(server=server, token=TOKEN)
    return server


def test_refresh_lists_and_stores_the_tools(mcp_server):
    assert mcp_server_refresh_tools(server=mcp_server) == 3
    mcp_server.refresh_from_db()
    tools = {tool["name"]: tool for tool in mcp_server.tools}
    assert set(tools) == {"add", "slow", "fail"}
    assert tools["add"]["description"] == "Add two integers."
    assert set(tools["add"]["input_schema"]["properties"]) == {"a", "b"}
    assert mcp_server.tools_refreshed_at is not None
    assert TOKEN not in mcp_server.secret_headers


def test_mcp_tools_are_offered_and_called_like_any_other(mcp_server, user):
    mcp_server_refresh_tools(server=mcp_server)
    conversation = ConversationFactory.create(owner=user)
    specs = {
        spec.name: spec for spec in tools_for_conversation(user=user, conversation=conversation)
    }
    assert specs["calc__add"].plugin == "mcp:calc"
    assert "echo" in specs
    result = tool_run(
        user_id=user.pk,
        conversation_id=str(conversation.pk),
        name="calc__add",
        arguments='{"a": 2, "b": 40}',
    )
    assert result.ok, result
    assert result.content == "42"
    bad = tool_run(
        user_id=user.pk, conversation_id=None, name="calc__add", arguments='{"a": "two"}'
    )
    assert bad.error_code == "bad_arguments"


def test_an_mcp_error_result_is_a_failure(mcp_server, user):
    mcp_server_refresh_tools(server=mcp_server)
    result = tool_run(user_id=user.pk, conversation_id=None, name="calc__fail", arguments="{}")
    assert result.error_code == "failed"
    assert "upstream said no" in result.content


def test_a_slow_mcp_tool_times_out(mcp_server, user, settings):
    mcp_server_refresh_tools(server=mcp_server)
    settings.PLUGINS_TOOL_TIMEOUT_SECONDS = 1
    # The tool answers only when released (or after a budget far past the limit): a result
    # that comes back before then did not wait for it, at any speed.
    slow_for = budget(300)
    release_slow.clear()
    started = time.monotonic()
    try:
        result = tool_run(
            user_id=user.pk,
            conversation_id=None,
            name="calc__slow",
            arguments=f'{{"seconds": {slow_for}}}',
        )
        elapsed = time.monotonic() - started
    finally:
        release_slow.set()
    assert result.error_code == "timeout"
    assert elapsed < slow_for


def test_a_disabled_server_offers_nothing(mcp_server, user):
    mcp_server_refresh_tools(server=mcp_server)
    McpServer.objects.filter(pk=mcp_server.pk).update(enabled=False)
    names = {spec.name for spec in tools_for_conversation(user=user, conversation=None)}
    assert not any(name.startswith("calc__") for name in names)
    result = tool_run(user_id=user.pk, conversation_id=None, name="calc__add", arguments="{}")
    assert result.error_code == "unknown_tool"


def test_a_wrong_token_is_a_clear_refusal_without_the_token(mcp_server, caplog):
    mcp_server_set_secrets(server=mcp_server, token="wrong-token-123")
    with pytest.raises(ServiceError) as excinfo:
        mcp_server_refresh_tools(server=mcp_server)
    assert excinfo.value.code == "mcp_unreachable"
    mcp_server.refresh_from_db()
    assert mcp_server.last_error
    assert mcp_server.tools == []
    for text in (mcp_server.last_error, excinfo.value.message, caplog.text):
        assert "wrong-token-123" not in text


def test_admin_refreshes_and_never_shows_the_token(mcp_server, admin_client):
    change = reverse("admin:plugins_mcpserver_change", args=[mcp_server.pk])
    page = admin_client.get(change).content.decode()
    assert "token" in page
    assert TOKEN not in page
    response = admin_client.post(
        reverse("admin:plugins_mcpserver_changelist"),
        {"action": "refresh_tools", "_selected_action": [mcp_server.pk]},
        follow=True,
    )
    assert "3 tools listed" in response.content.decode()
    page = admin_client.get(change).content.decode()
    assert "add, slow, fail" in page
    assert TOKEN not in page
    form = {
        "slug": "calc",
        "name": "Calc tools",
        "url": mcp_server.url,
        "enabled": "on",
        "all_plans": "on",
        "token": "",
        "extra_headers": "",
    }
    assert admin_client.post(change, form).status_code == 302
    assert mcp_server_refresh_tools(server=mcp_server) == 3, "an empty token keeps the old one"


def test_a_server_name_resolving_to_loopback_is_refused_when_connecting(
    mcp_server: McpServer, user: Any, settings: Any
) -> None:
    # As a DNS change would (no save, no `clean`): the same server under a name.
    McpServer.objects.filter(pk=mcp_server.pk).update(
        url=mcp_server.url.replace("127.0.0.1", "localhost")
    )
    mcp_server.refresh_from_db()
    assert mcp_server_refresh_tools(server=mcp_server) == 3, "allowed, the name is reached"

    settings.PLUGINS_MCP_ALLOWED_NETWORKS = []
    with pytest.raises(ServiceError) as refused:
        mcp_server_refresh_tools(server=mcp_server)
    result = tool_run(
        user_id=user.pk, conversation_id=None, name="calc__add", arguments='{"a": 2, "b": 40}'
    )

    assert refused.value.code == "mcp_unreachable"
    mcp_server.refresh_from_db()
    assert mcp_server.last_error == "Listing tools failed: AddressRefused"
    assert result.error_code == "failed"
    assert "AddressRefused" in result.content


def _admin_form(url: str) -> dict[str, str]:
    return {
        "slug": "internal",
        "name": "Internal",
        "url": url,
        "all_plans": "on",
        "token": "",
        "extra_headers": "",
    }


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://169.254.169.254/", "'169.254.169.254' is a cloud metadata address"),
        ("http://127.0.0.1:6379", "'127.0.0.1' is a loopback address"),
        ("http://[::1]:8000/mcp", "'::1' is a loopback address"),
        ("http://10.0.0.8/mcp", "'10.0.0.8' is a private address"),
        ("http://localhost:8000/mcp", "'localhost' resolves to"),
    ],
)
def test_admin_refuses_a_server_on_a_non_public_address(
    admin_client: Any, settings: Any, url: str, says: str
) -> None:
    settings.PLUGINS_MCP_ALLOWED_NETWORKS = []

    response = admin_client.post(reverse("admin:plugins_mcpserver_add"), _admin_form(url))

    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == ["url"]
    assert says in errors["url"][0]
    assert "PLUGINS_MCP_ALLOWED_NETWORKS" in errors["url"][0]
    assert not McpServer.objects.filter(slug="internal").exists()


def test_admin_accepts_a_network_the_setting_allows(admin_client: Any, settings: Any) -> None:
    settings.PLUGINS_MCP_ALLOWED_NETWORKS = ["10.0.0.0/8"]

    response = admin_client.post(
        reverse("admin:plugins_mcpserver_add"), _admin_form("http://10.0.0.8/mcp")
    )

    assert response.status_code == 302
    assert McpServer.objects.get(slug="internal").url == "http://10.0.0.8/mcp"
