"""The catalogue of a generation's stream events: every name, and the shape of its payload.

A generation's answer travels as entries of its Redis Stream (`{"event": name, "data": json}`,
the entry id being the SSE id). The scheduler writes them, the SSE views relay them, the
`/v1` shapes translate them and the page's `static/js/stream.js` renders them: all follow this
module, and a test holds the JavaScript's list of names to it.
"""

from __future__ import annotations

import enum
import json
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from redis.typing import EncodableT, FieldT


class StreamEvent(enum.StrEnum):
    """The name of one event on a generation's stream."""

    META = "meta"  # the generation's ids and status (queued, then running on a worker)
    QUEUE = "queue"  # its place in line while it waits
    DELTA = "delta"  # text
    RESTART = "restart"  # the text so far is void: it starts again on another worker
    RETRACT = "retract"  # output moderation withdrew the text
    TOOL_START = "tool_start"  # the model called a plugin tool; it runs now
    TOOL_RESULT = "tool_result"  # the tool answered
    TOOL_ERROR = "tool_error"  # the tool failed; the model is told and goes on
    TOOL_CALLS = "tool_calls"  # the answer ends at calls the client runs itself (`/v1`)
    ERROR = "error"  # why a failed or rejected generation ended
    DONE = "done"  # the last event: final status, finish reason, usage
    # For the edge alone, never relayed to a client: read the answer from this worker.
    RELAY = "relay"


# After this event nothing more is written to the stream.
TERMINAL_EVENTS = frozenset({StreamEvent.DONE})
# Events between the scheduler and the edge, which no client is sent.
INTERNAL_EVENTS = frozenset({StreamEvent.RELAY})


class MetaData(TypedDict, total=False):
    generation_id: str
    message_id: str
    model: str
    status: str
    prompt_tokens_estimate: int
    worker: str
    attempt: int
    # Set when the overload policy sent the answer to another pool (`model`): why, and what
    # the user is shown.
    route_reason: str
    notice: str


class QueueData(TypedDict):
    position: int
    high_demand: bool


class DeltaData(TypedDict):
    text: str


class RestartData(TypedDict):
    reason: str
    attempt: int


class RetractData(TypedDict, total=False):
    reason: str
    categories: list[str]
    labels: list[str]  # the categories as people read them
    notice: str  # what clients show in place of the text
    message: str


class ToolStartData(TypedDict):
    id: str
    name: str
    arguments: str


class ToolResultData(TypedDict):
    id: str
    name: str
    content: str
    truncated: bool
    ok: bool


class ToolErrorData(TypedDict):
    id: str
    name: str
    code: str
    message: str


class ToolCallsData(TypedDict):
    tool_calls: list[dict[str, Any]]


class ErrorData(TypedDict):
    code: str
    message: str


class DoneData(TypedDict, total=False):
    status: str
    finish_reason: str
    prompt_tokens: int | None
    output_tokens: int | None
    # Of the prompt tokens, those the worker found in its prefix cache.
    cached_tokens: int | None


class RelayData(TypedDict):
    """An order to the edge that took the request (inference/relay.py): stream `body` from
    the worker at `url`, and report to scheduler replica `replica` under `attempt`. The body
    comes without its `messages`, which the edge reads from the job: a stream outlives its
    answer by `GENERATION_STREAM_TTL_SECONDS`, and the prompt of a key that keeps nothing
    must not."""

    attempt: int
    replica: str
    url: str
    body: dict[str, Any]
    request_id: str


def entry_fields(event: StreamEvent, data: Any) -> dict[FieldT, EncodableT]:
    """The fields of the stream entry that carries `event` with payload `data` (typed as
    redis-py's XADD takes them)."""
    return {"event": event.value, "data": json.dumps(data)}
