from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings

from inference.models import ModelPool


@pytest.fixture(autouse=True)
def default_pool(db: Any) -> ModelPool:
    """The model every conversation here talks to (no worker: answers stay queued)."""
    pool, _ = ModelPool.objects.get_or_create(
        name=settings.DEFAULT_MODEL, defaults={"served_model": settings.DEFAULT_MODEL}
    )
    return pool
