"""The worker client's stall detector: a stream its worker leaves silent while it serves the
others (preempted, behind higher-priority work) waits; a worker silent on every stream has
hung. Against a stand-in worker, with the client alone (no scheduler).

The stand-in's paused request is silent until the test sets `resume`, and the other request
streams only from the moment the pause begins, so which stream is silent while the other is
heard does not depend on how fast anything ran. The stall and first-token times are the
client's own short settings: the silences measured against them are made of the worker's
token gaps (least times), so a slower machine only lengthens them.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from typing import Any

import pytest

from chatsite.testing import budget
from inference.client import FaultCode, OpenAICompatibleClient, WorkerFault, _Watchdog

from .fake_worker import FakeWorker
from .fixtures import wait_for

TOKEN_DELAY = 0.05


async def answer(
    client: OpenAICompatibleClient, worker: FakeWorker, content: str, *, resume_at: int = 0
) -> str:
    """The answer's text; with `resume_at`, the worker's paused request goes on once this
    answer has that many tokens."""
    text = ""
    async for chunk in client.stream_chat(
        base_url=worker.url,
        model="fake",
        messages=[{"role": "user", "content": content}],
        max_tokens=1000,
        priority=0,
    ):
        text += chunk.text
        if resume_at and text.count("tok") == resume_at:
            worker.resume.set()
    return text


async def paused_beside_busy(
    client: OpenAICompatibleClient, worker: FakeWorker, *, resume_at: int = 0
) -> list[Any]:
    """A request that pauses after its third token, and one that streams from the moment it
    does: the busy one is sent first and is at the worker, holding its first token, before
    the paused one is sent."""
    busy = asyncio.create_task(answer(client, worker, "go on", resume_at=resume_at))

    async def busy_arrived() -> bool:
        return len(worker.requests) == 1

    await wait_for(busy_arrived, what="the busy request at the worker")
    paused = asyncio.create_task(answer(client, worker, "wait for me"))
    return list(await asyncio.gather(paused, busy, return_exceptions=True))


async def test_a_stream_its_worker_leaves_silent_while_busy_with_others_completes(
    fake_workers: Any,
) -> None:
    stall = budget(0.5)
    # Silent for the busy stream's first `resume_at` tokens: at least 4 stall times.
    resume_at = math.ceil(4 * stall / TOKEN_DELAY)
    tokens = resume_at + 20  # the busy stream goes on after the paused one resumed
    worker = fake_workers(tokens=tokens, token_delay=TOKEN_DELAY, pause_trigger="wait")
    # The first-token time only has to outlast the pause: a failure point, generous.
    client = OpenAICompatibleClient(stall_seconds=stall, first_token_seconds=budget(60))
    try:
        paused, busy = await paused_beside_busy(client, worker, resume_at=resume_at)
    finally:
        await client.aclose()
    assert paused == busy == "".join(f"tok{i} " for i in range(tokens))


async def test_a_worker_silent_on_every_stream_has_stalled(fake_workers: Any) -> None:
    # Paused until the worker stops: only the stall detector can end the answer. Neither the
    # first-token time nor the read timeout behind it (the longer of the two) can come
    # within the test's budget, so the fault is the stall time after its third token.
    worker = fake_workers(tokens=20, token_delay=0.01, pause_trigger="wait")
    client = OpenAICompatibleClient(stall_seconds=0.5, first_token_seconds=3600)
    try:
        with pytest.raises(WorkerFault) as fault:
            async with asyncio.timeout(budget(60)):
                await answer(client, worker, "wait for me")
    finally:
        await client.aclose()
    assert fault.value.code == FaultCode.WORKER_STALLED
    assert fault.value.message.startswith("no data from the worker for ")  # the detector's


async def test_a_stream_silent_past_the_first_token_time_fails_however_busy_its_worker(
    fake_workers: Any,
) -> None:
    first_token = budget(1.5)
    # The busy stream lasts three first-token times past the pause's beginning.
    tokens = math.ceil(3 * first_token / TOKEN_DELAY)
    worker = fake_workers(tokens=tokens, token_delay=TOKEN_DELAY, pause_trigger="wait")
    client = OpenAICompatibleClient(stall_seconds=0.5, first_token_seconds=first_token)
    try:
        paused, busy = await paused_beside_busy(client, worker)
    finally:
        await client.aclose()
    assert isinstance(paused, WorkerFault) and paused.code == FaultCode.WORKER_STALLED
    assert busy == "".join(f"tok{i} " for i in range(tokens))


@pytest.mark.parametrize("stopped", [False, True], ids=["stalled", "stopped-meanwhile"])
async def test_a_stop_in_the_moment_the_detector_gives_up_is_not_lost(stopped: bool) -> None:
    """The detector ends a silent stream by cancelling its task; a Stop that cancels the same
    task in the same moment must still stop the answer, not see it retried as a stall."""
    client = OpenAICompatibleClient(stall_seconds=3600, first_token_seconds=3600)
    watchdogs: list[_Watchdog] = []

    async def silent() -> AsyncIterator[bytes]:
        await asyncio.Event().wait()
        yield b""

    async def read() -> bytes:
        watchdog = _Watchdog(client, "http://worker")
        watchdogs.append(watchdog)
        try:
            return await watchdog.next(silent())
        finally:
            watchdog.stop()

    task = asyncio.create_task(read())
    try:
        await asyncio.sleep(0)  # the task starts and waits for its first line
        assert watchdogs and watchdogs[0].waiting
        # What the detector's timer does when it gives up ...
        watchdogs[0].gave_up = "no data from the worker for 30 s"
        task.cancel()
        if stopped:
            task.cancel()  # ... and a Stop before the task ran again
        if stopped:
            with pytest.raises(asyncio.CancelledError):
                await task
        else:
            with pytest.raises(WorkerFault) as fault:
                await task
            assert fault.value.code == FaultCode.WORKER_STALLED
    finally:
        await client.aclose()
