"""A real Celery worker for the tests: the project's app, a real Redis broker, the test database.

The worker runs in a thread of the test process (`celery.contrib.testing.worker.start_worker`,
solo pool), so it sees the test database and the settings a test changes. Its broker is a
Redis database of its own: the suite flushes REDIS_URL's database before every test, which
would take kombu's queue bindings with it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit
from uuid import uuid4

import pytest
from celery.contrib.testing.worker import start_worker
from celery.signals import task_postrun
from django.conf import settings
from django.db import connections

from chatsite.celery import app
from chatsite.testing import DEFAULT_BUDGET, budget
from chatsite.testing import wait_until as wait_until  # where the Celery tests import it from


def broker_url_for_tests() -> str:
    """CELERY_BROKER_URL if it is not REDIS_URL's database, else the next database number."""
    if settings.CELERY_BROKER_URL.rstrip("/") != settings.REDIS_URL.rstrip("/"):
        return str(settings.CELERY_BROKER_URL)
    parts = urlsplit(settings.REDIS_URL)
    db = int(parts.path.strip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{(db + 1) % 16}"))


def _use_broker(url: str) -> None:
    app.conf.broker_url = url
    app.conf.result_backend = url
    # The app keeps its broker connections and producers: start new ones on the new URL.
    app._after_fork()


def _close_connections(**_: Any) -> None:
    # Runs in the worker's thread after each task: the test database must not see an
    # idle connection left open when it is flushed or dropped.
    connections.close_all()


@pytest.fixture
def live_celery_worker(transactional_db: Any, django_db_blocker: Any) -> Iterator[Any]:
    """A worker consuming the project's tasks during one test.

    It runs for one test, not for a module: a worker that outlived the test could be in the
    middle of a task (a title, a summary, a sweep) when the test database is flushed. This
    fixture requests `transactional_db` (the worker reads only what the test committed), so
    pytest runs its teardown first: the worker stops after its current task and its thread is
    joined (`start_worker` raises if it does not end in time), then the flush. What was still
    queued or waiting for a retry is purged when the next worker starts.
    """
    previous = (app.conf.broker_url, app.conf.result_backend)
    _use_broker(broker_url_for_tests())
    app.control.purge()  # tasks other tests queued with no worker running
    task_postrun.connect(_close_connections, weak=False)
    try:
        with (
            django_db_blocker.unblock(),
            start_worker(
                app,
                pool="solo",
                concurrency=1,
                perform_ping_check=False,
                shutdown_timeout=budget(60),
            ) as worker,
        ):
            yield worker
    finally:
        task_postrun.disconnect(_close_connections)
        app.conf.broker_url, app.conf.result_backend = previous
        app._after_fork()


def wait_for_queued_tasks(*, within: float = DEFAULT_BUDGET) -> None:
    """Return once the test's worker has run every task queued before this call.

    The worker takes the one queue's tasks one at a time in the order they were queued (solo
    pool, prefetch 1, a Redis list), so a marker task queued now runs only after all of them
    have ended. A test that checks that something was *not* asked of the worker waits for
    this, the event that makes its check meaningful, instead of sleeping.
    """
    marker = uuid4().hex
    ran = threading.Event()

    def _note(task_id: str | None = None, **_: Any) -> None:
        if task_id == marker:
            ran.set()

    task_postrun.connect(_note, weak=False)
    try:
        app.send_task("celery.accumulate", args=("marker",), task_id=marker)
        wait_until(ran.is_set, within=within, what="the worker running the tasks queued before")
    finally:
        task_postrun.disconnect(_note)
