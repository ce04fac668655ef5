"""Assertions the apps' tests share."""

from __future__ import annotations

from typing import Any


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
