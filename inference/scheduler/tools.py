"""The tool loop's side of the scheduler: running the calls the model paused on.

The scheduler knows no plugin. It hands each call to a `ToolRunner` (named by
`settings.INFERENCE_TOOL_RUNNER`; default `plugins.runner.PluginToolRunner`) in a thread
pool of its own, so tools that block cannot starve the rest, and tells the stream how each
one went. Every call gets a result: a failing, hanging or missing tool gives the model an
error text instead. `/v1` clients run their own tools: the answer ends at their calls.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, Protocol, runtime_checkable

from asgiref.sync import sync_to_async
from django.conf import settings

from chatsite import dotted
from chatsite.stream_events import (
    StreamEvent,
    ToolCallsData,
    ToolErrorData,
    ToolResultData,
    ToolStartData,
)

from .. import services
from ..client import ToolCall
from ..tools import ToolResult
from .writer import StreamWriter

logger = logging.getLogger(__name__)

# The runner stops a tool at its own time limit; this outer guard only catches a runner
# that itself hangs (a database that does not answer).
TOOL_GUARD_SECONDS = 5.0
# A tool result shown in a `tool_result` event is cut here; the model gets all of it.
TOOL_RESULT_DISPLAY_CHARS = 2000


@runtime_checkable
class ToolRunner(Protocol):
    """Runs one tool call for the model, with the caller's permissions. Blocking (the loop
    calls it in a thread); never raises: a failure is a `ToolResult` with an error code."""

    def run(
        self, *, user_id: int, conversation_id: str | None, name: str, arguments: str
    ) -> ToolResult:
        """The result of tool `name` with `arguments` (a JSON object as text), in the
        conversation `conversation_id` (None for an answer kept in none: `/v1`'s unkept)."""


def configured_runner() -> ToolRunner:
    """The runner `settings.INFERENCE_TOOL_RUNNER` names; ImproperlyConfigured if none."""
    runner: ToolRunner = dotted.build(
        "INFERENCE_TOOL_RUNNER", settings.INFERENCE_TOOL_RUNNER, ToolRunner
    )
    return runner


class ToolLoop:
    """Runs a round of tool calls and reports each on the generation's stream."""

    def __init__(self, runner: ToolRunner, writer: StreamWriter) -> None:
        self.runner = runner
        self.writer = writer
        self._threads = ThreadPoolExecutor(
            max_workers=settings.PLUGINS_MAX_RUNNING, thread_name_prefix="tool-loop"
        )

    def shutdown(self) -> None:
        """Drop the calls not started and wait for those running: a tool still writing to the
        database after its scheduler stopped would outlive it (the plugin layer's own time
        limit bounds the wait). Each call closes its thread's connections when it ends."""
        self._threads.shutdown(wait=True, cancel_futures=True)

    async def run_calls(
        self,
        *,
        generation_id: str,
        user_id: int,
        conversation_id: str | None,
        calls: list[ToolCall],
    ) -> list[dict[str, Any]]:
        """Each call's result, as the tool messages of the round need them."""
        results = []
        for call in calls:
            await self.writer.event(
                generation_id,
                StreamEvent.TOOL_START,
                ToolStartData(id=call.id, name=call.name, arguments=call.arguments),
            )
            result = await self._run(user_id=user_id, conversation_id=conversation_id, call=call)
            if result.ok:
                shown = result.content[:TOOL_RESULT_DISPLAY_CHARS]
                await self.writer.event(
                    generation_id,
                    StreamEvent.TOOL_RESULT,
                    ToolResultData(
                        id=call.id,
                        name=call.name,
                        content=shown,
                        truncated=len(shown) < len(result.content),
                        ok=True,
                    ),
                )
            else:
                await self.writer.event(
                    generation_id,
                    StreamEvent.TOOL_ERROR,
                    ToolErrorData(
                        id=call.id,
                        name=call.name,
                        code=result.error_code,
                        message=result.error_message,
                    ),
                )
            results.append(
                {
                    "tool_call_id": call.id,
                    "name": call.name,
                    "content": result.content,
                    "ok": result.ok,
                }
            )
        return results

    async def _run(
        self, *, user_id: int, conversation_id: str | None, call: ToolCall
    ) -> ToolResult:
        loop = asyncio.get_running_loop()
        guard = settings.PLUGINS_TOOL_TIMEOUT_SECONDS + TOOL_GUARD_SECONDS
        try:
            return await asyncio.wait_for(
                loop.run_in_executor(
                    self._threads,
                    partial(
                        # In the run's context: the tool's log lines carry its ids.
                        contextvars.copy_context().run,
                        self.runner.run,
                        user_id=user_id,
                        conversation_id=conversation_id,
                        name=call.name,
                        arguments=call.arguments,
                    ),
                ),
                timeout=guard,
            )
        except TimeoutError:
            logger.error("tool %s: the tool runner did not answer in %s s", call.name, guard)
            message = f"The tool did not answer within {guard:g} seconds."
            return ToolResult(
                ok=False,
                content=f"Tool error (timeout): {message}",
                error_code="timeout",
                error_message=message,
            )

    async def hand_to_client(
        self, *, generation_id: str, calls: list[ToolCall], kept: bool = True
    ) -> None:
        """End at the model's calls: the client (`/v1`) runs its own tools. A `kept` answer
        keeps them with its message; the others only send them."""
        tool_calls = [call.to_openai() for call in calls]
        if kept:
            await sync_to_async(services.generation_record_tool_calls)(
                generation_id=generation_id, tool_calls=tool_calls
            )
        await self.writer.event(
            generation_id, StreamEvent.TOOL_CALLS, ToolCallsData(tool_calls=tool_calls)
        )


def sent_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """The calls as the assistant message sends them back: the worker parses the arguments,
    so they are kept valid JSON."""
    return [
        ToolCall(id=c.id, name=c.name, arguments=_json_arguments(c.arguments)).to_openai()
        for c in calls
    ]


def _json_arguments(arguments: str) -> str:
    """The model's arguments if they are a JSON object, else that text wrapped in one."""
    try:
        if isinstance(json.loads(arguments), dict):
            return arguments
    except ValueError:
        pass
    return json.dumps({"unparsed_arguments": arguments})
