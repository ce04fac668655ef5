"""Health and readiness, as the edge and the scheduler report them (`/healthz`, `/readyz`).

`/healthz` says the process answers at all (a liveness probe: restart it if not). `/readyz`
runs the process's checks at once, each within `READY_CHECK_SECONDS`, and says which fail:
200 with every check `ok`, else 503 with `failing` naming them, never a 500. The body is one
shape for both processes:

    {"status": "ready" | "unavailable", "checks": {"<name>": "ok" | "<why>"}, "failing": [...]}

A check is an async function that returns None when all is well and a sentence when not; one
that raises or runs out of time fails with what it raised.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from django.db import connections

from chatsite.redis import async_redis

logger = logging.getLogger(__name__)

# Each readiness check gets this long; a store that hangs fails it (a probe's own timeout is
# usually a few seconds).
READY_CHECK_SECONDS = 2.0

Check = Callable[[], Awaitable[str | None]]


def alive() -> tuple[int, dict[str, Any]]:
    """`/healthz`: the process answers."""
    return 200, {"status": "ok"}


async def readiness(checks: Mapping[str, Check]) -> tuple[int, dict[str, Any]]:
    """`/readyz`: the status and body of running `checks` at once."""
    names = list(checks)
    results = await asyncio.gather(*(_run(checks[name]) for name in names))
    outcome = dict(zip(names, results, strict=True))
    failing = [name for name, why in outcome.items() if why is not None]
    body = {
        "status": "unavailable" if failing else "ready",
        "checks": {name: why or "ok" for name, why in outcome.items()},
        "failing": failing,
    }
    return (503 if failing else 200), body


async def _run(check: Check) -> str | None:
    try:
        return await asyncio.wait_for(check(), READY_CHECK_SECONDS)
    except TimeoutError:
        return f"no answer within {READY_CHECK_SECONDS:g} s"
    except Exception as exc:
        logger.warning("readiness check %s failed", check.__name__, exc_info=True)
        return f"{type(exc).__name__}: {exc}"[:300]


def without_reasons(body: Mapping[str, Any]) -> dict[str, Any]:
    """`body` for a client outside the operators' networks: which checks fail, not why (a
    reason may name an internal host or port)."""
    checks = {name: "ok" if why == "ok" else "failing" for name, why in body["checks"].items()}
    return {**body, "checks": checks}


def json_body(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def database_check(read: Callable[[], str | None]) -> Check:
    """A check that runs `read` (database reads; None or why not) in a thread of its own,
    since Django's database calls block, and gives its connection back after."""

    def in_thread() -> str | None:
        try:
            return read()
        finally:
            connections.close_all()

    async def check() -> str | None:
        return await asyncio.to_thread(in_thread)

    check.__name__ = read.__name__
    return check


def _select_one() -> None:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT 1")


# The database answers a query.
database_answers = database_check(_select_one)


async def redis_answers() -> str | None:
    """Redis answers a PING, on a connection of its own (so a pool's waiters do not hide it)."""
    redis = async_redis(
        socket_connect_timeout=READY_CHECK_SECONDS, socket_timeout=READY_CHECK_SECONDS
    )
    try:
        await redis.ping()
    finally:
        await redis.aclose()
    return None
