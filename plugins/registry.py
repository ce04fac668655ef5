"""The registry of plugins: discovered once, checked, and shared by every caller.

Plugins come from two places: the modules named in `settings.PLUGINS_BUILTIN`
("module:attribute") and the entry points of the group `chatsite.plugins`. Each one is
loaded and checked; a plugin that fails to import, lacks a dependency, wants another version
of the service, declares a bad schema or a tool name already taken is left out with a logged
warning and a Django system check warning (`plugins.W001`...), never a crash.
"""

from __future__ import annotations

import functools
import importlib
import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import jsonschema
from django.conf import settings
from packaging.specifiers import InvalidSpecifier, SpecifierSet

import chatsite

# Defined by the inference plane (the tool loop's contract); re-exported for the plugin layer.
from inference.tools import ToolResult as ToolResult

from .sdk import Plugin, Tool

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "chatsite.plugins"
# What OpenAI-style function calling accepts; "__" is kept for MCP tools (`<server>__<tool>`).
TOOL_NAME_RE = re.compile(r"^(?!.*__)[A-Za-z0-9_-]{1,64}$")
SLUG_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
CONFIG_FIELD_TYPES = frozenset({"string", "integer", "number", "boolean"})


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the model is offered it: name, description, JSON Schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]
    plugin: str

    def to_openai(self) -> dict[str, Any]:
        """The entry of an OpenAI `tools` list."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


class Problem:
    """The system check ids of the ways a plugin can be left out."""

    IMPORT_FAILED = "plugins.W001"
    MISSING_DEPENDENCY = "plugins.W002"
    INCOMPATIBLE = "plugins.W003"
    BAD_SCHEMA = "plugins.W004"
    DUPLICATE = "plugins.W005"


@dataclass(frozen=True)
class SkippedPlugin:
    """A plugin left out of the registry, and why."""

    source: str
    check_id: str
    reason: str


@dataclass(frozen=True)
class LoadedPlugin:
    """A plugin that passed every check, and where it came from."""

    plugin: Plugin
    source: str
    builtin: bool


@dataclass
class Registry:
    """The plugins and tools in service, and the plugins left out."""

    plugins: dict[str, LoadedPlugin] = field(default_factory=dict)
    tools: dict[str, tuple[str, Tool]] = field(default_factory=dict)
    skipped: list[SkippedPlugin] = field(default_factory=list)

    def tool_spec(self, name: str) -> ToolSpec | None:
        """The spec of a plugin tool by name (not MCP tools: those live in the database)."""
        entry = self.tools.get(name)
        if entry is None:
            return None
        slug, tool = entry
        return ToolSpec(
            name=tool.name,
            description=tool.description,
            parameters=dict(tool.parameters),
            plugin=slug,
        )


class _Skip(Exception):
    def __init__(self, check_id: str, reason: str) -> None:
        super().__init__(reason)
        self.check_id = check_id
        self.reason = reason


def _entry_points() -> Iterable[metadata.EntryPoint]:
    return metadata.entry_points(group=ENTRY_POINT_GROUP)


def _load_builtin(path: str) -> Any:
    module_name, _, attribute = path.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attribute or "plugin")


def _resolve(load: Callable[[], Any]) -> Plugin:
    try:
        obj = load()
    except ModuleNotFoundError as exc:
        raise _Skip(Problem.MISSING_DEPENDENCY, f"cannot import module {exc.name!r}") from exc
    except Exception as exc:
        raise _Skip(Problem.IMPORT_FAILED, f"failed to load: {type(exc).__name__}: {exc}") from exc
    if not isinstance(obj, Plugin) and callable(obj):
        try:
            obj = obj()
        except Exception as exc:
            raise _Skip(
                Problem.IMPORT_FAILED, f"its factory failed: {type(exc).__name__}: {exc}"
            ) from exc
    if not isinstance(obj, Plugin):
        raise _Skip(Problem.IMPORT_FAILED, f"is a {type(obj).__name__}, not a plugins.sdk.Plugin")
    return obj


def _check_compatible(plugin: Plugin) -> None:
    try:
        specifier = SpecifierSet(plugin.requires)
    except InvalidSpecifier as exc:
        raise _Skip(Problem.INCOMPATIBLE, f"invalid requires {plugin.requires!r}") from exc
    if not specifier.contains(chatsite.__version__, prereleases=True):
        raise _Skip(
            Problem.INCOMPATIBLE,
            f"requires chatsite {plugin.requires}, this is {chatsite.__version__}",
        )


def _check_object_schema(schema: Mapping[str, Any], what: str) -> None:
    if not isinstance(schema, Mapping) or schema.get("type") != "object":
        raise _Skip(Problem.BAD_SCHEMA, f"{what} is not a JSON Schema of type 'object'")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise _Skip(
            Problem.BAD_SCHEMA, f"{what} is not a valid JSON Schema: {exc.message}"
        ) from exc


def _check_config_schema(schema: Mapping[str, Any]) -> None:
    _check_object_schema(schema, "config_schema")
    for key, prop in (schema.get("properties") or {}).items():
        kind = prop.get("type") if isinstance(prop, Mapping) else None
        if kind not in CONFIG_FIELD_TYPES and not (isinstance(prop, Mapping) and "enum" in prop):
            raise _Skip(
                Problem.BAD_SCHEMA,
                f"config field {key!r} has type {kind!r}; "
                "use string, integer, number, boolean or enum",
            )


def _check_plugin(plugin: Plugin, registry: Registry) -> None:
    if not SLUG_RE.match(plugin.slug or ""):
        raise _Skip(Problem.BAD_SCHEMA, f"slug {plugin.slug!r} is not a lowercase slug")
    if plugin.slug in registry.plugins:
        raise _Skip(Problem.DUPLICATE, f"slug {plugin.slug!r} is already taken")
    _check_compatible(plugin)
    _check_config_schema(plugin.config_schema)
    names: set[str] = set()
    for tool in plugin.tools:
        if not isinstance(tool, Tool):
            raise _Skip(Problem.BAD_SCHEMA, f"has a {type(tool).__name__} among its tools")
        if not TOOL_NAME_RE.match(tool.name):
            raise _Skip(
                Problem.BAD_SCHEMA,
                f"tool name {tool.name!r} must be 1-64 of A-Z a-z 0-9 _ - without '__'",
            )
        if not callable(tool.handler):
            raise _Skip(Problem.BAD_SCHEMA, f"tool {tool.name!r} has no callable handler")
        _check_object_schema(tool.parameters, f"the parameters of tool {tool.name!r}")
        if tool.name in registry.tools or tool.name in names:
            raise _Skip(Problem.DUPLICATE, f"tool name {tool.name!r} is already taken")
        names.add(tool.name)


def _add(registry: Registry, source: str, load: Callable[[], Any], *, builtin: bool) -> None:
    try:
        plugin = _resolve(load)
        _check_plugin(plugin, registry)
    except _Skip as skip:
        logger.warning("Plugin %s skipped (%s): %s", source, skip.check_id, skip.reason)
        registry.skipped.append(SkippedPlugin(source, skip.check_id, skip.reason))
        return
    registry.plugins[plugin.slug] = LoadedPlugin(plugin=plugin, source=source, builtin=builtin)
    for tool in plugin.tools:
        registry.tools[tool.name] = (plugin.slug, tool)


def registry_build(
    *,
    builtin: Iterable[str] | None = None,
    entry_points: Iterable[metadata.EntryPoint] | None = None,
) -> Registry:
    """Load and check every plugin: built-ins first (they win a name clash), then entry points."""
    registry = Registry()
    for path in settings.PLUGINS_BUILTIN if builtin is None else builtin:
        _add(registry, path, functools.partial(_load_builtin, path), builtin=True)
    for entry_point in _entry_points() if entry_points is None else entry_points:
        source = f"entry point {entry_point.name} = {entry_point.value}"
        _add(registry, source, entry_point.load, builtin=False)
    return registry


_registry: Registry | None = None
_lock = threading.Lock()


def get_registry() -> Registry:
    """The process's registry, built on first use."""
    global _registry
    if _registry is None:
        with _lock:
            if _registry is None:
                _registry = registry_build()
    return _registry


def registry_reset(registry: Registry | None = None) -> None:
    """Replace the process's registry (None: rebuild on next use). For tests and reloads."""
    global _registry
    with _lock:
        _registry = registry
