"""django-ratelimit's window held still for a test that counts requests against a limit."""

from __future__ import annotations

import time

import pytest
from django_ratelimit import core


def one_ratelimit_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every request of the test counts in one django-ratelimit window.

    Its windows are fixed buckets of the wall clock (`core._get_window`): one that ends
    between two of a test's requests resets the count, whatever the rate (an hourly one too,
    if rarely), and the slower the machine the likelier. Held here, the window ends a period
    after the test began, so Retry-After still counts down on the real clock; and a counter
    lives an hour past its period in Redis instead of five seconds, so that it is not lost
    however long the test takes between its requests (each test starts on an emptied Redis).
    """
    began = int(time.time())
    monkeypatch.setattr(core, "_get_window", lambda value, period: began + period)
    monkeypatch.setattr(core, "EXPIRATION_FUDGE", 3600)
