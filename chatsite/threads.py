"""Sync code of the edge's hot requests, run on a pool of threads instead of the one thread
Django gives each process's sync code.

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
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import markcoroutinefunction, sync_to_async
from django.conf import settings
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
