"""The stream writer: a generation's events into its Redis Stream, typed and coalesced.

Every event is one of `chatsite.stream_events` and goes out as one `XADD` (the entry id is the
SSE id). Tokens are not sent one by one: a `Coalescer` gathers them into an event about every
`SCHEDULER_COALESCE_MS`. A withdrawn answer is retracted in one Lua step.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from chatsite.stream_events import RetractData, StreamEvent, entry_fields

from .. import queue

# The retract event, then every delta dropped: atomic, so no reader sees one without the other
# and a client that re-attaches never gets the withdrawn text back.
RETRACT = """
local id = redis.call('XADD', KEYS[1], '*', 'event', ARGV[2], 'data', ARGV[1])
local entries = redis.call('XRANGE', KEYS[1], '-', id)
for _, entry in ipairs(entries) do
  local fields = entry[2]
  for i = 1, #fields, 2 do
    if fields[i] == 'event' and fields[i + 1] == ARGV[3] then
      redis.call('XDEL', KEYS[1], entry[1])
    end
  end
end
return id
"""


class StreamWriter:
    """Appends events to generations' streams.

    The `XADD`s of every generation a replica serves go out in batches: one is sent at once
    when none is on its way; those that arrive meanwhile go together as the next pipeline,
    as soon as the one before has its answer (a group commit). An idle replica's event waits
    for nothing; a busy one pays one round trip for many events instead of one each (redis-py
    costs about as much CPU per command as the scheduler's own work on a token). Each caller
    still awaits its own entry: a generation's events keep their order.
    """

    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self._waiting: list[tuple[str, Any, asyncio.Future[Any]]] = []
        self._sender: asyncio.Task[None] | None = None

    async def event(
        self, generation_id: str, event: StreamEvent, data: Mapping[str, object]
    ) -> None:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append((queue.stream_key(generation_id), entry_fields(event, data), future))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.ensure_future(self._send())
        await future

    async def _send(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            try:
                async with self.redis.pipeline(transaction=False) as pipe:
                    for key, fields, _ in batch:
                        pipe.xadd(key, fields)
                    results = await pipe.execute(raise_on_error=False)
            except Exception as exc:  # the connection failed: every caller hears of it
                results = [exc] * len(batch)
            for (_, _, future), result in zip(batch, results, strict=True):
                if future.done():
                    continue  # its caller was cancelled; the entry went out all the same
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)

    @staticmethod
    def queue_event(
        pipe: Any, generation_id: str, event: StreamEvent, data: Mapping[str, object]
    ) -> None:
        """The same `XADD`, as one command of the caller's pipeline."""
        pipe.xadd(queue.stream_key(generation_id), entry_fields(event, data))

    async def retract(self, generation_id: str, payload: RetractData) -> str:
        """Tell every client to replace the text with a notice, and drop it from the stream."""
        return str(
            await self.redis.eval(
                RETRACT,
                1,
                queue.stream_key(generation_id),
                json.dumps(payload),
                StreamEvent.RETRACT.value,
                StreamEvent.DELTA.value,
            )
        )


class Coalescer:
    """When to send the text that has piled up: a piece that arrives after a quiet
    `interval` goes out at once; the pieces of a burst go out together once it is up.

    `flush` sends what is pending. One flush runs at a time, in the order they were asked
    for, and a flush that has begun is never cancelled: the timer's flush and the loop's
    used to overlap, and the loop's `close` cancelled the timer while its `XADD` was in
    flight, so a delta could be lost or land after the next one. A flush made later by the
    timer has no caller to fail: one of the `late_errors` it raises is kept, and the next
    `pending()` raises it. (Left for the loop's next flush of its own to find again, it was
    never raised when pieces came faster than `interval`: every flush was then the timer's.)
    """

    def __init__(
        self,
        flush: Callable[[], Awaitable[None]],
        *,
        interval: float,
        late_errors: tuple[type[Exception], ...] = (),
    ) -> None:
        self._flush = flush
        self.interval = interval
        self._late_errors = late_errors
        self._last = 0.0
        self._lock = asyncio.Lock()
        self._timer: asyncio.Task[None] | None = None
        self._timer_flushing = False
        self._late: Exception | None = None

    async def pending(self) -> None:
        """New text is waiting: flush it now, or have the timer flush it when due. Raises
        what a timer's flush met, if it met one of the `late_errors`."""
        if self._late is not None:
            raise self._late
        now = asyncio.get_running_loop().time()
        if now - self._last >= self.interval:
            self._cancel_waiting_timer()
            async with self._lock:  # after a timer's flush in flight: events stay in order
                await self._flush()
            self._last = now
        elif self._timer is None or self._timer.done():
            self._timer = asyncio.create_task(self._later(self.interval - (now - self._last)))

    async def _later(self, delay: float) -> None:
        await asyncio.sleep(delay)
        async with self._lock:
            self._timer_flushing = True
            try:
                await self._flush()
            except self._late_errors as exc:
                self._late = exc
            finally:
                self._timer_flushing = False
                self._last = asyncio.get_running_loop().time()

    def _cancel_waiting_timer(self) -> None:
        """Forget the timer's flush if it has not begun; one that has runs to its end."""
        if self._timer is not None and not self._timer_flushing:
            self._timer.cancel()
            self._timer = None

    async def aclose(self) -> None:
        """No more timer flushes: a waiting one is forgotten, one under way is waited for,
        so the caller's last flush comes after it. The late flush's own failure is dropped:
        the caller's flush meets its cause again."""
        timer, self._timer = self._timer, None
        if timer is None or timer.done():
            return
        if not self._timer_flushing:
            timer.cancel()
        await asyncio.wait({timer})
        if not timer.cancelled():
            timer.exception()
