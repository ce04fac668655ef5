"""Fixtures for the inference plane: pools, stand-in workers, in-process scheduler replicas."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections

from inference import queue
from inference.models import ModelPool, Worker
from inference.scheduler import Scheduler

from .fake_worker import FakeWorker


@pytest.fixture(autouse=True)
async def _close_thread_connections() -> AsyncIterator[None]:
    """Async tests reach the database from asgiref's worker thread; close its connection
    so the test database can be dropped at the end of the run."""
    yield
    await sync_to_async(connections.close_all)()


@pytest.fixture
def fake_workers() -> Iterator[Callable[..., FakeWorker]]:
    started: list[FakeWorker] = []

    def start(**kwargs: Any) -> FakeWorker:
        worker = FakeWorker(**kwargs).start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def register_pool(*fakes: FakeWorker, name: str | None = None) -> ModelPool:
    """A pool served by `fakes`, counted with the real model's tokenizer."""
    pool, _ = ModelPool.objects.get_or_create(
        name=name or settings.DEFAULT_MODEL, defaults={"served_model": "fake"}
    )
    for index, fake in enumerate(fakes):
        Worker.objects.create(
            pool=pool, name=f"fake-{index}", url=fake.url, state=Worker.State.HEALTHY
        )
    return pool


@asynccontextmanager
async def running_schedulers(count: int = 1, **kwargs: Any) -> AsyncIterator[list[Scheduler]]:
    """`count` scheduler replicas running in this event loop, stopped on exit."""
    replicas = [
        Scheduler(replica_id=f"test-{index}", health_interval=0.2, **kwargs)
        for index in range(count)
    ]
    tasks = [asyncio.create_task(replica.run()) for replica in replicas]
    try:
        yield replicas
    finally:
        for replica in replicas:
            replica.stop()
        await asyncio.gather(*tasks, return_exceptions=True)


async def wait_for(
    condition: Callable[[], Awaitable[bool]], *, timeout: float = 15.0, every: float = 0.05
) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(every)


def stream_events(generation_id: Any) -> list[tuple[str, dict[str, Any]]]:
    redis = queue.sync_redis()
    return [
        (fields["event"], json.loads(fields["data"]))
        for _, fields in redis.xrange(queue.stream_key(generation_id))
    ]


async def generation_status(generation_id: Any) -> str:
    from inference.models import Generation

    generation = await Generation.objects.aget(pk=generation_id)
    return generation.status


async_stream_events = sync_to_async(stream_events)
