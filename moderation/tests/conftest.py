"""Fixtures for moderation's tests: a model pool (no worker unless a test adds one) and a
conversation of `user` on it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections

from conversations.models import Conversation
from conversations.services import conversation_create
from inference.models import ModelPool


@pytest.fixture
def pool(db: Any) -> ModelPool:
    pool, _ = ModelPool.objects.get_or_create(
        name=settings.DEFAULT_MODEL, defaults={"served_model": settings.DEFAULT_MODEL}
    )
    return pool


@pytest.fixture
def conversation(user: Any, pool: ModelPool) -> Conversation:
    return conversation_create(owner=user, model=pool.name)


@pytest.fixture
def staff(db: Any) -> Any:
    from accounts.tests.factories import UserFactory

    return UserFactory(is_staff=True, is_superuser=True)


@pytest.fixture(autouse=True)
async def _close_thread_connections() -> AsyncIterator[None]:
    """Async tests reach the database from asgiref's worker thread; close its connection so
    the test database can be dropped at the end of the run."""
    yield
    await sync_to_async(connections.close_all)()
