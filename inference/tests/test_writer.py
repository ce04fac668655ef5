"""The stream writer batches the XADDs of many generations into one pipeline while one is on
its way, and every generation's events still land in its stream whole and in order."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from chatsite.redis import async_redis
from chatsite.stream_events import StreamEvent
from inference import queue
from inference.scheduler.writer import StreamWriter


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


async def test_a_failed_batch_fails_each_of_its_callers() -> None:
    class Broken:
        def pipeline(self, **kwargs: Any) -> Any:
            raise ConnectionError("Redis is gone")

    writer = StreamWriter(Broken())
    results = await asyncio.gather(
        writer.event("a", StreamEvent.DELTA, {"text": "x"}),
        writer.event("b", StreamEvent.DELTA, {"text": "y"}),
        return_exceptions=True,
    )
    assert [type(result) for result in results] == [ConnectionError, ConnectionError]


async def test_a_cancelled_caller_does_not_stop_the_others() -> None:
    redis = async_redis()
    writer = StreamWriter(redis)
    try:
        first = asyncio.ensure_future(writer.event("writer-c1", StreamEvent.DELTA, {"text": "1"}))
        second = asyncio.ensure_future(writer.event("writer-c2", StreamEvent.DELTA, {"text": "2"}))
        await asyncio.sleep(0)
        first.cancel()
        await second
        with pytest.raises(asyncio.CancelledError):
            await first
        assert await redis.xlen(queue.stream_key("writer-c2")) == 1
    finally:
        await redis.aclose()
