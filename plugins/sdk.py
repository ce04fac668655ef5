"""What a plugin package imports: the contract between third-party tools and the service.

A plugin is a distribution that exposes, under the entry-point group `chatsite.plugins`, a
`Plugin` object (or a callable that returns one):

    [project.entry-points."chatsite.plugins"]
    weather = "chatsite_weather:plugin"

Each `Tool` has a name the model calls it by, a description, the JSON Schema of its arguments
and a handler. The handler runs outside the scheduler's event loop, under a time limit, with a
`ToolContext` that carries only the calling user's identity and the plugin's own configuration
(secrets decrypted for the call, never logged). It returns text or a JSON-serialisable value;
it raises `ToolError` for a failure the model should be told about.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SDK_VERSION = "1.0"


class ToolError(Exception):
    """A failure the model should see as the tool's answer (bad input, an upstream refusal)."""


@dataclass(frozen=True)
class ToolContext:
    """What a handler may know about the call: who asked, where, and its plugin's settings."""

    user_id: int
    conversation_id: str | None
    config: Mapping[str, Any]
    timeout_seconds: float


ToolHandler = Callable[[ToolContext, dict[str, Any]], Any]


@dataclass(frozen=True)
class Tool:
    """A function the model may call. `parameters` is a JSON Schema of type "object"."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    handler: ToolHandler


@dataclass(frozen=True)
class Plugin:
    """A named set of tools with its configuration schema and the service versions it fits.

    `config_schema` is a JSON Schema of type "object"; a property with `"secret": true` is
    stored encrypted and shown masked. `requires` is a PEP 440 specifier matched against the
    service's version (`chatsite.__version__`).
    """

    slug: str
    name: str
    version: str
    description: str
    tools: Sequence[Tool]
    config_schema: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )
    requires: str = ">=0.1"
