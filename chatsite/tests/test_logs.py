"""Request ids at the edge, JSON log lines, and tracing left off without an endpoint
(chatsite/logs.py, chatsite/middleware.py, chatsite/tracing.py). A turn's ids and spans from
the edge to the worker: inference/tests/test_logs_and_traces.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from django.conf import settings
from django.test import AsyncClient, Client
from opentelemetry import trace

from chatsite import logs, tracing
from chatsite.testing import budget

NEW_ID = r"[0-9a-f]{32}"


SANE = "lb-7f3a.2026:edge_01"
MALFORMED = [None, "", "has spaces", "<script>", "x" * 129, "é"]


def _answer(response: Any) -> str:
    assert response.status_code == 401  # an answer of the API, in its own shape
    echoed: str = response["X-Request-Id"]
    return echoed


def _headers(sent: str | None) -> dict[str, str]:
    return {"X-Request-Id": sent} if sent is not None else {}


def _all_new(ids: list[str]) -> bool:
    return len(set(ids)) == len(ids) and all(re.fullmatch(NEW_ID, found) for found in ids)


async def test_a_sane_request_id_is_echoed_and_any_other_replaced(db: Any) -> None:
    client = AsyncClient()
    echoed = _answer(await client.get("/api/v1/conversations", headers=_headers(SANE)))
    assert echoed == SANE
    replaced = [
        _answer(await client.get("/api/v1/conversations", headers=_headers(sent)))
        for sent in MALFORMED
    ]
    assert _all_new(replaced)


async def test_djangos_line_for_an_error_answer_carries_the_request_id(
    db: Any, json_lines: Any
) -> None:
    """Django logs a 4xx or 5xx answer after the middleware returned: the id is still set."""
    response = await AsyncClient().get("/api/v1/conversations", headers=_headers(SANE))
    assert _answer(response) == SANE
    refused = [line for line in json_lines() if line["logger"] == "django.request"]
    assert [(line["message"], line["request_id"]) for line in refused] == [
        ("Unauthorized: /api/v1/conversations", SANE)
    ]


def test_a_synchronous_request_gets_its_id_too(db: Any) -> None:
    """The middleware's path without an event loop (WSGI, the test client)."""
    client = Client()
    assert _answer(client.get("/api/v1/conversations", headers=_headers(SANE))) == SANE
    replaced = [
        _answer(client.get("/api/v1/conversations", headers=_headers(sent))) for sent in MALFORMED
    ]
    assert _all_new(replaced)


def test_log_format_json_writes_lines_that_carry_the_ids(tmp_path: Any) -> None:
    """A process started with LOG_FORMAT=json (its settings, its handler) writes one JSON
    object a line, with the request id on every line and the generation id where known."""
    script = textwrap.dedent(
        """
        import logging
        import django
        django.setup()
        from chatsite import logs
        log = logging.getLogger("chatsite.example")
        log.warning("outside")
        with logs.bound(request="req-1", generation="gen-1"):
            log.warning("inside %s", "a run")
            try:
                raise ValueError("boom")
            except ValueError:
                log.exception("failed")
        """
    )
    env = {**os.environ, "LOG_FORMAT": "json", "DJANGO_SETTINGS_MODULE": "chatsite.settings"}
    done = subprocess.run(  # noqa: S603 (our own interpreter and script)
        [sys.executable, "-c", script],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=budget(120),  # the failure point only: a hung interpreter
        check=True,
    )
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.strip()]
    ours = [line for line in lines if line["logger"] == "chatsite.example"]
    assert [line["message"] for line in ours] == ["outside", "inside a run", "failed"]
    outside, inside, failed = ours
    assert outside["request_id"] is None and "generation_id" not in outside
    assert outside["level"] == "WARNING" and outside["time"]
    assert (inside["request_id"], inside["generation_id"]) == ("req-1", "gen-1")
    assert failed["request_id"] == "req-1" and "ValueError: boom" in failed["exc_info"]


def test_an_unknown_log_format_is_refused() -> None:
    with pytest.raises(ValueError, match="LOG_FORMAT"):
        logs.logging_config("xml", "INFO")


def test_without_an_endpoint_no_tracer_provider_is_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(tracing.ENDPOINT_VARIABLE, raising=False)
    tracing.configure("chatsite-test")
    assert not tracing.enabled()
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    with tracing.span("turn") as span:
        assert span is None
        assert trace.get_current_span() is trace.INVALID_SPAN
    assert tracing.traceparent() == ""
