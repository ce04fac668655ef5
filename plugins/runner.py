"""The plugin layer as the scheduler's tool runner (`settings.INFERENCE_TOOL_RUNNER`)."""

from __future__ import annotations

from django.db import connections

from inference.tools import ToolResult

from .services import tool_run


class PluginToolRunner:
    """Runs a tool the model called through `plugins.services.tool_run`, with the caller's
    permissions. Called in the scheduler's tool threads; never raises."""

    def run(
        self, *, user_id: int, conversation_id: str | None, name: str, arguments: str
    ) -> ToolResult:
        try:
            return tool_run(
                user_id=user_id, conversation_id=conversation_id, name=name, arguments=arguments
            )
        finally:
            # The tool threads are reused: do not leave a connection open in one.
            connections.close_all()
