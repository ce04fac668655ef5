"""Which tools a user may call, in which conversation, and with which plugin settings.

A plugin tool is offered when its plugin is in the registry, enabled (built-ins are on by
default, packages installed by entry point are off until staff turn them on), open to the
user's plan, fully configured (its settings satisfy its config schema) and switched on by the
user in that conversation (tools start off unless `PLUGINS_TOOLS_ON_BY_DEFAULT`). MCP tools
follow the same rules with their server's row.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import jsonschema
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from billing.models import Plan
from billing.selectors import plan_for_user
from conversations.models import Conversation

from .crypto import decrypt_json
from .models import ConversationTool, McpServer, PluginConfig
from .registry import LoadedPlugin, ToolSpec, get_registry
from .sdk import Tool

MCP_SEPARATOR = "__"
_UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True)
class PluginState:
    """A discovered plugin with the settings staff gave it (or its defaults)."""

    loaded: LoadedPlugin
    enabled: bool
    all_plans: bool
    plan_ids: frozenset[int]
    values: dict[str, Any]
    secrets: dict[str, Any]

    @property
    def settings(self) -> dict[str, Any]:
        """Every setting a handler gets: schema defaults, then plain values, then secrets."""
        properties = self.loaded.plugin.config_schema.get("properties") or {}
        merged = {key: prop["default"] for key, prop in properties.items() if "default" in prop}
        merged.update(self.values)
        merged.update(self.secrets)
        return merged

    @property
    def configured(self) -> bool:
        """Whether the settings satisfy the plugin's config schema (required secrets set...)."""
        validator = jsonschema.validators.validator_for(self.loaded.plugin.config_schema)
        return validator(self.loaded.plugin.config_schema).is_valid(self.settings)

    def open_to(self, plan: Plan) -> bool:
        """Whether a user on `plan` may call this plugin's tools."""
        return self.enabled and (self.all_plans or plan.pk in self.plan_ids) and self.configured


def plugin_defaults(loaded: LoadedPlugin) -> dict[str, Any]:
    """The row a plugin starts with: built-ins on for every plan, installed packages off."""
    return {"enabled": loaded.builtin, "all_plans": True}


def plugin_states() -> dict[str, PluginState]:
    """Every plugin in the registry with its settings, by slug."""
    registry = get_registry()
    configs = {
        config.slug: config
        for config in PluginConfig.objects.filter(slug__in=registry.plugins).prefetch_related(
            "plans"
        )
    }
    states = {}
    for slug, loaded in registry.plugins.items():
        config = configs.get(slug)
        if config is None:
            defaults = plugin_defaults(loaded)
            states[slug] = PluginState(loaded, defaults["enabled"], True, frozenset(), {}, {})
            continue
        states[slug] = PluginState(
            loaded=loaded,
            enabled=config.enabled,
            all_plans=config.all_plans,
            plan_ids=frozenset(plan.pk for plan in config.plans.all()),
            values=dict(config.values),
            secrets=decrypt_json(config.secrets),
        )
    return states


def mcp_tool_name(server_slug: str, tool_name: str) -> str:
    """The name the model calls an MCP tool by: `<server>__<tool>`, within 64 safe characters."""
    return _UNSAFE_NAME_CHARS.sub("_", f"{server_slug}{MCP_SEPARATOR}{tool_name}")[:64]


def mcp_tool_specs(server: McpServer) -> list[ToolSpec]:
    """The tools a server listed at its last refresh, as offered to the model."""
    specs: dict[str, ToolSpec] = {}
    for tool in server.tools:
        name = mcp_tool_name(server.slug, tool["name"])
        schema = tool.get("input_schema") or {"type": "object", "properties": {}}
        if name not in specs:
            specs[name] = ToolSpec(
                name=name,
                description=tool.get("description") or "",
                parameters=schema,
                plugin=f"mcp:{server.slug}",
            )
    return list(specs.values())


def _mcp_servers_open_to(plan: Plan) -> Iterable[McpServer]:
    for server in McpServer.objects.filter(enabled=True).prefetch_related("plans"):
        if server.all_plans or any(p.pk == plan.pk for p in server.plans.all()):
            yield server


def _plugin_tools_open_to(plan: Plan) -> Iterable[Tool]:
    for state in plugin_states().values():
        if state.open_to(plan):
            yield from state.loaded.plugin.tools


def tools_for_user(*, user: AbstractBaseUser | AnonymousUser) -> list[ToolSpec]:
    """Every tool the user's plan may call, ignoring per-conversation switches."""
    if not user.is_authenticated:
        return []
    plan = plan_for_user(user=user)  # type: ignore[arg-type]
    registry = get_registry()
    tools = [
        spec
        for tool in _plugin_tools_open_to(plan)
        if (spec := registry.tool_spec(tool.name)) is not None
    ]
    taken = {spec.name for spec in tools}
    for server in _mcp_servers_open_to(plan):
        for spec in mcp_tool_specs(server):
            if spec.name not in taken:
                taken.add(spec.name)
                tools.append(spec)
    return tools


def plugin_tool_open_to(*, user: AbstractBaseUser, name: str) -> bool:
    """Whether the user's plan may call the plugin tool `name` at all (switches aside)."""
    plan = plan_for_user(user=user)  # type: ignore[arg-type]
    return any(tool.name == name for tool in _plugin_tools_open_to(plan))


def conversation_tool_switches(*, conversation: Conversation) -> dict[str, bool]:
    """The user's on/off choices in a conversation, by tool name (none in one not yet
    saved: a new conversation's turn, or a `/v1` key's that keeps nothing)."""
    if conversation._state.adding:
        return {}
    return dict(
        ConversationTool.objects.filter(conversation=conversation).values_list(
            "tool_name", "enabled"
        )
    )


def tools_for_conversation(
    *, user: AbstractBaseUser | AnonymousUser, conversation: Conversation | None
) -> list[ToolSpec]:
    """The tools the model may call in this conversation, for this user.

    Those of `tools_for_user` switched on in the conversation. The caller has already
    checked that the conversation belongs to the user.
    """
    if conversation is None:
        return tools_for_user(user=user)
    default = settings.PLUGINS_TOOLS_ON_BY_DEFAULT
    if not default and not conversation.tools_on:
        # Nothing switched on (most turns): no switch to read, nothing the plan offers to
        # work out.
        return []
    switches = conversation_tool_switches(conversation=conversation)
    return [spec for spec in tools_for_user(user=user) if switches.get(spec.name, default)]


def mcp_server_for_tool(*, name: str) -> tuple[McpServer, str] | None:
    """The enabled server and the server-side tool name behind an MCP tool name."""
    slug, separator, _ = name.partition(MCP_SEPARATOR)
    if not separator:
        return None
    server = McpServer.objects.filter(slug=slug, enabled=True).first()
    if server is None:
        return None
    for tool in server.tools:
        if mcp_tool_name(server.slug, tool["name"]) == name:
            return server, tool["name"]
    return None


@dataclass(frozen=True)
class ConversationToolState:
    """A tool the user's plan offers, and whether it is on in the conversation."""

    spec: ToolSpec
    enabled: bool


def conversation_tools(
    *, user: AbstractBaseUser | AnonymousUser, conversation: Conversation
) -> list[ConversationToolState]:
    """Every tool the user's plan offers, each with its switch in this conversation."""
    switches = conversation_tool_switches(conversation=conversation)
    return [
        ConversationToolState(
            spec=spec, enabled=switches.get(spec.name, settings.PLUGINS_TOOLS_ON_BY_DEFAULT)
        )
        for spec in tools_for_user(user=user)
    ]
