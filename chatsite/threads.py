"""Sync code of the edge's hot requests, run on a pool of threads instead of the one thread
Django gives each process's sync code; and the threads of requests' thread-sensitive code,
reused (`EdgeHandler`).

Under ASGI, Django runs every sync view and every `sync_to_async` call of a process on one
thread, so that thread-bound code (a database connection) behaves as under WSGI. Sends that
arrive at once then queue behind each other, their waits on Postgres and Redis included (32
at once: the last answered after the other 31). Here such code runs on the event loop's
pool of threads instead, each thread with a database connection of its own from the process's
pool, given back as the call ends (`settings.EDGE_SYNC_THREADS`; off, the one thread as
before).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any, TypeVar

from asgiref.sync import (
    SyncToAsync,
    ThreadSensitiveContext,
    markcoroutinefunction,
    sync_to_async,
)
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
from django.db import connections
from django.http import HttpRequest, HttpResponseBase

T = TypeVar("T")


async def in_thread(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`function(*args, **kwargs)` off the event loop: on the pool (`EDGE_SYNC_THREADS`), with
    its own connection given back at the end; else on the process's one sync thread."""
    if not settings.EDGE_SYNC_THREADS:
        return await sync_to_async(function)(*args, **kwargs)

    def call() -> T:
        try:
            return function(*args, **kwargs)
        finally:
            connections.close_all()

    return await sync_to_async(call, thread_sensitive=False)()


def threaded_view(view: Callable[..., HttpResponseBase]) -> Callable[..., Any]:
    """An async view that runs the sync `view` with `in_thread`. Its attributes come along
    (a DRF view's `csrf_exempt`: DRF checks CSRF itself, for session callers)."""

    def rendered(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        response = view(request, *args, **kwargs)
        render = getattr(response, "render", None)
        if callable(render):
            # Here too (a DRF response renders lazily), not later on the one sync thread.
            render()
        return response

    @functools.wraps(view)
    async def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        return await in_thread(rendered, request, *args, **kwargs)

    markcoroutinefunction(wrapped)
    return wrapped


class RequestThreads:
    """Single-thread executors for requests' thread-sensitive code, lent one per request and
    taken back at its end (at most `keep` wait idle)."""

    def __init__(self, keep: int = 64) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._idle: list[ThreadPoolExecutor] = []
        self._lent: set[ThreadPoolExecutor] = set()

    def lend(self) -> ThreadPoolExecutor:
        with self._lock:
            executor = (
                self._idle.pop()
                if self._idle
                else ThreadPoolExecutor(max_workers=1, thread_name_prefix="request")
            )
            self._lent.add(executor)
        return executor

    def lent(self, executor: object) -> bool:
        with self._lock:
            return executor in self._lent

    def give_back(self, executor: ThreadPoolExecutor) -> None:
        """Take `executor` back (once: a second call does nothing)."""
        with self._lock:
            if executor not in self._lent:
                return
            self._lent.discard(executor)
            if len(self._idle) < self.keep:
                self._idle.append(executor)
                return
        executor.shutdown(wait=False)


REQUEST_THREADS = RequestThreads()


class LateThread(Executor):
    """Stands in the place of a request's executor once a streaming response has given it
    back (`chatsite.sse.release_request_thread`): what sync code the request still runs
    (Django closing the response at its end) borrows a thread from `REQUEST_THREADS` only
    then, instead of asgiref starting a thread for it and another to join that one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._borrowed: ThreadPoolExecutor | None = None

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        with self._lock:
            if self._borrowed is None:
                self._borrowed = REQUEST_THREADS.lend()
            borrowed = self._borrowed
        return borrowed.submit(fn, *args, **kwargs)

    def give_back(self) -> None:
        """Return the thread it borrowed, if it borrowed one."""
        with self._lock:
            borrowed, self._borrowed = self._borrowed, None
        if borrowed is not None:
            REQUEST_THREADS.give_back(borrowed)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.give_back()


class EdgeHandler(ASGIHandler):
    """Django's ASGI handler, its requests' thread-sensitive code on reused threads.

    Django runs each request in a `ThreadSensitiveContext`, whose synchronous code (the
    request signals' receivers, a sync view, `sync_to_async` calls) goes to a thread of its
    own: asgiref started one per request, and at the request's end another to wait for it to
    end, each start holding up the event loop until the new thread ran (9% of an edge's
    samples at 32 streams). Here a request borrows an idle thread (`RequestThreads`), still
    one request's code at a time, and gives it back at its end; a streaming response gives
    it back as soon as it needs no more of it (`chatsite.sse.release_request_thread`).

    The context is asgiref's usual one, its executor put in asgiref's table on entry and
    taken out before the exit (which would shut it down): code the request left running (a
    shielded clean-up) that calls sync code later gets a new thread, as with asgiref's own.
    """

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        context = ThreadSensitiveContext()
        async with context:
            executor = REQUEST_THREADS.lend()
            SyncToAsync.context_to_thread_executor[context] = executor
            try:
                await self.handle(scope, receive, send)
            finally:
                # Ours, or the stand-in a streaming response left when it gave ours back
                # early (it may be another request's by now); out of asgiref's table, so
                # that the context's exit joins no thread.
                current = SyncToAsync.context_to_thread_executor.get(context)
                if current is executor:
                    del SyncToAsync.context_to_thread_executor[context]
                    REQUEST_THREADS.give_back(executor)
                elif isinstance(current, LateThread):
                    del SyncToAsync.context_to_thread_executor[context]
                    current.give_back()
