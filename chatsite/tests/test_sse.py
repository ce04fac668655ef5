"""The one SSE helper: headers, wire format, Last-Event-ID, and the tail over a Redis Stream."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.test import RequestFactory
from redis.asyncio import Redis as AsyncRedis

from chatsite import sse
from chatsite.redis import async_redis
from chatsite.stream_events import StreamEvent, entry_fields
from chatsite.testing import budget, wait_for

STREAM = "test:sse"


@pytest.fixture
def no_heartbeat(settings: Any) -> None:
    """No heartbeat comes between what a test reads, however slow the machine: an hour."""
    settings.STREAM_HEARTBEAT_SECONDS = 3600
    settings.STREAM_RETRY_MS = 1234


@pytest.fixture
def fast_heartbeat(settings: Any) -> None:
    """A heartbeat after each second without an entry (one may come before any entry the
    test waits for, on a slow machine)."""
    settings.STREAM_HEARTBEAT_SECONDS = 1
    settings.STREAM_RETRY_MS = 1234


@pytest.fixture
async def redis() -> AsyncIterator[AsyncRedis]:
    client = async_redis()
    yield client
    await client.aclose()


async def _add(redis: AsyncRedis, event: StreamEvent, data: dict[str, Any]) -> str:
    return str(await redis.xadd(STREAM, entry_fields(event, data)))


async def _empty() -> AsyncIterator[bytes]:
    yield b""


async def _past_heartbeats(items: Any, heartbeat: Any) -> Any:
    """The next item of `items` that is not `heartbeat` (with a one-second heartbeat, a slow
    machine may see some first); fails the test if none comes within the budget."""
    async with asyncio.timeout(budget(60)):
        item = await anext(items)
        while item == heartbeat:
            item = await anext(items)
    return item


def test_the_response_is_an_unbuffered_event_stream() -> None:
    response = sse.sse_response(_empty())

    assert response["Content-Type"] == "text/event-stream"
    assert response["Cache-Control"] == "no-cache"
    assert response["X-Accel-Buffering"] == "no"


def test_an_events_id_comes_last() -> None:
    assert sse.format_event("5-1", StreamEvent.DELTA, '{"text": "hi"}') == (
        b'event: delta\ndata: {"text": "hi"}\nid: 5-1\n\n'
    )


@pytest.mark.parametrize(
    ("headers", "query", "expected"),
    [
        ({}, "", ""),
        ({"HTTP_LAST_EVENT_ID": "17-3"}, "", "17-3"),
        ({}, "?last_event_id=17-4", "17-4"),
        ({"HTTP_LAST_EVENT_ID": "17-3"}, "?last_event_id=17-4", "17-3"),  # the header wins
    ],
)
def test_the_last_event_id(headers: dict[str, str], query: str, expected: str) -> None:
    request = RequestFactory().get(f"/{query}", **headers)  # type: ignore[arg-type]

    assert sse.last_event_id(request) == expected


@pytest.mark.parametrize("given", ["x", "17", "17-", "-3", "1-2-3", "1" * 21 + "-0"])
def test_a_last_event_id_that_is_no_entry_id_is_refused(given: str) -> None:
    request = RequestFactory().get("/", HTTP_LAST_EVENT_ID=given)

    with pytest.raises(sse.InvalidEventId):
        sse.last_event_id(request)


async def test_the_tail_relays_from_after_the_last_id_to_the_terminal_event(
    redis: AsyncRedis, no_heartbeat: None
) -> None:
    first = await _add(redis, StreamEvent.META, {"status": "queued"})
    second = await _add(redis, StreamEvent.DELTA, {"text": "a"})
    done = await _add(redis, StreamEvent.DONE, {"status": "complete"})
    await _add(redis, StreamEvent.DELTA, {"text": "after the end"})
    tail = sse.Tail(STREAM, first)

    chunks = [chunk async for chunk in tail.events()]

    assert chunks == [
        b"retry: 1234\n\n",
        sse.format_event(second, "delta", '{"text": "a"}'),
        sse.format_event(done, "done", '{"status": "complete"}'),
    ]
    assert tail.finished


async def test_the_tail_beats_while_nothing_happens(
    redis: AsyncRedis, fast_heartbeat: None
) -> None:
    tail = sse.Tail(STREAM, "0-0")

    async with contextlib.aclosing(tail.events()) as events:
        assert await anext(events) == b"retry: 1234\n\n"
        assert await anext(events) == sse.HEARTBEAT  # nothing was added: only a heartbeat
        entry_id = await _add(redis, StreamEvent.DELTA, {"text": "b"})
        assert await _past_heartbeats(events, sse.HEARTBEAT) == sse.format_event(
            entry_id, "delta", '{"text": "b"}'
        )

    assert not tail.finished


async def test_a_stream_without_a_terminal_event_goes_on(
    redis: AsyncRedis, fast_heartbeat: None
) -> None:
    await _add(redis, StreamEvent.DONE, {})
    entries = sse.read(STREAM, "0-0", until=())

    async with contextlib.aclosing(entries):
        done = await _past_heartbeats(entries, None)
        assert done is not None and done.event == "done" and done.payload() == {}
        assert await anext(entries) is None  # a heartbeat period, not the end


async def test_a_redis_failure_ends_the_response(no_heartbeat: None, settings: Any) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nobody listens there
    tail = sse.Tail(STREAM, "0-0")

    chunks = [chunk async for chunk in tail.events()]

    assert chunks == [b"retry: 1234\n\n"]  # the client reconnects with Last-Event-ID
    assert not tail.finished


async def test_a_tailing_response_lets_its_request_thread_go() -> None:
    # As Django runs a request: its synchronous code on the thread of the request's context.
    async with ThreadSensitiveContext():
        request_thread = await sync_to_async(threading.current_thread)()
        assert request_thread.is_alive()
        sse.release_request_thread()

        async def ended() -> bool:
            return not request_thread.is_alive()

        # The thread ends once it sees the shutdown.
        await wait_for(ended, every=0.01, what="the request thread ended")
        # Synchronous code the response still runs gets a thread of its own.
        later = await sync_to_async(threading.current_thread)()
        assert later is not request_thread and later is not threading.main_thread()


async def test_a_context_whose_executor_its_creator_owns_keeps_it() -> None:
    with ThreadPoolExecutor(max_workers=1) as executor:
        async with ThreadSensitiveContext(executor=executor):
            first = await sync_to_async(threading.current_thread)()
            sse.release_request_thread()
            assert await sync_to_async(threading.current_thread)() is first
