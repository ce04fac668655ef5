"""Log lines that say which request and which generation they belong to.

Two context variables hold the request id (set by the edge's `RequestIdMiddleware`, and by
the scheduler from the job the edge enqueued) and the generation id (set by the turn once its
generation exists, and by the scheduler around one generation's run). `ContextFilter`, on the
one console handler of `settings.LOGGING`, copies both onto every record, so a line logged
anywhere below them carries them without its call site saying so.

Context variables follow the work where it goes: into tasks created below them, and into the
threads `asgiref.sync_to_async` and `asyncio.to_thread` use (each copies the caller's context;
`chatsite.threads.in_thread` is one of those). Code that hands work to an executor itself
must copy the context too (`contextvars.copy_context().run`), as the scheduler's tool loop
does.

`LOG_FORMAT=json` writes one JSON object a line (python-json-logger), for a log collector:
`time`, `level`, `logger`, `message`, `request_id` (null outside any request or run),
`generation_id` where known, and a traceback as `exc_info`.
"""

from __future__ import annotations

import contextlib
import logging
import re
import uuid
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter as _JsonFormatter

request_id: ContextVar[str | None] = ContextVar("request_id", default=None)
generation_id: ContextVar[str | None] = ContextVar("generation_id", default=None)

# What the edge accepts as a caller's `X-Request-Id` (a proxy's, a client's): short, and
# only characters that pass unchanged through a header, a log line and vLLM's request id.
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")

FORMATS = ("text", "json")


def accepted_request_id(incoming: str | None) -> str:
    """The caller's request id if it is sane, else a new one."""
    if incoming and _REQUEST_ID.fullmatch(incoming):
        return incoming
    return uuid.uuid4().hex


@contextlib.contextmanager
def bound(*, request: str | None, generation: str | None) -> Iterator[None]:
    """Log lines within carry `request` and `generation` (None: not known)."""
    request_token = request_id.set(request)
    generation_token = generation_id.set(generation)
    try:
        yield
    finally:
        generation_id.reset(generation_token)
        request_id.reset(request_token)


class ContextFilter(logging.Filter):
    """Puts the current request id and generation id on each record (never drops one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        generation = generation_id.get()
        if generation is not None:
            record.generation_id = generation
        return True


class JsonFormatter(_JsonFormatter):
    """A record as one line of JSON; its extra attributes (the context's ids, a call's
    `extra=`) become fields of their own."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(
            "{asctime}{levelname}{name}{message}",
            style="{",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            # uvicorn's copy of its message with terminal colours.
            reserved_attrs=[*RESERVED_ATTRS, "color_message"],
            **kwargs,
        )


def logging_config(log_format: str, level: str) -> dict[str, Any]:
    """`settings.LOGGING`: one console handler, text or JSON lines, with the context's ids."""
    if log_format not in FORMATS:
        raise ValueError(f"LOG_FORMAT must be one of {', '.join(FORMATS)}, not {log_format!r}")
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"context": {"()": ContextFilter}},
        "formatters": {
            "text": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
            "json": {"()": JsonFormatter},
        },
        "handlers": {
            "console": {
                "class": "logging.StreamHandler",
                "formatter": log_format,
                "filters": ["context"],
            }
        },
        "root": {"handlers": ["console"], "level": level},
    }
