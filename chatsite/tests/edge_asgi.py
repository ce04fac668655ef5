"""The project's ASGI application as the suite's live edge serves it, counting what is in flight.

A request the client has left goes on running in the edge: a stream whose last watcher hangs
up before the first token cancels its generation there, after the client is gone. The edge is
one process for the whole session, so that write can land while pytest-django truncates the
test database at the end of the test, and the two deadlock. The live edge fixture
(`inference/tests/fixtures.py`) asks `IN_FLIGHT_PATH` before the flush and waits for 0.

Only the suite serves this module (`python -m chatsite.edge --application
chatsite.tests.edge_asgi:application`). The project's application is built when the server
asks for `application`, not on import: the test
process imports this module for `IN_FLIGHT_PATH` and has Django set up already.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import json
import os
from typing import Any

IN_FLIGHT_PATH = "/__tests__/in-flight"
# Where each asyncio task of the edge is waiting, for the failure message of a teardown whose
# edge does not go idle (a thread dump cannot show a task parked on a future).
TASKS_PATH = "/__tests__/tasks"
# Responses that write nothing once they have started: the user's event stream reads Redis
# only, and closes its database connections before its first byte. They are not waited for
# (a page's event stream may take a while to notice that its page closed), only reported.
NO_WRITES_ONCE_STARTED = frozenset({"/api/v1/events/stream"})
# Seconds the edge takes to notice a client left, to show that the suite waits for what a
# request does after it (chatsite/tests/test_teardown_order.py); 0 in every other edge.
DISCONNECT_DELAY_ENV = "CHATSITE_TEST_EDGE_DISCONNECT_DELAY"


class InFlightCounter:
    """Wraps an ASGI application; counts the connections it has not finished handling that
    may still write (all but `NO_WRITES_ONCE_STARTED`)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.in_flight = 0
        # What is in flight, for the failure message of a teardown that waits too long.
        self.paths: collections.Counter[str] = collections.Counter()
        self.disconnect_delay = float(os.environ.get(DISCONNECT_DELAY_ENV, "0"))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] == "http" and scope["path"] == IN_FLIGHT_PATH:
            await self._respond(send, "application/json", json.dumps(self._report()))
            return
        if scope["type"] == "http" and scope["path"] == TASKS_PATH:
            await self._respond(send, "text/plain", tasks_report())
            return
        path = f"{scope['type']} {scope.get('path', '')}"
        self.paths[path] += 1
        counted = scope.get("path") not in NO_WRITES_ONCE_STARTED
        self.in_flight += counted
        if self.disconnect_delay:
            receive = self._delay_disconnect(receive)
        # The count drops when the application's own task is done, not when this call
        # returns: a server may cancel a call whose client left, and the application then still
        # runs its `finally` blocks (and the threads they wait on) before it is done.
        task = asyncio.ensure_future(self.app(scope, receive, send))
        task.add_done_callback(lambda _: self._finished(path, counted))
        await task

    def _delay_disconnect(self, receive: Any) -> Any:
        async def delayed() -> dict[str, Any]:
            message: dict[str, Any] = await receive()
            if message["type"] in {"http.disconnect", "websocket.disconnect"}:
                # The slowness under test (an edge late to notice), not a wait: the suite waits
                # for the edge to go idle, however long this and the machine take.
                await asyncio.sleep(self.disconnect_delay)
            return message

        return delayed

    def _finished(self, path: str, counted: bool) -> None:
        self.in_flight -= counted
        self.paths[path] -= 1
        if not self.paths[path]:
            del self.paths[path]

    def _report(self) -> dict[str, Any]:
        return {"in_flight": self.in_flight, "paths": dict(self.paths)}

    @staticmethod
    async def _respond(send: Any, content_type: str, body: str) -> None:
        headers = [(b"content-type", content_type.encode()), (b"cache-control", b"no-store")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body.encode()})


def tasks_report() -> str:
    """Every task of the running loop with the chain of what it awaits, innermost last."""
    lines = []
    for task in asyncio.all_tasks():
        lines.append(f"{task.get_name()}:")
        lines.extend(f"    {step}" for step in awaited_chain(task.get_coro()))
    return "\n".join(lines) + "\n"


def awaited_chain(awaitable: Any) -> list[str]:
    """The frames from a coroutine down to the future it is parked on. An async generator's
    `asend` object names its generator only to the garbage collector, so that is asked."""
    steps: list[str] = []
    seen = 0
    while awaitable is not None and seen < 64:
        seen += 1
        frame = next(
            (
                getattr(awaitable, name)
                for name in ("cr_frame", "ag_frame", "gi_frame")
                if getattr(awaitable, name, None) is not None
            ),
            None,
        )
        if frame is not None:
            code = frame.f_code
            steps.append(f"{code.co_filename}:{frame.f_lineno} in {code.co_name}")
        inner = next(
            (
                getattr(awaitable, name)
                for name in ("cr_await", "ag_await", "gi_yieldfrom")
                if getattr(awaitable, name, None) is not None
            ),
            None,
        )
        if inner is None and frame is None:
            # An `asend`/`athrow` object, or a future.
            referents = [r for r in gc.get_referents(awaitable) if hasattr(r, "ag_frame")]
            if referents:
                inner = referents[0]
            else:
                steps.append(f"awaiting {awaitable!r}"[:300])
        awaitable = inner
    return steps


def __getattr__(name: str) -> Any:
    if name != "application":
        raise AttributeError(name)
    from chatsite.asgi import application as project_application

    return InFlightCounter(project_application)
