"""vLLM's KV cache events make the prefix index exact: stored blocks recorded under the index's
own hashes of their tokens, evictions forgotten, a cleared cache emptied, a lost batch
replayed. The publisher is vLLM's own `ZmqEventPublisher` with vLLM's event classes, run
with the worker's Python (`kv_publisher.py`); the index is the real Redis one."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings

from chatsite.redis import async_redis
from chatsite.testing import budget
from inference import prompts
from inference.models import Generation, Worker
from inference.scheduler import kv_events, prefix

from .fixtures import finished, register_pool, running_schedulers, send, wait_for

WORKER = 7
BLOCK = 16


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Publisher:
    def __init__(self) -> None:
        if not Path(settings.WORKER_PYTHON).exists():
            pytest.fail("the vLLM worker venv is missing (make worker-venv)")
        self.port, self.replay_port = free_port(), free_port()
        self.process = subprocess.Popen(  # noqa: S603 (our own command line)
            [
                settings.WORKER_PYTHON,
                str(Path(__file__).with_name("kv_publisher.py")),
                str(self.port),
                str(self.replay_port),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == "ready"

    def send(self, *events: dict[str, Any]) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(list(events)) + "\n")
        self.process.stdin.flush()
        assert self.process.stdout.readline().strip() == "ok"

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=budget(30))  # then killed: cleanup, not a check
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def publisher() -> Iterator[Publisher]:
    started = Publisher()
    yield started
    started.stop()


@pytest.fixture
async def index() -> AsyncIterator[prefix.RedisIndex]:
    redis = async_redis()
    yield prefix.RedisIndex(redis)
    await redis.aclose()


@pytest.fixture
def tokens() -> list[int]:
    """A real prompt's tokens: seven full blocks of 16."""
    messages = [
        {"role": "system", "content": "You answer questions about a public library. " * 16},
        {"role": "user", "content": "When does it open on Sundays?"},
    ]
    ids = prompts.token_ids(str(settings.MODEL_DIR), messages)
    assert len(ids) >= 7 * BLOCK
    return ids[: 7 * BLOCK]


def stored(first: int, count: int, tokens: list[int], *, parent: int | None) -> dict[str, Any]:
    """vLLM storing blocks `first` .. `first + count - 1` of `tokens` (hashes 1000 + n)."""
    return {
        "stored": [1000 + n for n in range(first, first + count)],
        "parent": parent,
        "tokens": tokens[first * BLOCK : (first + count) * BLOCK],
        "block_size": BLOCK,
    }


async def following(
    publisher: Publisher, index: prefix.RedisIndex
) -> tuple[kv_events.KVEventsSubscriber, asyncio.Task[None]]:
    subscriber = kv_events.KVEventsSubscriber(
        kv_events.KVEventsApplier(index, WORKER, capacity=100),
        endpoint=f"tcp://127.0.0.1:{publisher.port}",
        replay_endpoint=f"tcp://127.0.0.1:{publisher.replay_port}",
    )
    task = asyncio.create_task(subscriber.run())

    # PUB sends nothing to a subscriber before its subscription arrives: empty batches until
    # one gets through (the ones before are replayed, as any gap is).
    async def heard() -> bool:
        await asyncio.to_thread(publisher.send)
        return bool(subscriber.batches)

    await wait_for(heard, what="the subscriber hearing the publisher")
    return subscriber, task


async def held(index: prefix.RedisIndex, tokens: list[int]) -> int:
    [blocks] = await index.matched_blocks([WORKER], prefix.block_hashes(tokens, BLOCK))
    return blocks


pytestmark = pytest.mark.e2e


async def test_stored_removed_and_cleared_blocks_shape_the_index(
    publisher: Publisher, index: prefix.RedisIndex, tokens: list[int]
) -> None:
    subscriber, task = await following(publisher, index)
    try:
        await asyncio.to_thread(publisher.send, stored(0, 3, tokens, parent=None))
        await asyncio.to_thread(publisher.send, stored(3, 2, tokens, parent=1002))
        await wait_for(lambda: at(index, tokens, 5))
        # The index's own hashes of the same tokens: what placement matches a prompt against.
        assert await index.redis.zcard(prefix.index_key(WORKER)) == 5

        await asyncio.to_thread(publisher.send, {"removed": [1003]})
        await wait_for(lambda: at(index, tokens, 3))
        await asyncio.to_thread(publisher.send, {"cleared": True})
        await wait_for(lambda: at(index, tokens, 0))
        assert await index.redis.zcard(prefix.index_key(WORKER)) == 0
        assert subscriber.applier.orphans == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_lost_batch_is_replayed_before_the_one_after_it(
    publisher: Publisher, index: prefix.RedisIndex, tokens: list[int]
) -> None:
    subscriber, task = await following(publisher, index)
    try:
        await asyncio.to_thread(publisher.send, stored(0, 2, tokens, parent=None))
        await asyncio.to_thread(publisher.send, {"drop": True}, stored(2, 3, tokens, parent=1001))
        await asyncio.to_thread(publisher.send, stored(5, 2, tokens, parent=1004))
        await wait_for(lambda: at(index, tokens, 7))
        # Without the replay the last batch's parent would be unknown: nothing orphaned.
        assert subscriber.replayed >= 1 and subscriber.applier.orphans == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def at(index: prefix.RedisIndex, tokens: list[int], blocks: int) -> bool:
    return await held(index, tokens) == blocks


async def test_a_sequence_that_starts_again_means_an_empty_cache(
    index: prefix.RedisIndex, tokens: list[int]
) -> None:
    # No sockets: the subscriber's bookkeeping alone, fed batches in vLLM's encoding.
    subscriber = kv_events.KVEventsSubscriber(
        kv_events.KVEventsApplier(index, WORKER, capacity=100), endpoint="tcp://127.0.0.1:1"
    )
    encoder = msgspec.msgpack.Encoder()

    def batch(*events: Any) -> bytes:
        return encoder.encode(kv_events.KVEventBatch(ts=0.0, events=list(events)))

    first = kv_events.BlockStored(
        block_hashes=[1, 2], parent_block_hash=None, token_ids=tokens[: 2 * BLOCK], block_size=BLOCK
    )
    await subscriber._received(41, batch(first))
    await subscriber._received(41, batch(first))  # a duplicate is applied once
    assert (await held(index, tokens), subscriber.batches) == (2, 1)
    await subscriber._received(0, batch())  # the worker restarted
    assert await held(index, tokens) == 0
    assert subscriber.last_seq == 0


@pytest.mark.django_db(transaction=True)
async def test_a_scheduler_follows_a_workers_events_and_stops_estimating_its_cache(
    publisher: Publisher, user: Any, fake_workers: Any, tokens: list[int]
) -> None:
    fake = fake_workers(block_size=BLOCK)  # reports its cache: placement could record there
    pool = await sync_to_async(register_pool)(fake)
    await Worker.objects.filter(pool=pool).aupdate(
        kv_events_endpoint=f"tcp://127.0.0.1:{publisher.port}",
        kv_events_replay_endpoint=f"tcp://127.0.0.1:{publisher.replay_port}",
    )
    worker_id = await Worker.objects.filter(pool=pool).values_list("id", flat=True).aget()
    async with running_schedulers() as [scheduler]:

        async def following_events() -> bool:
            await asyncio.to_thread(publisher.send)
            return worker_id in scheduler.capacity.exact

        await wait_for(following_events, every=0.1)
        turn = await send(user)
        await wait_for(lambda: finished(turn.generation.id))
        # The answer's prompt was not recorded as an estimate: the events alone fill the index.
        index = scheduler.capacity.index
        assert await index.redis.zcard(prefix.index_key(worker_id)) == 0
        await asyncio.to_thread(publisher.send, stored(0, 2, tokens, parent=None))

        async def recorded() -> bool:
            return await index.redis.zcard(prefix.index_key(worker_id)) == 2

        await wait_for(recorded)
    assert (await Generation.objects.aget(pk=turn.generation.id)).status == "complete"
