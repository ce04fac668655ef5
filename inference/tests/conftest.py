"""Fixtures for this directory only; the shared ones live in fixtures.py (a suite-wide plugin).

An autouse async fixture must not be suite-wide: the browser tests run Playwright's sync API,
which keeps its own event loop running in the main thread.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from asgiref.sync import sync_to_async
from django.db import connections


@pytest.fixture(autouse=True)
async def _close_thread_connections() -> AsyncIterator[None]:
    """Async tests reach the database from asgiref's worker thread; close its connection
    so the test database can be dropped at the end of the run."""
    yield
    await sync_to_async(connections.close_all)()
