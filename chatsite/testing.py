"""Assertions the apps' tests share, and the one way a test waits for something to happen.

A test never sleeps a fixed time for another process, thread or page to catch up, nor asserts
that something happened within a set time: it waits for the state itself (`wait_until`,
`wait_for`, Playwright's `expect`) within a budget. A budget is only the point where a wait
gives up and reports the failure: a wait that succeeds returns as soon as its state holds, so
budgets are set for a slow machine (two shared cores, one of them kept busy: `make
test-slow`), several times what a quiet machine needs, and cost a passing suite nothing.
`CHATSITE_TEST_BUDGET_SCALE` multiplies every budget, for a machine slower still.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

# What a wait gives up after unless it says otherwise (seconds, before the scale).
DEFAULT_BUDGET = 60.0


def budget(seconds: float) -> float:
    """`seconds` of waiting, scaled by `CHATSITE_TEST_BUDGET_SCALE` (1 unless set)."""
    return seconds * float(os.environ.get("CHATSITE_TEST_BUDGET_SCALE") or 1)


def wait_until(
    condition: Callable[[], T],
    *,
    within: float = DEFAULT_BUDGET,
    every: float = 0.05,
    what: str = "condition",
) -> T:
    """Call `condition` until it returns something truthy, and return that; fail the test
    if it has not within the budget `within` (scaled)."""
    deadline = time.monotonic() + budget(within)
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {budget(within):g} s")
        time.sleep(every)


async def wait_for(
    condition: Callable[[], Awaitable[Any]],
    *,
    within: float = DEFAULT_BUDGET,
    every: float = 0.05,
    what: str = "condition",
) -> None:
    """Await `condition` until it holds; fail the test if it has not within the budget
    `within` (scaled)."""
    try:
        async with asyncio.timeout(budget(within)):
            while not await condition():  # noqa: ASYNC110 (the condition lives in other processes)
                await asyncio.sleep(every)
    except TimeoutError:
        raise AssertionError(f"{what} not met within {budget(within):g} s") from None


def assert_error(response: Any, status: int, code: str) -> dict[str, Any]:
    """The response is our one error shape with `status` and `code`; returns its `error`."""
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "detail"}
    assert body["error"]["code"] == code
    assert body["error"]["message"]
    error: dict[str, Any] = body["error"]
    return error


def run_task_quietly(task: Any, *args: Any, caplog: pytest.LogCaptureFixture) -> Any:
    """Run a Celery task as a worker would, in this process, and return what it returned.

    Asserts that it succeeded the first time (no failure, no retry scheduled) and logged
    nothing at warning or above, nor any traceback: what a task whose rows vanished owes.
    """
    caplog.clear()
    caplog.set_level(logging.INFO)
    result = task.apply(args=args)
    assert result.state == "SUCCESS", (result.state, result.traceback)
    loud = [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert not loud, [record.getMessage() for record in loud]
    assert not [record for record in caplog.records if record.exc_info], "a traceback was logged"
    return result.result


def logged(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    """The messages `logger` wrote since the log was last cleared."""
    return [record.getMessage() for record in caplog.records if record.name == logger]
