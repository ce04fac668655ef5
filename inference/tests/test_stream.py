"""The SSE edge, served by a real edge process: replay, resume, heartbeats, disconnects."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User

from accounts.services import api_key_create
from chatsite.testing import budget
from conversations.services import conversation_create
from conversations.turns import Turn, turn_send
from inference import queue
from inference.models import Generation

from .fixtures import (
    LiveEdge,
    housekeeping_past,
    register_pool,
    running_schedulers,
    start_edge,
    stream_events,
    unwatched_since,
    wait_for,
    watchers,
)

pytestmark = pytest.mark.django_db(transaction=True)


@dataclass
class Event:
    id: str | None
    event: str
    data: dict[str, Any] | None
    comment: str | None = None


def read_events(lines: Iterator[str]) -> Iterator[Event]:
    """Parse an SSE body into events, comments (heartbeats) included."""
    fields: dict[str, str] = {}
    for line in lines:
        if line == "":
            if "data" in fields or "event" in fields:
                yield Event(
                    id=fields.get("id"),
                    event=fields.get("event", "message"),
                    data=json.loads(fields["data"]) if "data" in fields else None,
                )
                fields = {}
            continue
        if line.startswith(":"):
            yield Event(id=None, event="comment", data=None, comment=line[1:].strip())
            continue
        name, _, value = line.partition(":")
        fields[name] = value.removeprefix(" ")


def bearer(user: User) -> dict[str, str]:
    _, raw_key = api_key_create(user=user, name="stream tests")
    return {"Authorization": f"Bearer {raw_key}"}


def _send(user: User, content: str = "Hello") -> Turn:
    return turn_send(user=user, conversation=conversation_create(owner=user), content=content)


def stream_url(edge: LiveEdge, generation_id: Any) -> str:
    return f"{edge.url}/api/v1/generations/{generation_id}/stream"


async def collect(url: str, headers: dict[str, str], *, until: str = "done") -> list[Event]:
    """Read a stream until the event named `until`, then hang up."""
    events = []
    lines: list[str] = []
    async with (
        httpx.AsyncClient(timeout=budget(30)) as client,
        client.stream("GET", url, headers=headers) as response,
    ):
        assert response.status_code == 200
        async for line in response.aiter_lines():
            lines.append(line)
            if line != "":
                continue
            for event in read_events(iter(lines)):
                events.append(event)
                if event.event == until:
                    return events
            lines = []
    return events


async def read_until(
    url: str, headers: dict[str, str], stop: Callable[[Event], bool]
) -> tuple[list[Event], float]:
    """Read a stream until an event for which `stop` holds, then hang up; returns the events
    and the time just before the hang-up (the edge notes it later)."""
    events: list[Event] = []
    async with (
        httpx.AsyncClient(timeout=budget(30)) as client,
        client.stream("GET", url, headers=headers) as response,
    ):
        assert response.status_code == 200
        lines: list[str] = []
        async for line in response.aiter_lines():
            lines.append(line)
            if line != "":
                continue
            for event in read_events(iter(lines)):
                events.append(event)
                if stop(event):
                    return events, time.time()
            lines = []
    raise AssertionError(f"the stream ended first: {[e.event for e in events]}")


def is_delta(event: Event) -> bool:
    return event.event == "delta"


async def finished(generation_id: Any) -> bool:
    return (await Generation.objects.aget(pk=generation_id)).is_final


async def test_stream_replays_a_finished_generation_with_ids(
    user: User, fake_workers: Any, live_edge: LiveEdge
) -> None:
    fake = fake_workers(tokens=12, token_delay=0.01)
    await sync_to_async(register_pool)(fake)
    turn = await sync_to_async(_send)(user)
    async with running_schedulers():
        await wait_for(lambda: finished(turn.generation.id))
    headers = await sync_to_async(bearer)(user)

    with httpx.stream(
        "GET", stream_url(live_edge, turn.generation.id), headers=headers, timeout=budget(30)
    ) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.headers["cache-control"] == "no-cache"
        assert resp.headers["x-accel-buffering"] == "no"
        assert "gzip" not in resp.headers.get("content-encoding", "")
        # The key's owner's buckets, from the caller the view found (no second key lookup).
        assert int(resp.headers["x-ratelimit-limit-requests"]) > 0
        events = [e for e in read_events(resp.iter_lines()) if e.event != "comment"]

    names = [e.event for e in events]
    assert names[0] == "meta" and names[-1] == "done"
    assert all(e.id for e in events)
    assert len({e.id for e in events}) == len(events)
    text = "".join(e.data["text"] for e in events if e.event == "delta" and e.data)
    assert text == "".join(f"tok{i} " for i in range(12))
    assert events[-1].data is not None and events[-1].data["status"] == "complete"


async def test_last_event_id_resumes_exactly_after_it(
    user: User, fake_workers: Any, live_edge: LiveEdge
) -> None:
    fake = fake_workers(tokens=30, token_delay=0.01)
    await sync_to_async(register_pool)(fake)
    turn = await sync_to_async(_send)(user)
    async with running_schedulers():
        await wait_for(lambda: finished(turn.generation.id))
    headers = await sync_to_async(bearer)(user)
    url = stream_url(live_edge, turn.generation.id)
    everything = await collect(url, headers)
    everything = [e for e in everything if e.event != "comment"]
    cut = len(everything) // 2

    resumed = await collect(url, {**headers, "Last-Event-ID": str(everything[cut].id)})
    resumed = [e for e in resumed if e.event != "comment"]
    assert [e.id for e in resumed] == [e.id for e in everything[cut + 1 :]]


async def test_live_stream_reaches_the_client_while_it_is_produced(
    user: User, fake_workers: Any, live_edge: LiveEdge
) -> None:
    fake = fake_workers(tokens=40, token_delay=0.05)
    await sync_to_async(register_pool)(fake)
    turn = await sync_to_async(_send)(user)
    headers = await sync_to_async(bearer)(user)
    async with running_schedulers():
        events = await collect(stream_url(live_edge, turn.generation.id), headers)
        # The client saw the end while the generation was still being written, not after.
    names = [e.event for e in events if e.event != "comment"]
    assert names[0] == "meta"
    assert names.count("delta") > 5  # coalesced, but streamed in many pieces
    assert names[-1] == "done"
    generation = await Generation.objects.select_related("message").aget(pk=turn.generation.id)
    text = "".join(e.data["text"] for e in events if e.event == "delta" and e.data)
    assert text == generation.message.content


async def test_expired_stream_is_served_from_the_stored_message(
    user: User, fake_workers: Any, live_edge: LiveEdge
) -> None:
    fake = fake_workers(tokens=5)
    await sync_to_async(register_pool)(fake)
    turn = await sync_to_async(_send)(user)
    async with running_schedulers():
        await wait_for(lambda: finished(turn.generation.id))
    await queue.async_redis().delete(queue.stream_key(turn.generation.id))
    headers = await sync_to_async(bearer)(user)

    events = await collect(stream_url(live_edge, turn.generation.id), headers)
    assert [e.event for e in events] == ["meta", "delta", "done"]
    assert events[1].data == {"text": "tok0 tok1 tok2 tok3 tok4 "}


async def test_heartbeats_flow_while_the_generation_waits(user: User, live_edge: LiveEdge) -> None:
    await sync_to_async(register_pool)()  # no worker: the generation stays queued
    turn = await sync_to_async(_send)(user)
    headers = await sync_to_async(bearer)(user)

    def first_events() -> list[Event]:
        seen = []
        with httpx.stream(
            "GET", stream_url(live_edge, turn.generation.id), headers=headers, timeout=budget(30)
        ) as r:
            for event in read_events(r.iter_lines()):
                seen.append(event)
                if event.event == "comment":
                    break
        return seen

    seen = await sync_to_async(first_events)()
    assert seen[0].event == "meta"
    assert seen[-1].comment == "heartbeat"


async def test_leaving_after_the_first_token_cancels_after_the_grace_period(
    user: User, fake_workers: Any, live_edge: LiveEdge, settings: Any
) -> None:
    settings.STREAM_GRACE_SECONDS = 1
    fake = fake_workers(tokens=2000, token_delay=0.01)
    await sync_to_async(register_pool)(fake)
    turn = await sync_to_async(_send)(user)
    headers = await sync_to_async(bearer)(user)
    async with running_schedulers():
        _, left_at = await read_until(stream_url(live_edge, turn.generation.id), headers, is_delta)
        await wait_for(lambda: finished(turn.generation.id))
    generation = await Generation.objects.select_related("message").aget(pk=turn.generation.id)
    assert generation.status == Generation.Status.CANCELLED
    # Not at once when the client left (it may come back): only once the grace was up.
    assert generation.finished_at is not None
    assert generation.finished_at.timestamp() >= left_at + 1.0, "cancelled before the grace"
    assert generation.message.content.startswith("tok0")

    # The worker learns of the abort when its next write finds the connection closed, in its
    # own thread: after the generation is final, not necessarily before.
    async def worker_aborted() -> bool:
        return fake.aborted == 1

    await wait_for(worker_aborted)


async def test_a_client_that_comes_back_in_time_keeps_the_generation(
    user: User,
    fake_workers: Any,
    live_edge: LiveEdge,
    settings: Any,
    housekeeping_passes: list[int],
) -> None:
    # Coming back takes one local request, far within the grace on a slow machine.
    settings.STREAM_GRACE_SECONDS = 3
    settings.SCHEDULER_STALL_SECONDS = 3600  # the worker pauses for as long as the test needs
    # The answer pauses after its third token until the grace is past: it is still running
    # when housekeeping would have cancelled it.
    fake = fake_workers(tokens=150, token_delay=0.02, pause_trigger="Hello")
    await sync_to_async(register_pool)(fake)
    turn = await sync_to_async(_send)(user)
    headers = await sync_to_async(bearer)(user)
    url = stream_url(live_edge, turn.generation.id)
    gid = turn.generation.id
    async with running_schedulers():
        first, _ = await read_until(url, headers, is_delta)
        since = await unwatched_since(gid)
        last_seen = str([e for e in first if e.id][-1].id)
        back = asyncio.create_task(collect(url, {**headers, "Last-Event-ID": last_seen}))
        try:

            async def watched() -> bool:
                return await watchers(gid) == 1

            await wait_for(watched, what="the client back")
            await housekeeping_past(housekeeping_passes, since + 3 * 1000)  # the grace
            assert not await finished(gid)
            fake.resume.set()
            rest = await back
        finally:
            back.cancel()
            await asyncio.gather(back, return_exceptions=True)
    assert rest[-1].event == "done"
    assert rest[-1].data is not None and rest[-1].data["status"] == "complete"
    text = "".join(e.data["text"] for e in first + rest if e.event == "delta" and e.data)
    assert text == "".join(f"tok{i} " for i in range(150))


async def test_another_users_stream_is_not_found(
    user: User, other_user: User, live_edge: LiveEdge
) -> None:
    await sync_to_async(register_pool)()
    turn = await sync_to_async(_send)(user)
    url = stream_url(live_edge, turn.generation.id)
    other_headers = await sync_to_async(bearer)(other_user)
    response = await sync_to_async(httpx.get)(url, headers=other_headers, timeout=budget(30))
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    anonymous = await sync_to_async(httpx.get)(url, timeout=budget(30))
    assert anonymous.status_code == 401
    bad_id = await sync_to_async(httpx.get)(
        url,
        headers={**(await sync_to_async(bearer)(user)), "Last-Event-ID": "x"},
        timeout=budget(30),
    )
    assert bad_id.status_code == 400


async def test_random_drops_and_resumes_reassemble_the_stored_text_exactly(
    user: User, fake_workers: Any, live_edge: LiveEdge, settings: Any
) -> None:
    # One event per token, so a long answer makes hundreds of places to drop at.
    settings.SCHEDULER_COALESCE_MS = 0
    settings.STREAM_GRACE_SECONDS = 60
    fake = fake_workers(tokens=600, token_delay=0.002)
    pool = await sync_to_async(register_pool)(fake)
    pool.max_output_tokens = 600
    await pool.asave(update_fields=["max_output_tokens"])
    turn = await sync_to_async(_send)(user)
    headers = await sync_to_async(bearer)(user)
    url = stream_url(live_edge, turn.generation.id)
    rng = random.Random(20261129)

    text = ""
    last_id: str | None = None
    drops = 0
    async with running_schedulers(), httpx.AsyncClient(timeout=budget(30)) as client:

        async def first_token() -> bool:
            events = await sync_to_async(stream_events)(turn.generation.id)
            return any(name == "delta" for name, _ in events)

        # Drops before the first token: test_disconnect_grace.py. This one is about the text.
        await wait_for(first_token)
        done = False
        while not done:
            request_headers = {**headers, **({"Last-Event-ID": last_id} if last_id else {})}
            keep = rng.randint(1, 3)  # hang up after this many events
            seen = 0
            async with client.stream("GET", url, headers=request_headers) as response:
                assert response.status_code == 200
                lines: list[str] = []
                async for line in response.aiter_lines():
                    lines.append(line)
                    if line != "":
                        continue
                    for event in read_events(iter(lines)):
                        if event.event == "comment":
                            continue
                        last_id = event.id
                        if event.event == "delta" and event.data:
                            text += event.data["text"]
                        if event.event == "restart":
                            text = ""
                        done = event.event == "done"
                        seen += 1
                    lines = []
                    if done or seen >= keep:
                        break
            drops += 0 if done else 1

    generation = await Generation.objects.select_related("message").aget(pk=turn.generation.id)
    assert drops >= 200, (drops, generation.status, generation.error_message, text[:100])
    assert generation.status == Generation.Status.COMPLETE
    assert text == generation.message.content == "".join(f"tok{i} " for i in range(600))


async def test_two_tabs_watch_one_generation_and_one_leaving_does_not_cancel_it(
    user: User,
    fake_workers: Any,
    live_edge: LiveEdge,
    settings: Any,
    housekeeping_passes: list[int],
) -> None:
    settings.STREAM_GRACE_SECONDS = 1
    settings.SCHEDULER_STALL_SECONDS = 3600  # the worker pauses for as long as the test needs
    # The answer pauses after its third token until the grace is past: it is still running
    # when housekeeping would have cancelled it.
    fake = fake_workers(tokens=250, token_delay=0.02, pause_trigger="Hello")
    pool = await sync_to_async(register_pool)(fake)
    pool.max_output_tokens = 250
    await pool.asave(update_fields=["max_output_tokens"])
    turn = await sync_to_async(_send)(user)
    gid = turn.generation.id
    headers = await sync_to_async(bearer)(user)
    url = stream_url(live_edge, gid)

    async def one_tab() -> bool:
        return await watchers(gid) == 1

    async with running_schedulers():
        staying = asyncio.create_task(collect(url, headers))
        try:
            await wait_for(one_tab, what="the staying tab reading")
            leaving = await collect(url, headers, until="delta")
            await wait_for(one_tab, what="the edge noting the other tab left")
            left = queue.now_ms()
            # Past the grace period, the remaining tab still holds the generation.
            await housekeeping_past(housekeeping_passes, left + 1 * 1000)  # the grace
            assert not await finished(gid)
            fake.resume.set()
            full = await staying
        finally:
            staying.cancel()
            await asyncio.gather(staying, return_exceptions=True)
    assert full[-1].event == "done"
    assert full[-1].data is not None and full[-1].data["status"] == "complete"
    ids = [e.id for e in full if e.id]
    assert [e.id for e in leaving if e.id] == ids[: len([e for e in leaving if e.id])]


async def test_an_idle_stream_outlives_the_redis_client_timeout(
    user: User, live_edge: LiveEdge, tmp_path: Any
) -> None:
    # The production heartbeat (15 s by default) blocks longer than redis-py's own 5 s read
    # timeout; the stream must keep beating rather than go silent.
    edge = await sync_to_async(start_edge)(tmp_path, STREAM_HEARTBEAT_SECONDS="7")
    try:
        await sync_to_async(register_pool)()  # no worker: the generation waits
        turn = await sync_to_async(_send)(user)
        headers = await sync_to_async(bearer)(user)
        events = await collect(stream_url(edge, turn.generation.id), headers, until="comment")
        assert [e.event for e in events] == ["meta", "comment"]
        assert events[-1].comment == "heartbeat"
    finally:
        # Stopped, and its database sessions ended, before this test's flush.
        await sync_to_async(edge.stop)()
