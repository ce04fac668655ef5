"""The worker client's stall detector: a stream its worker leaves silent while it serves the
others (preempted, behind higher-priority work) waits; a worker silent on every stream has
hung. Against a stand-in worker, with the client alone (no scheduler)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from inference.client import FaultCode, OpenAICompatibleClient, WorkerFault

from .fake_worker import FakeWorker


async def answer(client: OpenAICompatibleClient, worker: FakeWorker, content: str) -> str:
    text = ""
    async for chunk in client.stream_chat(
        base_url=worker.url,
        model="fake",
        messages=[{"role": "user", "content": content}],
        max_tokens=1000,
        priority=0,
    ):
        text += chunk.text
    return text


async def test_a_stream_its_worker_leaves_silent_while_busy_with_others_completes(
    fake_workers: Any,
) -> None:
    worker = fake_workers(tokens=60, token_delay=0.05, pause_trigger="wait", pause_seconds=2.0)
    client = OpenAICompatibleClient(stall_seconds=0.5, first_token_seconds=10)
    try:
        paused, busy = await asyncio.gather(
            answer(client, worker, "wait for me"), answer(client, worker, "go on")
        )
    finally:
        await client.aclose()
    assert paused.count("tok") == busy.count("tok") == 60


async def test_a_worker_silent_on_every_stream_has_stalled(fake_workers: Any) -> None:
    worker = fake_workers(tokens=20, token_delay=0.01, pause_trigger="wait", pause_seconds=30.0)
    client = OpenAICompatibleClient(stall_seconds=0.5, first_token_seconds=10)
    started = time.monotonic()
    try:
        with pytest.raises(WorkerFault) as fault:
            await answer(client, worker, "wait for me")
    finally:
        await client.aclose()
    assert fault.value.code == FaultCode.WORKER_STALLED
    assert time.monotonic() - started < 10  # the stall time after its third token, not 30 s


async def test_a_stream_silent_past_the_first_token_time_fails_however_busy_its_worker(
    fake_workers: Any,
) -> None:
    worker = fake_workers(tokens=100, token_delay=0.05, pause_trigger="wait", pause_seconds=4.0)
    client = OpenAICompatibleClient(stall_seconds=0.5, first_token_seconds=1.5)
    try:
        results = await asyncio.gather(
            answer(client, worker, "wait for me"),
            answer(client, worker, "go on"),
            return_exceptions=True,
        )
    finally:
        await client.aclose()
    paused, busy = results
    assert isinstance(paused, WorkerFault) and paused.code == FaultCode.WORKER_STALLED
    assert isinstance(busy, str) and busy.count("tok") == 100
