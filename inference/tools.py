"""What running one tool gives back: the contract between the scheduler's tool loop and
whatever runs the tools (`settings.INFERENCE_TOOL_RUNNER`; the plugin layer by default)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ToolResult:
    """What a tool run gave: the text for the model, or an error code and message.

    Error codes: "unknown_tool", "bad_arguments", "timeout", "too_large", "malformed",
    "failed", "unavailable". On error `content` is the text the model is shown.
    """

    ok: bool
    content: str
    error_code: str = ""
    error_message: str = ""
