"""Answers are embedded for `conversation_search` only where the index is likely to be asked:
a web conversation whose owner may call the tool. Others are indexed when searched."""

from __future__ import annotations

from typing import Any

import pytest

from conversations.models import Conversation
from inference import services
from inference.models import Generation
from inference.tests.fixtures import register_pool, send_turn
from plugins.models import PluginConfig

pytestmark = pytest.mark.django_db


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The messages handed to the indexing task."""
    sent: list[str] = []
    monkeypatch.setattr(
        "plugins.tasks.search_index_message.delay", lambda message_id: sent.append(message_id)
    )
    return sent


def finish(turn: Any, django_capture_on_commit_callbacks: Any) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        assert services.generation_finish(
            generation_id=turn.generation.id,
            status=Generation.Status.COMPLETE,
            text="An answer.",
            finish_reason="stop",
            prompt_tokens=5,
            output_tokens=3,
        )


def test_a_web_answer_and_its_question_are_indexed(
    user: Any, queued: list[str], django_capture_on_commit_callbacks: Any
) -> None:
    register_pool()
    turn = send_turn(user)
    finish(turn, django_capture_on_commit_callbacks)
    assert sorted(queued) == sorted([str(turn.assistant_message.pk), str(turn.user_message.pk)])


def test_an_api_conversation_is_left_to_the_search_itself(
    user: Any, queued: list[str], django_capture_on_commit_callbacks: Any
) -> None:
    register_pool()
    turn = send_turn(user)
    Conversation.objects.filter(pk=turn.conversation.pk).update(source=Conversation.Source.API)
    finish(turn, django_capture_on_commit_callbacks)
    assert queued == []


def test_nothing_is_indexed_for_a_user_whose_plan_lacks_the_tool(
    user: Any, queued: list[str], django_capture_on_commit_callbacks: Any
) -> None:
    PluginConfig.objects.update_or_create(
        slug="conversation_search", defaults={"enabled": True, "all_plans": False}
    )
    register_pool()
    turn = send_turn(user)
    finish(turn, django_capture_on_commit_callbacks)
    assert queued == []
