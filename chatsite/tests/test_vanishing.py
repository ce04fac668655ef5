"""`unless_vanished`: a write whose parent went is a no-op; every other integrity error is
still raised, and the transaction around it checks its foreign keys as before."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import IntegrityError
from django.utils import timezone

from billing.models import UsageEvent
from chatsite.vanishing import unless_vanished
from inference.models import ModelPool

pytestmark = pytest.mark.django_db


def _event(**fields: Any) -> UsageEvent:
    values: dict[str, Any] = {
        "generation_id": uuid.uuid4(),
        "tier": "plus",
        "status": "complete",
        "prompt_tokens": 1,
        "output_tokens": 1,
        "cost_micros": 1,
        "occurred_at": timezone.now(),
        **fields,
    }
    return UsageEvent.objects.create(**values)


@pytest.fixture
def pool() -> ModelPool:
    return ModelPool.objects.create(name="vanishing-pool", served_model="fake")


def test_an_integrity_error_whose_parents_are_there_is_raised(user: Any, pool: ModelPool) -> None:
    first = _event(user=user, pool=pool)
    with (
        pytest.raises(IntegrityError),
        unless_vanished(UsageEvent, still_there=lambda: True, what="a duplicate"),
    ):
        _event(user=user, pool=pool, generation_id=first.generation_id)
    assert UsageEvent.objects.count() == 1


def test_a_write_pointing_at_a_deleted_row_writes_nothing(user: Any, pool: ModelPool) -> None:
    user_id = user.pk
    user.delete()
    with unless_vanished(UsageEvent, still_there=lambda: False, what="usage") as write:
        _event(user_id=user_id, pool=pool)
    assert write.vanished
    assert not UsageEvent.objects.exists()


def test_the_surrounding_transaction_checks_its_foreign_keys_at_commit_again(
    user: Any, pool: ModelPool
) -> None:
    """Within the block an insert is checked at once; after it, as Django set it up."""
    with unless_vanished(UsageEvent, still_there=lambda: True, what="usage") as write:
        _event(user=user, pool=pool)
    assert not write.vanished
    # Pointing nowhere is allowed until the commit again (the test's, which never comes).
    dangling = _event(user_id=user.pk + 1000, pool=pool)
    UsageEvent.objects.filter(pk=dangling.pk).delete()
    assert UsageEvent.objects.count() == 1
