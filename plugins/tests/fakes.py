"""Plugins for the tests: well-behaved ones and each way a plugin can misbehave."""

from __future__ import annotations

import threading
from typing import Any

from chatsite.testing import budget
from plugins.sdk import Plugin, Tool, ToolContext, ToolError

OBJECT = {"type": "object", "properties": {}}
# Released by the tests so a hung handler's thread ends with the test.
release_hang = threading.Event()
# How long a hung handler hangs unless released: far longer than any tool time limit a test
# sets, so that a call that returns before it did not wait for the handler, at any speed.
HANG_SECONDS = budget(300)


def _echo(context: ToolContext, args: dict[str, Any]) -> Any:
    return {"text": args["text"], "user": context.user_id, "greeting": context.config["greeting"]}


def _hang(context: ToolContext, args: dict[str, Any]) -> Any:
    release_hang.wait(HANG_SECONDS)
    return "too late"


def _raise(context: ToolContext, args: dict[str, Any]) -> Any:
    raise RuntimeError("boom with api_key=do-not-show")


def _refuse(context: ToolContext, args: dict[str, Any]) -> Any:
    raise ToolError("The city is unknown.")


def _huge(context: ToolContext, args: dict[str, Any]) -> Any:
    return "x" * 1_000_000


def _malformed(context: ToolContext, args: dict[str, Any]) -> Any:
    return {"value": object()}


def _secret(context: ToolContext, args: dict[str, Any]) -> Any:
    return f"key length {len(context.config['api_key'])}, region {context.config['region']}"


echo = Plugin(
    slug="echo",
    name="Echo",
    version="1.0",
    description="Says back what it is given.",
    tools=[
        Tool(
            name="echo",
            description="Echo a text.",
            parameters={
                "type": "object",
                "properties": {"text": {"type": "string", "maxLength": 50}},
                "required": ["text"],
                "additionalProperties": False,
            },
            handler=_echo,
        )
    ],
    config_schema={
        "type": "object",
        "properties": {"greeting": {"type": "string", "default": "hello"}},
    },
)

misbehaving = Plugin(
    slug="misbehaving",
    name="Misbehaving",
    version="1.0",
    description="Every way a tool can go wrong.",
    tools=[
        Tool(name="hang", description="Never answers.", parameters=OBJECT, handler=_hang),
        Tool(name="explode", description="Raises.", parameters=OBJECT, handler=_raise),
        Tool(name="refuse", description="Refuses.", parameters=OBJECT, handler=_refuse),
        Tool(name="huge", description="A megabyte.", parameters=OBJECT, handler=_huge),
        Tool(name="malformed", description="Not JSON.", parameters=OBJECT, handler=_malformed),
    ],
)

secretive = Plugin(
    slug="secretive",
    name="Secretive",
    version="1.0",
    description="Needs an API key.",
    tools=[Tool(name="whoami", description="Uses the key.", parameters=OBJECT, handler=_secret)],
    config_schema={
        "type": "object",
        "properties": {
            "api_key": {"type": "string", "secret": True, "description": "The upstream key."},
            "region": {"type": "string", "enum": ["eu", "us"], "default": "eu"},
            "retries": {"type": "integer", "minimum": 0, "maximum": 5},
            "verbose": {"type": "boolean"},
        },
        "required": ["api_key"],
    },
)


def echo_factory() -> Plugin:
    return echo


incompatible = Plugin(
    slug="future",
    name="Future",
    version="1.0",
    description="Wants a later service.",
    tools=[],
    requires=">=99.0",
)

bad_parameters = Plugin(
    slug="bad-parameters",
    name="Bad parameters",
    version="1.0",
    description="A tool whose parameters are not an object schema.",
    tools=[Tool(name="bad", description="", parameters={"type": "string"}, handler=_echo)],
)

bad_config = Plugin(
    slug="bad-config",
    name="Bad config",
    version="1.0",
    description="A config field of a type the form cannot show.",
    tools=[],
    config_schema={"type": "object", "properties": {"hosts": {"type": "array"}}},
)

duplicate = Plugin(
    slug="duplicate",
    name="Duplicate",
    version="1.0",
    description="Takes a name already taken.",
    tools=[Tool(name="echo", description="Again.", parameters=OBJECT, handler=_echo)],
)

not_a_plugin = {"slug": "dict"}


def failing_factory() -> Plugin:
    raise RuntimeError("factory broke")
