from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings

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
