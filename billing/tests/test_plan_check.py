"""Billing is the one judge of whether a plan may use a model: asked once per turn."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from billing import selectors
from billing.tests.factories import subscribe
from chatsite.catalog import catalog_changed
from conversations.services import conversation_create
from conversations.turns import turn_from_messages, turn_send
from inference.models import ModelPool

pytestmark = pytest.mark.django_db


@pytest.fixture
def judged(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The pools `plan_pool` (the plan-may-use-model check) was asked about."""
    asked: list[str] = []
    real = selectors.plan_pool

    def counting(*, plan: Any, pool: ModelPool) -> Any:
        asked.append(pool.name)
        return real(plan=plan, pool=pool)

    monkeypatch.setattr(selectors, "plan_pool", counting)
    return asked


def test_a_web_send_asks_whether_the_plan_may_use_the_model_once(
    user: User, pool: ModelPool, judged: list[str]
) -> None:
    subscribe(user)
    conversation = conversation_create(owner=user, model=pool.name)
    judged.clear()

    turn_send(user=user, conversation=conversation, content="Hello!")

    assert judged == [conversation.model]


def test_a_v1_request_asks_once_too(user: User, pool: ModelPool, judged: list[str]) -> None:
    subscribe(user)

    turn_from_messages(user=user, model=pool.name, system_prompt="", messages=[("user", "Hi")])

    assert judged == [pool.name]


def test_the_answer_budget_is_the_smallest_of_wish_plan_and_pool(
    user: User, pool: ModelPool
) -> None:
    subscribe(user, max_output_tokens=300)
    ModelPool.objects.filter(pk=pool.pk).update(max_output_tokens=200)
    catalog_changed()  # update() sends no signal

    wished_less = turn_from_messages(
        user=user, model=pool.name, system_prompt="", messages=[("user", "a")], max_tokens=50
    )
    wished_more = turn_from_messages(
        user=user, model=pool.name, system_prompt="", messages=[("user", "b")], max_tokens=5000
    )
    no_wish = turn_send(
        user=user, conversation=conversation_create(owner=user, model=pool.name), content="c"
    )

    assert [t.generation.max_tokens for t in (wished_less, wished_more, no_wish)] == [50, 200, 200]
