"""The stream writer: a generation's events into its Redis Stream, typed and coalesced.

Every event is one of `chatsite.stream_events` and goes out as one `XADD` (the entry id is the
SSE id). Tokens are not sent one by one: a `Coalescer` gathers them into an event about every
`SCHEDULER_COALESCE_MS`. A withdrawn answer is retracted in one Lua step.

Redis may stand still or go away for a while (a failover pauses clients for seconds): the
writer then holds the events, in order, and the answers go on reading from their workers;
they are appended when Redis answers again. Past `SCHEDULER_REDIS_OUTAGE_SECONDS` or
`SCHEDULER_REDIS_OUTAGE_EVENTS` held, it gives up: the answers whose events it dropped fail.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from chatsite.redis import REDIS_FAULTS
from chatsite.stream_events import RetractData, StreamEvent, entry_fields

from .. import queue

logger = logging.getLogger(__name__)

# Between tries while Redis does not answer.
RETRY_SECONDS = 0.25

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


class StreamLost(Exception):
    """Events of this generation were dropped: Redis stayed away past the outage limit."""


@dataclass
class _Entry:
    key: str
    fields: dict[Any, Any]
    # The writer's own number for the entry (its `w` field), to tell after a failed round
    # trip which of the batch Redis had appended already.
    number: int
    # Resolved when the entry is appended, or when an outage begins (the caller goes on and
    # the entry is held); failed when it is dropped.
    released: asyncio.Future[Any]


class StreamWriter:
    """Appends events to generations' streams.

    The `XADD`s of every generation a replica serves go out in batches: one is sent at once
    when none is on its way; those that arrive meanwhile go together as the next pipeline,
    as soon as the one before has its answer (a group commit). An idle replica's event waits
    for nothing; a busy one pays one round trip for many events instead of one each (redis-py
    costs about as much CPU per command as the scheduler's own work on a token). Each caller
    still awaits its own entry: a generation's events keep their order.

    While Redis does not answer, callers are released at once and their entries held; the
    held entries go out, in order, when it answers. A batch whose round trip failed may have
    been appended in part or in whole (a paused Redis runs it when it resumes): each entry
    carries the writer's number for it, and before it sends again the writer reads the end of
    each of those streams and leaves out what is there already, so nothing is appended twice.
    """

    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self._token = uuid.uuid4().hex[:8]
        self._numbers = 0
        self._waiting: list[_Entry] = []
        self._sender: asyncio.Task[None] | None = None
        # Since when Redis has not answered (loop time), and whether the last batch may have
        # been appended without our hearing of it.
        self._outage_since: float | None = None
        self._uncertain = False
        self._lost: set[str] = set()
        # Notified when held entries are appended or dropped (`drained`).
        self._progress = asyncio.Condition()

    async def event(
        self, generation_id: str, event: StreamEvent, data: Mapping[str, object]
    ) -> None:
        key = queue.stream_key(generation_id)
        if key in self._lost:
            raise StreamLost(generation_id)
        self._numbers += 1
        fields = entry_fields(event, data)
        fields["w"] = f"{self._token}-{self._numbers}"
        entry = _Entry(key, fields, self._numbers, asyncio.get_running_loop().create_future())
        self._waiting.append(entry)
        if self._outage_since is not None:
            entry.released.set_result(None)  # held: Redis is away
        if self._sender is None or self._sender.done():
            self._sender = asyncio.ensure_future(self._send())
        await entry.released

    async def drained(self, generation_id: str) -> None:
        """Until every event of `generation_id` is appended; StreamLost if some were
        dropped. Returns at once when nothing of it is held (Redis answering as usual)."""
        key = queue.stream_key(generation_id)
        async with self._progress:
            await self._progress.wait_for(
                lambda: not any(entry.key == key for entry in self._waiting)
            )
        if key in self._lost:
            self._lost.discard(key)
            raise StreamLost(generation_id)

    async def _send(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting:
            # What is waiting now; what arrives during the round trip goes in the next one.
            batch = self._waiting[: len(self._waiting)]
            try:
                to_send = await self._not_yet_appended(batch) if self._uncertain else batch
                async with self.redis.pipeline(transaction=False) as pipe:
                    for entry in to_send:
                        pipe.xadd(entry.key, entry.fields)
                    results = await pipe.execute(raise_on_error=False)
            except REDIS_FAULTS as exc:
                self._uncertain = True
                if self._outage_since is None:
                    self._outage_since = loop.time()
                    logger.warning("Redis does not answer (%r): holding the streams' events", exc)
                if self._outage_too_long(loop.time() - self._outage_since):
                    self._drop_all(exc)
                    await self._notify()
                    return
                for entry in self._waiting:
                    if not entry.released.done():
                        entry.released.set_result(None)
                await asyncio.sleep(RETRY_SECONDS)
                continue
            if self._outage_since is not None:
                logger.warning(
                    "Redis answers again after %.1f s: %d held event(s) appended",
                    loop.time() - self._outage_since,
                    len(to_send),
                )
            self._outage_since = None
            self._uncertain = False
            del self._waiting[: len(batch)]
            outcome = dict(zip(map(id, to_send), results, strict=True))
            for entry in batch:
                if entry.released.done():
                    continue  # held, or its caller was cancelled; the entry went out all the same
                result = outcome.get(id(entry))  # None: appended by a round trip that failed
                if isinstance(result, BaseException):
                    entry.released.set_exception(result)
                else:
                    entry.released.set_result(result)
            await self._notify()

    async def _notify(self) -> None:
        async with self._progress:
            self._progress.notify_all()

    async def _not_yet_appended(self, batch: list[_Entry]) -> list[_Entry]:
        """The entries of `batch` that are not in their streams yet."""
        keys = list(dict.fromkeys(entry.key for entry in batch))
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.xrevrange(key, count=64)
            tails = await pipe.execute()
        appended: dict[str, int] = {}
        prefix = f"{self._token}-"
        for key, tail in zip(keys, tails, strict=True):
            numbers = [
                int(fields["w"][len(prefix) :])
                for _, fields in tail
                if str(fields.get("w", "")).startswith(prefix)
            ]
            appended[key] = max(numbers, default=0)
        return [entry for entry in batch if entry.number > appended[entry.key]]

    def _outage_too_long(self, lasted: float) -> bool:
        return (
            lasted > settings.SCHEDULER_REDIS_OUTAGE_SECONDS
            or len(self._waiting) > settings.SCHEDULER_REDIS_OUTAGE_EVENTS
        )

    def _drop_all(self, exc: BaseException) -> None:
        """Give up on what is held: its generations' next events, and their finish, fail."""
        logger.error(
            "Redis stayed away past the outage limit: dropping %d held event(s)",
            len(self._waiting),
        )
        for entry in self._waiting:
            self._lost.add(entry.key)
            if not entry.released.done():
                entry.released.set_exception(StreamLost(str(exc)))
        self._waiting.clear()
        self._outage_since = None

    async def retract(self, generation_id: str, payload: RetractData) -> str:
        """Tell every client to replace the text with a notice, and drop it from the stream
        (after the events held for it, if Redis was away)."""
        await self.drained(generation_id)
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
