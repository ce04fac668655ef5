"""The edge's side of the direct relay (inference/relay.py): an answer this edge queued,
read from the worker here.

`follow` is what a `/v1` view reads instead of the stream alone: the stream's events, and
for each `relay` order the scheduler writes there, the worker's text as `delta` events. The
attempt (`_Attempt`) runs beside the stream's reader, so a `restart` or `done` from the
scheduler ends it at once, and a client that leaves ends it too (closing the worker's
stream is how vLLM learns to abort). Output moderation checks the text here, as the
scheduler checks the answers it streams itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import AsyncGenerator
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections

from chatsite import sse, stream_hub
from chatsite.redis import REDIS_FAULTS
from chatsite.stream_events import INTERNAL_EVENTS, StreamEvent

from . import hooks, queue
from .client import Chunk, FaultCode, OpenAICompatibleClient, WorkerFault, get_client
from .relay import (
    BEAT_FIELD,
    BEAT_SECONDS,
    FIRST_FIELD,
    OUTCOME_FIELD,
    REPORT_RETRY_DELAYS,
    End,
    Order,
    Outcome,
)
from .scheduler.guard import OutputGuard, configured_guard
from .scheduler.writer import Coalescer

logger = logging.getLogger(__name__)


@functools.cache
def _client() -> OpenAICompatibleClient:
    """The process's client of the workers (one aiohttp session per event loop)."""
    return get_client()


async def close_client() -> None:
    """Close the client's session (a process that serves on one event loop never needs to)."""
    await _client().aclose()


def warm() -> None:
    """Load the output guard's classifiers as an edge process starts (`EDGE_WARM_UP`), not
    during the first answer it relays."""
    if settings.INFERENCE_DIRECT_RELAY:
        _guard().warm()


@functools.cache
def _guard() -> OutputGuard:
    return configured_guard()


# What `follow` yields: an event and its payload, or None after a heartbeat period of nothing.
Item = tuple[str, dict[str, Any]] | None


async def follow(
    generation_id: str,
    *,
    user_id: int,
    relay: bool,
    messages: list[dict[str, Any]] | None = None,
) -> AsyncGenerator[Item, None]:
    """The generation's events from its stream, until `done`. With `relay`, this request
    queued the answer: each `relay` order is carried out here, its text yielded as `delta`
    events, and the stream's own `delta`s (the whole text, which the replica writes at the
    end for anyone else) are skipped. Closing it early (the client left) ends the attempt
    under way and reports it as `LEFT`. `messages`: the prompt as the worker is asked it, if
    the caller has it (the turn made it); else each attempt reads it from the job."""
    if not relay:
        async with contextlib.aclosing(sse.read(queue.stream_key(generation_id), "0-0")) as read:
            async for entry in read:
                if entry is None:
                    yield None
                elif entry.event not in INTERNAL_EVENTS:
                    yield entry.event, entry.payload()
        return
    inbox: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    reader = asyncio.ensure_future(_read_stream(generation_id, inbox))
    attempt: _Attempt | None = None
    try:
        while True:
            kind, value = await inbox.get()
            if kind == "text":
                yield StreamEvent.DELTA, {"text": value}
                continue
            if kind == "failed":
                raise value
            if kind == "heartbeat":
                yield None
                continue
            event, payload = value
            if event == StreamEvent.RELAY:
                if attempt is not None:
                    await attempt.abandon()
                order = Order.from_data(payload)
                attempt = _Attempt(order, generation_id, user_id, inbox, messages)
                continue
            if event == StreamEvent.DELTA:
                continue  # the replica's copy of the text this edge relayed
            if event in (StreamEvent.RESTART, StreamEvent.DONE) and attempt is not None:
                # Void (another worker, another replica), or ended by the replica.
                await attempt.abandon()
                attempt = None
            yield event, payload
            if event == StreamEvent.DONE:
                return
    finally:
        reader.cancel()
        if attempt is not None:
            await asyncio.shield(attempt.leave())
        with contextlib.suppress(asyncio.CancelledError):
            await reader


async def _read_stream(generation_id: str, inbox: asyncio.Queue[tuple[str, Any]]) -> None:
    try:
        async for entry in sse.read(queue.stream_key(generation_id), "0-0"):
            if entry is None:
                inbox.put_nowait(("heartbeat", None))
            else:
                inbox.put_nowait(("event", (entry.event, entry.payload())))
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # Redis failed: the view decides what the client gets
        inbox.put_nowait(("failed", exc))


class _Attempt:
    """One relay order carried out: the worker's text into the inbox, its first token, its
    beats and its outcome to the replica."""

    def __init__(
        self,
        order: Order,
        generation_id: str,
        user_id: int,
        inbox: asyncio.Queue[tuple[str, Any]],
        messages: list[dict[str, Any]] | None = None,
    ) -> None:
        self.order = order
        self.messages = messages
        self.generation_id = generation_id
        self.user_id = user_id
        self.inbox = inbox
        # The loop's one client for the responses' commands (`stream_hub`).
        self.redis = stream_hub.hub().commands
        self.outcome = Outcome(attempt=order.attempt, end=End.COMPLETE)
        # Whether being cancelled means the client left (reported), or the attempt was void.
        self._report_cancel = True
        # Text read and not yet handed to the client (`_flush`).
        self._pending = ""
        self._task = asyncio.ensure_future(self._run())

    async def abandon(self) -> None:
        """Stop without a report: the replica voided or ended the attempt."""
        self._report_cancel = False
        await self._stop()

    async def leave(self) -> None:
        """Stop because the client left: reported as `LEFT`, with what was read."""
        await self._stop()

    async def _stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _run(self) -> None:
        beat = asyncio.ensure_future(self._beat())
        try:
            await self._read()
        except asyncio.CancelledError:
            if not self._report_cancel:
                raise
            self.outcome.end = End.LEFT
            await asyncio.shield(self._report())
            raise
        finally:
            beat.cancel()
        await self._report()

    async def _read(self) -> None:
        outcome, order = self.outcome, self.order
        guard = _guard()
        window = guard.window()
        stream: AsyncGenerator[Chunk, None] | None = None
        # The client gets the text as the scheduler used to send it: the first piece at once,
        # then what piled up once per `SCHEDULER_COALESCE_MS` (one write, not one a token).
        coalescer = Coalescer(self._flush, interval=settings.SCHEDULER_COALESCE_MS / 1000)
        try:
            messages = self.messages
            if messages is None:
                stored = await self.redis.hget(queue.job_key(self.generation_id), "messages")
                if stored is None:
                    return  # the answer ended meanwhile (its job goes with it)
                messages = json.loads(stored)
            stream = _client().stream_body(
                base_url=order.url,
                body={**order.body, "messages": messages},
                request_id=order.request_id or None,
            )
            async for chunk in stream:
                if chunk.usage:
                    outcome.usage = chunk.usage
                if chunk.finish_reason:
                    outcome.finish_reason = chunk.finish_reason
                if not chunk.text:
                    continue
                outcome.tokens += 1
                outcome.text += chunk.text
                self._pending += chunk.text
                await coalescer.pending()
                if outcome.tokens == 1:
                    await self._first_token()
                if window is not None and (excerpt := window.due(outcome.text)):
                    verdict = await guard.check(excerpt)
                    if window.record(verdict, excerpt, end=len(outcome.text)):
                        break  # closing the stream aborts the request in vLLM
        except WorkerFault as fault:
            outcome.end = End.FAULT
            outcome.fault_code, outcome.fault_message = str(fault.code), fault.message
        except Exception as exc:
            # Reported as a fault at once (the replica retries or fails the answer), rather
            # than left for the replica to find the relay silent.
            logger.exception("relaying generation %s failed", self.generation_id)
            outcome.end = End.FAULT
            outcome.fault_code = FaultCode.BAD_RESPONSE
            outcome.fault_message = f"the edge could not relay the answer: {type(exc).__name__}"
        finally:
            await coalescer.aclose()
            if stream is not None:
                await stream.aclose()
        if window is None:
            await self._flush()
            return
        text = outcome.text
        finished = window.blocked is None and outcome.end == End.COMPLETE
        if finished and text.strip() and not window.covered(text):
            # The whole answer once more (as the scheduler checks its own at the end).
            window.record(await guard.check(text), text, end=len(text))
        if window.blocked is not None:
            outcome.end = End.BLOCKED
            outcome.retract = dict(guard.retract_payload(window.blocked))
            self._pending = ""  # withdrawn: what the client has not seen, it never will
        await self._flush()
        verdict = window.blocked or window.review
        if verdict is not None:
            excerpt = window.blocked_excerpt if window.blocked else window.review_excerpt
            await self._flag(verdict, excerpt, retracted=window.blocked is not None)

    async def _flush(self) -> None:
        """Hand the client the text read since the last flush."""
        if self._pending:
            text, self._pending = self._pending, ""
            self.inbox.put_nowait(("text", text))

    async def _first_token(self) -> None:
        try:
            await self._note(FIRST_FIELD, f"{self.order.attempt} {queue.now_ms()}", say="first")
        except REDIS_FAULTS:
            logger.warning("could not report the first token of %s", self.generation_id)

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(BEAT_SECONDS)
            with contextlib.suppress(*REDIS_FAULTS):
                await self._note(BEAT_FIELD, f"{queue.now_ms()} {self.outcome.tokens}")

    async def _report(self) -> None:
        for delay in (*REPORT_RETRY_DELAYS, None):
            try:
                await self._note(OUTCOME_FIELD, self.outcome.to_json(), say="end")
                return
            except REDIS_FAULTS:
                if delay is None:
                    logger.error("could not report the end of relay %s", self.generation_id)
                    return
                await asyncio.sleep(delay)

    async def _note(self, name: str, value: str, *, say: str = "") -> None:
        """Set a field of the job (while it exists) and, with `say`, tell the replica that
        ordered the attempt (`<id> <attempt> <say>` on its channel), in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.eval(queue.HSET_IF_EXISTS, 1, queue.job_key(self.generation_id), name, value)
            if say:
                pipe.publish(
                    queue.relay_channel(self.order.replica),
                    f"{self.generation_id} {self.order.attempt} {say}",
                )
            await pipe.execute()

    async def _flag(self, verdict: Any, excerpt: str, *, retracted: bool) -> None:
        def flag() -> None:
            try:
                hooks.get_hooks().generation_output_flagged(
                    generation_id=self.generation_id,
                    user_id=self.user_id,
                    excerpt=excerpt,
                    verdict=verdict,
                    retracted=retracted,
                )
            finally:
                connections.close_all()

        try:
            await sync_to_async(flag, thread_sensitive=False)()
        except Exception:
            logger.exception("could not flag generation %s", self.generation_id)
