"""The edge's handler (chatsite.threads.EdgeHandler): each request's thread-sensitive code on a
thread of its own, reused by the next request instead of a new thread per request, and given
back early by a streaming response."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from asgiref.sync import SyncToAsync, ThreadSensitiveContext, sync_to_async
from django.core.signals import request_started

from chatsite import sse
from chatsite.testing import budget
from chatsite.threads import REQUEST_THREADS, EdgeHandler


@pytest.fixture
def request_threads() -> Iterator[list[threading.Thread]]:
    """The thread that ran each request's synchronous code (its `request_started`
    receivers, run by Django in the request's thread-sensitive context)."""
    seen: list[threading.Thread] = []

    def record(**_: Any) -> None:
        seen.append(threading.current_thread())

    request_started.connect(record, dispatch_uid="test-request-threads")
    yield seen
    request_started.disconnect(dispatch_uid="test-request-threads")


async def get(app: EdgeHandler, path: str = "/nowhere/") -> int:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"localhost")],
        "client": ("127.0.0.1", 50000),
        "server": ("localhost", 80),
    }
    body = [{"type": "http.request", "body": b"", "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if body:
            return body.pop()
        await asyncio.Future()  # the client never leaves; the handler stops listening
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return int(sent[0]["status"])


async def test_requests_in_turn_reuse_one_thread(request_threads: list[threading.Thread]) -> None:
    app = EdgeHandler()
    assert await get(app) == 404
    assert await get(app) == 404
    assert await get(app) == 404
    first, *others = request_threads
    assert first is not threading.main_thread()
    assert all(thread is first for thread in others)


async def test_requests_at_once_each_have_a_thread(
    request_threads: list[threading.Thread],
) -> None:
    app = EdgeHandler()
    # The budget is only the failure point: two threads meet at once, one thread never.
    both_inside = threading.Barrier(2, timeout=budget(30))

    def meet(**_: Any) -> None:
        both_inside.wait()  # would time out if the two shared a thread

    request_started.connect(meet, dispatch_uid="test-meet")
    try:
        assert await asyncio.gather(get(app), get(app)) == [404, 404]
    finally:
        request_started.disconnect(dispatch_uid="test-meet")
    assert len(set(request_threads)) == 2


async def test_a_streaming_response_gives_its_thread_back_early() -> None:
    # As the handler sets up a request: asgiref's context, with a lent executor.
    executor = REQUEST_THREADS.lend()
    context = ThreadSensitiveContext()
    try:
        async with context:
            SyncToAsync.context_to_thread_executor[context] = executor
            request_thread = await sync_to_async(threading.current_thread)()
            sse.release_request_thread()
            assert not REQUEST_THREADS.lent(executor)
            # The next request may have it now; this response's later code gets another.
            assert REQUEST_THREADS.lend() is executor
            later = await sync_to_async(threading.current_thread)()
            assert later is not request_thread and later is not threading.main_thread()
        assert request_thread.is_alive()  # kept for reuse, not shut down
    finally:
        REQUEST_THREADS.give_back(executor)


async def test_code_a_request_leaves_running_may_still_call_sync_code() -> None:
    app = EdgeHandler()
    later: list[asyncio.Task[threading.Thread]] = []
    request_over = asyncio.Event()

    async def after_the_request() -> threading.Thread:
        await request_over.wait()
        return await sync_to_async(threading.current_thread)()

    # A task started inside a request (it inherits the request's context) that outlives it.
    async def start_inside(**_: Any) -> None:
        later.append(asyncio.ensure_future(after_the_request()))

    request_started.connect(start_inside, dispatch_uid="test-leave")
    try:
        assert await get(app) == 404
    finally:
        request_started.disconnect(dispatch_uid="test-leave")
    assert not later[0].done()  # still waiting: it runs its sync code after the request
    request_over.set()
    thread = await asyncio.wait_for(later[0], timeout=budget(30))
    assert thread is not threading.main_thread()


async def test_a_thread_given_back_early_is_not_given_back_again() -> None:
    app = EdgeHandler()
    lent: list[object] = []

    async def stream_like(**_: Any) -> None:
        # What a streaming response does once its sync work is done.
        context = SyncToAsync.thread_sensitive_context.get()
        lent.append(SyncToAsync.context_to_thread_executor[context])
        sse.release_request_thread()
        # Another request borrows the thread meanwhile.
        lent.append(REQUEST_THREADS.lend())

    request_started.connect(stream_like, dispatch_uid="test-early")
    try:
        assert await get(app) == 404
    finally:
        request_started.disconnect(dispatch_uid="test-early")
    released, borrowed = lent
    assert borrowed is released
    # The first request's end left it with its new borrower.
    assert REQUEST_THREADS.lent(borrowed)
    REQUEST_THREADS.give_back(borrowed)  # type: ignore[arg-type]


async def test_sync_code_after_an_early_give_back_borrows_a_thread_and_starts_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = EdgeHandler()
    # Django logs each 404 on the loop's default executor, which starts another thread when
    # the last call's has not yet marked itself idle (the slower the machine, the likelier):
    # one thread here, started by the first request, so that only the request's own threads
    # are counted.
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))

    def give_back_early(**_: Any) -> None:
        # As a streaming response does; the rest of the request (resolving the view, Django
        # closing the response) still runs sync code in the request's context.
        sse.release_request_thread()

    request_started.connect(give_back_early, dispatch_uid="test-late")
    try:
        assert await get(app) == 404  # the threads it needs exist from here on
        started: list[threading.Thread] = []
        start = threading.Thread.start

        def counted(thread: threading.Thread) -> None:
            started.append(thread)
            start(thread)

        monkeypatch.setattr(threading.Thread, "start", counted)
        assert await get(app) == 404
        assert await get(app) == 404
    finally:
        request_started.disconnect(dispatch_uid="test-late")
    # asgiref started one for the code after the give-back, and one to join it, each time.
    assert started == []
