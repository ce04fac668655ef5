"""The stream writer batches the XADDs of many generations into one pipeline while one is on
its way, and every generation's events still land in its stream whole and in order."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from chatsite.redis import async_redis
from chatsite.stream_events import StreamEvent
from chatsite.testing import budget
from inference import queue
from inference.scheduler.writer import StreamLost, StreamWriter


class FlakyRedis:
    """A real client whose first `failures` pipelines time out: before they reach Redis, or
    (`apply_failed`) after Redis ran them, as a paused Redis does when it resumes. With
    `back`, every pipeline times out until that event is set: Redis away for as long as the
    test says."""

    def __init__(
        self,
        redis: Any,
        *,
        failures: int = 0,
        apply_failed: bool = False,
        back: asyncio.Event | None = None,
    ) -> None:
        self.redis = redis
        self.failures = failures
        self.apply_failed = apply_failed
        self.back = back
        self.failed = 0

    def away(self) -> bool:
        return self.failed < self.failures or (self.back is not None and not self.back.is_set())

    def pipeline(self, **kwargs: Any) -> Any:
        flaky = self

        class Pipeline:
            def __init__(self) -> None:
                self.inner = flaky.redis.pipeline(**kwargs)

            async def __aenter__(self) -> Pipeline:
                await self.inner.__aenter__()
                return self

            async def __aexit__(self, *exc: Any) -> None:
                await self.inner.__aexit__(*exc)

            def __getattr__(self, name: str) -> Any:
                return getattr(self.inner, name)

            async def execute(self, **options: Any) -> Any:
                if flaky.away():
                    flaky.failed += 1
                    if flaky.apply_failed:
                        await self.inner.execute(**options)
                    raise RedisTimeoutError("Timeout reading from Redis")
                return await self.inner.execute(**options)

        return Pipeline()


class CountingRedis:
    """A real client whose pipelines are counted."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self.pipelines = 0

    def pipeline(self, **kwargs: Any) -> Any:
        self.pipelines += 1
        return self.redis.pipeline(**kwargs)


async def test_events_of_many_generations_share_round_trips_and_keep_their_order() -> None:
    redis = async_redis()
    counting = CountingRedis(redis)
    writer = StreamWriter(counting)
    generations = [f"writer-test-{index}" for index in range(20)]

    async def answer(generation_id: str) -> None:
        for piece in range(10):
            await writer.event(generation_id, StreamEvent.DELTA, {"text": f"{piece} "})

    try:
        await asyncio.gather(*(answer(generation_id) for generation_id in generations))
        for generation_id in generations:
            entries: Any = await redis.xrange(queue.stream_key(generation_id))
            texts = [fields["data"] for _, fields in entries]
            assert texts == [f'{{"text": "{piece} "}}' for piece in range(10)]
    finally:
        await redis.aclose()
    # 200 events; one at a time they took 200 round trips.
    assert counting.pipelines <= 20


async def test_while_redis_is_away_events_are_held_and_then_appended_in_order(
    settings: Any,
) -> None:
    redis = async_redis()
    back = asyncio.Event()
    away = FlakyRedis(redis, back=back)
    writer = StreamWriter(away)
    try:
        # Each caller goes on while Redis does not answer: it stays away until every one has
        # (a caller that waited for Redis would wait out the budget).
        for piece in range(5):
            await asyncio.wait_for(
                writer.event("writer-held", StreamEvent.DELTA, {"text": str(piece)}),
                timeout=budget(30),
            )
        assert away.failed >= 1
        assert await redis.xlen(queue.stream_key("writer-held")) == 0  # all held
        back.set()
        await asyncio.wait_for(writer.drained("writer-held"), timeout=budget(30))
        entries: Any = await redis.xrange(queue.stream_key("writer-held"))
        assert [fields["data"] for _, fields in entries] == [
            f'{{"text": "{piece}"}}' for piece in range(5)
        ]
    finally:
        await redis.aclose()


async def test_a_batch_redis_took_before_its_answer_was_lost_is_not_appended_twice() -> None:
    redis = async_redis()
    # The first round trip reaches Redis, but its answer never comes back.
    late = FlakyRedis(redis, failures=1, apply_failed=True)
    writer = StreamWriter(late)
    try:
        await writer.event("writer-once", StreamEvent.DELTA, {"text": "a"})
        await writer.event("writer-once", StreamEvent.DELTA, {"text": "b"})
        await writer.drained("writer-once")
        entries: Any = await redis.xrange(queue.stream_key("writer-once"))
        assert [fields["data"] for _, fields in entries] == ['{"text": "a"}', '{"text": "b"}']
    finally:
        await redis.aclose()


async def test_past_the_outage_limit_the_held_events_are_dropped_and_their_answer_fails(
    settings: Any,
) -> None:
    settings.SCHEDULER_REDIS_OUTAGE_SECONDS = 0.3

    class Gone:
        def pipeline(self, **kwargs: Any) -> Any:
            raise RedisConnectionError("Redis is gone")

    writer = StreamWriter(Gone())
    await writer.event("a", StreamEvent.DELTA, {"text": "x"})  # held
    # The budgets are failure points: the writer gives up 0.3 s into the outage.
    with pytest.raises(StreamLost):
        await asyncio.wait_for(writer.drained("a"), timeout=budget(30))
    # Another generation's events are tried again from scratch.
    second = asyncio.ensure_future(writer.event("b", StreamEvent.DELTA, {"text": "y"}))
    await asyncio.wait_for(second, timeout=budget(30))  # held again, its caller goes on
    with pytest.raises(StreamLost):
        await asyncio.wait_for(writer.drained("b"), timeout=budget(30))


async def test_a_cancelled_caller_does_not_stop_the_others() -> None:
    redis = async_redis()
    writer = StreamWriter(redis)
    try:
        first = asyncio.ensure_future(writer.event("writer-c1", StreamEvent.DELTA, {"text": "1"}))
        second = asyncio.ensure_future(writer.event("writer-c2", StreamEvent.DELTA, {"text": "2"}))
        await asyncio.sleep(0)  # one turn of the loop: both have queued their entries
        first.cancel()
        await second
        with pytest.raises(asyncio.CancelledError):
            await first
        assert await redis.xlen(queue.stream_key("writer-c2")) == 1
    finally:
        await redis.aclose()
