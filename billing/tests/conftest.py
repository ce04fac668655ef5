from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from django.conf import settings

from billing import quota
from conversations.models import Conversation
from conversations.services import conversation_create
from inference.models import ModelPool


@pytest.fixture
def pool(db: Any) -> ModelPool:
    """The model conversations talk to (no worker: answers stay queued until finished by
    hand with `generation_finish`, the scheduler's own call)."""
    pool, _ = ModelPool.objects.get_or_create(
        name=settings.DEFAULT_MODEL, defaults={"served_model": settings.DEFAULT_MODEL}
    )
    return pool


@pytest.fixture
def conversation(user: Any, pool: ModelPool) -> Conversation:
    return conversation_create(owner=user, model=pool.name)


@dataclass
class QuotaClock:
    """The quota's clock as a test holds it (epoch milliseconds)."""

    ms: int

    def advance(self, seconds: float) -> None:
        self.ms += int(seconds * 1000)


@pytest.fixture
def quota_clock(monkeypatch: pytest.MonkeyPatch) -> QuotaClock:
    """The quota's clock (`billing.quota.now_ms`, which every bucket, slot and cap reads)
    stopped at the time the test began: a bucket refills only when the test advances it, so
    what a test reads back after a send does not depend on how long the send took."""
    clock = QuotaClock(quota.now_ms())
    monkeypatch.setattr(quota, "now_ms", lambda: clock.ms)
    return clock
