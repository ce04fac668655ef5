"""The project's ASGI application as the suite's live edge serves it, counting what is in flight.

A request the client has left goes on running in the edge: a stream whose last watcher hangs
up before the first token cancels its generation there, after the client is gone. The edge is
one process for the whole session, so that write can land while pytest-django truncates the
test database at the end of the test, and the two deadlock. The live edge fixture
(`inference/tests/fixtures.py`) asks `IN_FLIGHT_PATH` before the flush and waits for 0.

Only the suite serves this module (`daphne chatsite.tests.edge_asgi:application`). The
project's application is built when Daphne asks for `application`, not on import: the test
process imports this module for `IN_FLIGHT_PATH` and has Django set up already.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
from typing import Any

IN_FLIGHT_PATH = "/__tests__/in-flight"
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
            await self._report(send)
            return
        path = f"{scope['type']} {scope.get('path', '')}"
        self.paths[path] += 1
        counted = scope.get("path") not in NO_WRITES_ONCE_STARTED
        self.in_flight += counted
        if self.disconnect_delay:
            receive = self._delay_disconnect(receive)
        # The count drops when the application's own task is done, not when this call
        # returns: Daphne may cancel a call whose client left, and the application then still
        # runs its `finally` blocks (and the threads they wait on) before it is done.
        task = asyncio.ensure_future(self.app(scope, receive, send))
        task.add_done_callback(lambda _: self._finished(path, counted))
        await task

    def _delay_disconnect(self, receive: Any) -> Any:
        async def delayed() -> dict[str, Any]:
            message: dict[str, Any] = await receive()
            if message["type"] in {"http.disconnect", "websocket.disconnect"}:
                await asyncio.sleep(self.disconnect_delay)
            return message

        return delayed

    def _finished(self, path: str, counted: bool) -> None:
        self.in_flight -= counted
        self.paths[path] -= 1
        if not self.paths[path]:
            del self.paths[path]

    async def _report(self, send: Any) -> None:
        body = json.dumps({"in_flight": self.in_flight, "paths": dict(self.paths)}).encode()
        headers = [(b"content-type", b"application/json"), (b"cache-control", b"no-store")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def __getattr__(name: str) -> Any:
    if name != "application":
        raise AttributeError(name)
    from chatsite.asgi import application as project_application

    return InFlightCounter(project_application)
