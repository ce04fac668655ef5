"""Assertions the apps' tests share."""

from __future__ import annotations

import logging
from typing import Any

import pytest


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
