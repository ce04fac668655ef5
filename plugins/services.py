"""Writes of the plugins app, and running a tool for the model.

`tool_run` is the one door through which a generation's tool call reaches a plugin or an
MCP server: it re-checks the caller may use the tool, validates the arguments, runs the
handler in a worker thread under a time limit and bounds the size of what comes back. It
never raises; every failure is a `ToolResult` with an error code the model is shown.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

import jsonschema
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connections, transaction
from django.utils import timezone

from billing.models import Plan
from chatsite.errors import ServiceError
from conversations.models import Conversation

from . import mcp_client
from .crypto import decrypt_json, encrypt_json
from .errors import ErrorCode
from .models import ConversationTool, McpServer, PluginConfig
from .registry import ToolResult, ToolSpec, get_registry
from .sdk import ToolContext, ToolError
from .selectors import (
    mcp_server_for_tool,
    plugin_defaults,
    plugin_states,
    tools_for_conversation,
    tools_for_user,
)

logger = logging.getLogger(__name__)


class _Busy(Exception):
    pass


class _TimedOut(Exception):
    pass


_running = 0
_running_lock = threading.Lock()


def _run_limited(call: Callable[[], Any], *, timeout: float, name: str) -> Any:
    """`call()` in a daemon thread; its value, its exception, or _TimedOut after `timeout`.

    A thread cannot be killed: one that hangs keeps its slot until it returns, and once
    `PLUGINS_MAX_RUNNING` slots are taken further calls are refused (_Busy) rather than piling
    up threads.
    """
    global _running
    with _running_lock:
        if _running >= settings.PLUGINS_MAX_RUNNING:
            raise _Busy
        _running += 1
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def target() -> None:
        global _running
        try:
            outcome["value"] = call()
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            # A handler that read the database opened this thread's own connection.
            connections.close_all()
            with _running_lock:
                _running -= 1
            done.set()

    threading.Thread(target=target, name=f"tool:{name}", daemon=True).start()
    if not done.wait(timeout):
        raise _TimedOut
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def _failure(code: str, message: str) -> ToolResult:
    return ToolResult(
        ok=False, content=f"Tool error ({code}): {message}", error_code=code, error_message=message
    )


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def tool_run(*, user_id: int, conversation_id: str | None, name: str, arguments: str) -> ToolResult:
    """Run the tool `name` for the model with `arguments` (a JSON object as text).

    Synchronous, and blocks at most about `PLUGINS_TOOL_TIMEOUT_SECONDS`; call it through
    `sync_to_async`/`to_thread` from async code. Never raises.
    """
    try:
        return _tool_run(
            user_id=user_id, conversation_id=conversation_id, name=name, arguments=arguments
        )
    except Exception as exc:
        # Only the type: a message could quote a plugin's settings.
        logger.error("Tool %s: unexpected %s in the plugin layer", name, type(exc).__name__)
        return _failure("failed", "The tool could not be run.")


def _tool_run(
    *, user_id: int, conversation_id: str | None, name: str, arguments: str
) -> ToolResult:
    user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
    conversation = None
    if user is not None and conversation_id is not None:
        conversation = Conversation.objects.filter(
            pk=conversation_id, owner_id=user_id, deleted_at__isnull=True
        ).first()
    if user is None or (conversation_id is not None and conversation is None):
        return _failure("unavailable", "This tool is not available here.")
    allowed = {
        spec.name: spec for spec in tools_for_conversation(user=user, conversation=conversation)
    }
    spec = allowed.get(name)
    if spec is None:
        if name in get_registry().tools or mcp_server_for_tool(name=name) is not None:
            return _failure("unavailable", f"The tool {name!r} is not available here.")
        return _failure("unknown_tool", f"There is no tool named {name!r}.")

    try:
        args = json.loads(arguments) if arguments and arguments.strip() else {}
    except ValueError as exc:
        return _failure("bad_arguments", f"The arguments are not valid JSON: {exc}")
    if not isinstance(args, dict):
        return _failure("bad_arguments", "The arguments must be a JSON object.")
    error = jsonschema.exceptions.best_match(
        jsonschema.validators.validator_for(spec.parameters)(spec.parameters).iter_errors(args)
    )
    if error is not None:
        where = "/".join(str(part) for part in error.absolute_path)
        return _failure("bad_arguments", f"{where + ': ' if where else ''}{error.message}")

    timeout = float(settings.PLUGINS_TOOL_TIMEOUT_SECONDS)
    call = _plugin_call(spec, user_id, conversation_id, args, timeout) or _mcp_call(
        name, args, timeout
    )
    if call is None:
        return _failure("unavailable", f"The tool {name!r} is not available here.")
    try:
        value = _run_limited(call, timeout=timeout, name=name)
    except _Busy:
        return _failure("unavailable", "Too many tool calls are running; try again later.")
    except _TimedOut:
        logger.warning("Tool %s timed out after %.1f s", name, timeout)
        return _failure("timeout", f"The tool did not answer within {timeout:g} seconds.")
    except ToolError as exc:
        return _failure("failed", str(exc) or "The tool failed.")
    except mcp_client.McpCallError as exc:
        return _failure("failed", str(exc)[: settings.PLUGINS_RESULT_MAX_CHARS])
    except Exception as exc:
        logger.warning("Tool %s raised %s", name, type(exc).__name__)
        return _failure("failed", f"The tool failed ({type(exc).__name__}).")

    try:
        content = _as_text(value)
    except (TypeError, ValueError):
        return _failure("malformed", "The tool returned a result that is neither text nor JSON.")
    limit = settings.PLUGINS_RESULT_MAX_CHARS
    if len(content) > limit:
        return _failure(
            "too_large", f"The result has {len(content)} characters; the limit is {limit}."
        )
    return ToolResult(ok=True, content=content)


def _plugin_call(
    spec: ToolSpec, user_id: int, conversation_id: str | None, args: dict[str, Any], timeout: float
) -> Callable[[], Any] | None:
    entry = get_registry().tools.get(spec.name)
    state = plugin_states().get(spec.plugin)
    if entry is None or state is None:
        return None
    _, tool = entry
    context = ToolContext(
        user_id=user_id,
        conversation_id=str(conversation_id) if conversation_id is not None else None,
        config=MappingProxyType(state.settings),
        timeout_seconds=timeout,
    )
    return lambda: tool.handler(context, args)


def _mcp_call(name: str, args: dict[str, Any], timeout: float) -> Callable[[], Any] | None:
    found = mcp_server_for_tool(name=name)
    if found is None:
        return None
    server, remote_name = found
    url, headers = server.url, mcp_headers(server=server)
    return lambda: asyncio.run(
        mcp_client.call_tool(
            url=url, headers=headers, seconds=timeout, name=remote_name, arguments=args
        )
    )


def _secret_keys(schema: Mapping[str, Any]) -> set[str]:
    properties = schema.get("properties") or {}
    return {key for key, prop in properties.items() if prop.get("secret")}


@transaction.atomic
def plugin_config_update(
    *,
    slug: str,
    enabled: bool | None = None,
    all_plans: bool | None = None,
    plans: Iterable[Plan] | None = None,
    values: Mapping[str, Any] | None = None,
) -> PluginConfig:
    """Set a plugin's switches and settings; a secret given as None or "" keeps its value.

    Settings are checked against the plugin's config schema (types, enums, ranges; a missing
    required field is allowed: the plugin is then offered to nobody until it is set).
    """
    loaded = get_registry().plugins.get(slug)
    if loaded is None:
        raise ServiceError(ErrorCode.UNKNOWN_PLUGIN, f"No plugin {slug!r} is installed.")
    config, _ = PluginConfig.objects.get_or_create(slug=slug, defaults=plugin_defaults(loaded))
    config = PluginConfig.objects.select_for_update().get(pk=config.pk)
    update_fields = ["updated_at"]
    if enabled is not None:
        config.enabled = enabled
        update_fields.append("enabled")
    if all_plans is not None:
        config.all_plans = all_plans
        update_fields.append("all_plans")
    if values is not None:
        schema = loaded.plugin.config_schema
        properties = schema.get("properties") or {}
        secret_keys = _secret_keys(schema)
        unknown = set(values) - set(properties)
        if unknown:
            raise ServiceError(
                ErrorCode.INVALID_CONFIG, f"Unknown settings: {', '.join(sorted(unknown))}."
            )
        plain = {k: v for k, v in values.items() if k not in secret_keys and v is not None}
        secrets = decrypt_json(config.secrets)
        secrets.update(
            {k: v for k, v in values.items() if k in secret_keys and v not in (None, "")}
        )
        partial = {key: value for key, value in schema.items() if key != "required"}
        error = jsonschema.exceptions.best_match(
            jsonschema.validators.validator_for(partial)(partial).iter_errors({**plain, **secrets})
        )
        if error is not None:
            field = "/".join(str(part) for part in error.absolute_path) or "settings"
            # The validator's message quotes the value; for a secret it must not be shown.
            message = "is not valid" if field in secret_keys else error.message
            raise ServiceError(ErrorCode.INVALID_CONFIG, f"{field}: {message}")
        config.values = plain
        config.secrets = encrypt_json(secrets)
        update_fields += ["values", "secrets"]
    config.save(update_fields=update_fields)
    if plans is not None:
        config.plans.set(plans)
    return config


def plugin_configs_sync() -> int:
    """Give every discovered plugin its settings row (with its defaults); how many were added."""
    existing = set(PluginConfig.objects.values_list("slug", flat=True))
    added = 0
    for slug, loaded in get_registry().plugins.items():
        if slug not in existing:
            _, created = PluginConfig.objects.get_or_create(
                slug=slug, defaults=plugin_defaults(loaded)
            )
            added += created
    return added


def conversation_tools_set(
    *, user: Any, conversation: Conversation, switches: Mapping[str, bool]
) -> dict[str, bool]:
    """Switch tools on or off in a conversation the caller owns; the switches now in force.

    Only tools the user's plan offers can be switched.
    """
    offered = {spec.name for spec in tools_for_user(user=user)}
    unknown = sorted(set(switches) - offered)
    if unknown:
        raise ServiceError(
            ErrorCode.UNKNOWN_TOOL,
            "These tools are not available to you.",
            detail={"tools": unknown},
        )
    if not all(isinstance(enabled, bool) for enabled in switches.values()):
        raise ServiceError(ErrorCode.INVALID_SWITCHES, "Each tool must map to true or false.")
    with transaction.atomic():
        # The conversation's row first, and its flag as the lock finds it (the caller's copy
        # may predate another tab's switch): switches set at once in two tabs leave
        # `tools_on` as the last of them found them, never off while one is on.
        was_on = (
            Conversation.objects.select_for_update()
            .filter(pk=conversation.pk)
            .values_list("tools_on", flat=True)
            .first()
        )
        for tool_name, enabled in switches.items():
            ConversationTool.objects.update_or_create(
                conversation=conversation, tool_name=tool_name, defaults={"enabled": enabled}
            )
        now_set = dict(
            ConversationTool.objects.filter(conversation=conversation).values_list(
                "tool_name", "enabled"
            )
        )
        tools_on = any(now_set.values())
        if tools_on != was_on:
            Conversation.objects.filter(pk=conversation.pk).update(tools_on=tools_on)
        conversation.tools_on = tools_on
    return now_set


def mcp_headers(*, server: McpServer) -> dict[str, str]:
    """The HTTP headers a server is called with (its token as a Bearer authorization)."""
    secret = decrypt_json(server.secret_headers)
    headers = {str(k): str(v) for k, v in (secret.get("headers") or {}).items()}
    if secret.get("token"):
        headers["Authorization"] = f"Bearer {secret['token']}"
    return headers


def mcp_server_set_secrets(
    *, server: McpServer, token: str | None = None, headers: Mapping[str, str] | None = None
) -> None:
    """Store a server's token and extra headers encrypted; None (or "") keeps what is there."""
    secret = decrypt_json(server.secret_headers)
    if token:
        secret["token"] = token
    if headers:
        secret["headers"] = dict(headers)
    server.secret_headers = encrypt_json(secret)
    server.save(update_fields=["secret_headers", "updated_at"])


def _valid_object_schema(schema: Mapping[str, Any]) -> bool:
    if schema.get("type") != "object":
        return False
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError:
        return False
    return True


def mcp_server_refresh_tools(*, server: McpServer) -> int:
    """List the server's tools and store them; how many. Raises `mcp_unreachable` on failure.

    The listing runs under the tool time limit; its failure is kept in `last_error`.
    """
    timeout = float(settings.PLUGINS_TOOL_TIMEOUT_SECONDS)
    url, headers = server.url, mcp_headers(server=server)
    try:
        tools = _run_limited(
            lambda: asyncio.run(mcp_client.list_tools(url=url, headers=headers, seconds=timeout)),
            timeout=timeout,
            name=f"mcp:{server.slug}:list",
        )
    except Exception as exc:
        reason = {_Busy: "too many tool calls running", _TimedOut: "timed out"}.get(
            type(exc), type(exc).__name__
        )
        server.last_error = f"Listing tools failed: {reason}"
        server.save(update_fields=["last_error", "updated_at"])
        raise ServiceError(
            ErrorCode.MCP_UNREACHABLE, f"Could not list the tools of {server}: {reason}."
        ) from exc
    usable = [tool for tool in tools if _valid_object_schema(tool.input_schema)]
    if len(usable) < len(tools):
        logger.warning(
            "MCP server %s: %d tools skipped for an invalid input schema",
            server.slug,
            len(tools) - len(usable),
        )
    server.tools = [
        {"name": tool.name, "description": tool.description, "input_schema": tool.input_schema}
        for tool in usable
    ]
    server.tools_refreshed_at = timezone.now()
    server.last_error = ""
    server.save(update_fields=["tools", "tools_refreshed_at", "last_error", "updated_at"])
    return len(usable)
