"""A `/v1` conversation that its key does not keep is removed once answered: no title is
asked for it. A kept one, like a web conversation, gets its title."""

from __future__ import annotations

from typing import Any

import pytest

from chatsite.redis import sync_redis
from conversations.models import Conversation
from conversations.titles import title_pending_key
from conversations.unkept import unkept_remember
from inference import services
from inference.models import Generation
from inference.tests.fixtures import register_pool, send_turn

pytestmark = pytest.mark.django_db


@pytest.fixture
def titled(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    asked: list[str] = []
    monkeypatch.setattr(
        "conversations.tasks.generate_title.delay",
        lambda conversation_id: asked.append(conversation_id),
    )
    return asked


def answer(user: Any, capture: Any, *, kept: bool) -> Conversation:
    register_pool()
    turn = send_turn(user)
    Conversation.objects.filter(pk=turn.conversation.pk).update(source=Conversation.Source.API)
    if not kept:
        unkept_remember(conversation_id=turn.conversation.pk)
    finish(turn, capture)
    return turn.conversation


def finish(turn: Any, capture: Any) -> None:
    with capture(execute=True):
        services.generation_finish(
            generation_id=turn.generation.id,
            status=Generation.Status.COMPLETE,
            text="An answer.",
            finish_reason="stop",
        )


def test_an_unkept_api_conversation_gets_no_title(
    user: Any, titled: list[str], django_capture_on_commit_callbacks: Any
) -> None:
    answer(user, django_capture_on_commit_callbacks, kept=False)
    assert titled == []


def test_a_kept_api_conversation_gets_its_title(
    user: Any, titled: list[str], django_capture_on_commit_callbacks: Any
) -> None:
    conversation = answer(user, django_capture_on_commit_callbacks, kept=True)
    assert titled == [str(conversation.pk)]


def test_answers_that_finish_before_the_title_is_written_ask_for_it_once(
    user: Any, titled: list[str], django_capture_on_commit_callbacks: Any
) -> None:
    conversation = answer(user, django_capture_on_commit_callbacks, kept=True)
    # The next turn's answer finishes while the first title task is still pending.
    finish(send_turn(user, conversation=conversation), django_capture_on_commit_callbacks)
    assert titled == [str(conversation.pk)]
    # The task releases its claim when it ends (`tasks.generate_title`); here by hand, as if
    # it had written nothing: the next answer in the untitled conversation asks again.
    sync_redis().delete(title_pending_key(conversation.pk))
    finish(send_turn(user, conversation=conversation), django_capture_on_commit_callbacks)
    assert titled == [str(conversation.pk)] * 2
