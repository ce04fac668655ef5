"""Server-Sent Events over Redis Streams: the response, the wire format and the tail loop.

Every stream the edge serves is a Redis Stream, read by the process's one multiplexed reader
(`chatsite.stream_hub`, one XREAD over all of them): a generation's events
(`inference/api/stream.py`), a user's events (`conversations/api/events.py`) and, turned into
OpenAI's chunks, the streamed `/v1` answers (`conversations/openai_api/views.py`). An entry's
id is its SSE `id:`, so a client that reconnects with `Last-Event-ID` gets exactly what it
missed, then the live tail; any edge process serves any stream. While nothing happens for
`STREAM_HEARTBEAT_SECONDS` a heartbeat comment goes out, so proxies keep the connection open.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any

from asgiref.sync import SyncToAsync, sync_to_async
from django.conf import settings
from django.db import connections
from django.http import HttpRequest, StreamingHttpResponse
from msgspec.json import decode as decode_json
from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import RedisError

from chatsite import metrics, stream_hub, threads
from chatsite.stream_events import INTERNAL_EVENTS, TERMINAL_EVENTS

logger = logging.getLogger(__name__)

# A Redis Stream entry id, as clients send it back in Last-Event-ID.
EVENT_ID = re.compile(r"^\d{1,20}-\d{1,20}$")
HEARTBEAT = b": heartbeat\n\n"
# An entry without a name is a plain SSE message, as EventSource calls an unnamed event.
UNNAMED = "message"


class InvalidEventId(ValueError):
    """The client's Last-Event-ID is not an entry id."""


@dataclass(frozen=True)
class Entry:
    """One entry of a Redis Stream: its id, its event name and its JSON payload as written."""

    id: str
    event: str
    data: str

    def payload(self) -> Any:
        # Read for every event of every stream the edge relays: msgspec is the faster reader.
        return decode_json(self.data)


def sse_response(events: AsyncIterator[bytes]) -> StreamingHttpResponse:
    """A `text/event-stream` response that no cache or proxy holds back."""
    response = StreamingHttpResponse(events, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


def format_event(entry_id: str, event: str, data: str) -> bytes:
    """One SSE event; `data` is JSON, on one line."""
    # `id:` goes last: a connection cut inside an event then leaves the client no id of an
    # event it never got (some EventSource implementations keep a half-read event's id).
    return f"event: {event}\ndata: {data}\nid: {entry_id}\n\n".encode()


def retry_field() -> bytes:
    """Tells EventSource how long to wait before it reconnects by itself."""
    return f"retry: {settings.STREAM_RETRY_MS}\n\n".encode()


def last_event_id(request: HttpRequest) -> str:
    """The id of the last event the client holds: `Last-Event-ID` (EventSource's reconnect),
    else `?last_event_id=` (a page that reopens the stream itself); "" if it sent neither.
    Raises InvalidEventId for one that is not an entry id."""
    given = request.headers.get("Last-Event-ID") or request.GET.get("last_event_id") or ""
    if given and not EVENT_ID.match(given):
        raise InvalidEventId(given)
    return given


def release_request_thread() -> None:
    """Let the thread that ran this request's synchronous code (authentication, the
    lookups) go, for a response that needs no more of it.

    Django runs each request in an asgiref `ThreadSensitiveContext`, whose one-thread
    executor lives until the response ends: an idle stream would hold an idle thread, its
    stack and state (an idle stream cost 122 KiB with it, 61 without). The executor is
    given back to the edge's handler, which lent it (`chatsite.threads.EdgeHandler`), and a
    `threads.LateThread` takes its place: synchronous code the response still runs (Django
    closing it) borrows a thread again only then. An executor the handler did not lend is
    dropped from asgiref's table and shut down, as the context's exit would.
    """
    context = SyncToAsync.thread_sensitive_context.get(None)
    if context is None or getattr(context, "_executor", None) is not None:
        return  # no context, or one whose executor its creator owns
    executor = SyncToAsync.context_to_thread_executor.get(context)
    if executor is None or isinstance(executor, threads.LateThread):
        return
    if threads.REQUEST_THREADS.lent(executor):
        SyncToAsync.context_to_thread_executor[context] = threads.LateThread()
        threads.REQUEST_THREADS.give_back(executor)  # type: ignore[arg-type]
    else:
        del SyncToAsync.context_to_thread_executor[context]
        executor.shutdown(wait=False)


def stream_redis() -> AsyncRedis:
    """A client for a response's own commands (besides reading its stream, which the hub
    does), on the event loop's shared pool: `aclose()` it when the response ends."""
    return stream_hub.hub().commands


async def read(
    stream: str, last_id: str, *, until: Collection[str] = TERMINAL_EVENTS
) -> AsyncGenerator[Entry | None, None]:
    """The entries of `stream` after `last_id`, then live, in order; None after each
    heartbeat period in which nothing came. Ends after an event named in `until`. Read by
    the process's one multiplexed reader (`chatsite.stream_hub`); Redis errors, and
    `stream_hub.Lagging` for a reader far behind, go to the caller."""
    hub = stream_hub.hub()
    subscription = await hub.subscribe(stream, last_id)
    entries = stream_hub.stream_entries(
        subscription, idle_seconds=settings.STREAM_HEARTBEAT_SECONDS
    )
    metrics.EDGE_ACTIVE_STREAMS.inc()
    try:
        async for item in entries:
            if item is None:
                yield None
                continue
            entry_id, fields = item
            entry = Entry(entry_id, fields.get("event") or UNNAMED, fields.get("data") or "{}")
            yield entry
            if entry.event in until:
                return
    finally:
        metrics.EDGE_ACTIVE_STREAMS.dec()
        hub.unsubscribe(subscription)
        await entries.aclose()


class Tail:
    """A Redis Stream relayed as SSE: the retry delay, then each entry after `last_id` as an
    event with its entry id, heartbeats while idle.

    `events()` ends after an event named in `until` (then `finished` is true), or when Redis
    fails or the client falls far behind: the client reconnects with Last-Event-ID and loses
    nothing.
    """

    def __init__(
        self,
        stream: str,
        last_id: str,
        *,
        until: Collection[str] = TERMINAL_EVENTS,
        still_allowed: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.stream = stream
        self.last_id = last_id
        self.until = until
        self.finished = False
        # Asked once a heartbeat period whether the caller may still read (their API key not
        # revoked since): if not, the response ends, and the reconnect is refused.
        self.still_allowed = still_allowed
        self._allowed_at = time.monotonic()

    async def _may_go_on(self) -> bool:
        if self.still_allowed is None:
            return True
        if time.monotonic() - self._allowed_at < settings.STREAM_HEARTBEAT_SECONDS:
            return True
        self._allowed_at = time.monotonic()
        if await self.still_allowed():
            return True
        logger.info("%s: the caller's credential was revoked; ending the response", self.stream)
        return False

    async def events(self) -> AsyncGenerator[bytes, None]:
        # A stream may stay open for minutes or hours; the database connection that this
        # request's thread opened (authentication, the lookup, middleware) must not, nor
        # the thread.
        await sync_to_async(connections.close_all)()
        release_request_thread()
        yield retry_field()
        entries = read(self.stream, self.last_id, until=self.until)
        try:
            async with contextlib.aclosing(entries):
                async for entry in entries:
                    if not await self._may_go_on():
                        return
                    if entry is None:
                        yield HEARTBEAT
                        continue
                    self.last_id = entry.id
                    if entry.event in INTERNAL_EVENTS:
                        continue  # the scheduler's word to the edge, not the client's
                    yield format_event(entry.id, entry.event, entry.data)
                    self.finished = entry.event in self.until
        except RedisError:
            logger.warning("%s: Redis failed; ending the response", self.stream, exc_info=True)
        except stream_hub.Lagging:
            logger.info("%s: the client fell behind; ending the response", self.stream)
