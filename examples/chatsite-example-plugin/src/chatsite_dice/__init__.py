"""A dice roller for Chatsite: the example of a third-party plugin package.

`plugin` is what the entry point names. The handler gets the arguments the model sent
(already checked against `parameters`) and a `ToolContext` with this plugin's settings.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from typing import Any

from plugins.sdk import Plugin, Tool, ToolContext, ToolError

NOTATION = re.compile(r"^\s*(\d{1,3})?\s*[dD]\s*(\d{1,4})\s*(?:([+-])\s*(\d{1,5}))?\s*$")
_random = secrets.SystemRandom()


def parse(notation: str) -> tuple[int, int, int]:
    """(count, sides, modifier) of dice notation such as "d20", "3d6" or "2d8-1"."""
    match = NOTATION.match(notation)
    if match is None:
        raise ToolError(f"{notation!r} is not dice notation; write it like 2d6+3.")
    count = int(match.group(1) or 1)
    sides = int(match.group(2))
    modifier = int(match.group(4) or 0) * (-1 if match.group(3) == "-" else 1)
    return count, sides, modifier


def sign(key: str, payload: dict[str, Any]) -> str:
    """HMAC-SHA256 (hex) of the payload as canonical JSON."""
    message = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


def roll_dice(context: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Roll the dice in `args["notation"]` within the limits staff set."""
    count, sides, modifier = parse(args["notation"])
    max_dice = int(context.config.get("max_dice", 20))
    max_sides = int(context.config.get("max_sides", 1000))
    if not 1 <= count <= max_dice:
        raise ToolError(f"Roll between 1 and {max_dice} dice.")
    if not 2 <= sides <= max_sides:
        raise ToolError(f"Dice have between 2 and {max_sides} sides here.")
    rolls = [_random.randint(1, sides) for _ in range(count)]
    result: dict[str, Any] = {
        "notation": f"{count}d{sides}{modifier:+d}" if modifier else f"{count}d{sides}",
        "rolls": rolls,
        "total": sum(rolls) + modifier,
    }
    if args.get("label"):
        result["label"] = args["label"]
    key = context.config.get("signing_key")
    if key:
        result["signature"] = sign(key, result)
    return result


plugin = Plugin(
    slug="dice",
    name="Dice",
    version="1.0.0",
    description="Rolls dice fairly (the model cannot pick the numbers), optionally signed.",
    requires=">=0.1,<1.0",
    tools=[
        Tool(
            name="roll_dice",
            description=(
                "Roll dice given in dice notation, e.g. 'd20', '3d6' or '2d8+1'. Returns each "
                "roll and the total. Use it whenever the user asks for a random roll."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "notation": {"type": "string", "maxLength": 20, "description": "e.g. 2d6+3"},
                    "label": {
                        "type": "string",
                        "maxLength": 80,
                        "description": "What the roll is for (optional).",
                    },
                },
                "required": ["notation"],
                "additionalProperties": False,
            },
            handler=roll_dice,
        )
    ],
    config_schema={
        "type": "object",
        "properties": {
            "max_dice": {
                "type": "integer",
                "minimum": 1,
                "maximum": 100,
                "default": 20,
                "description": "The most dice one roll may use.",
            },
            "max_sides": {
                "type": "integer",
                "minimum": 2,
                "maximum": 1000000,
                "default": 1000,
                "description": "The most sides a die may have.",
            },
            "signing_key": {
                "type": "string",
                "secret": True,
                "minLength": 16,
                "description": "When set, every roll is signed with HMAC-SHA256 under this key.",
            },
        },
    },
)
