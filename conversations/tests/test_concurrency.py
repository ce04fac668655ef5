"""Two writers on one conversation at once: the row lock keeps the tree whole."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from chatsite.errors import ServiceError
from chatsite.testing import budget
from conversations.models import Conversation, Message
from conversations.selectors import active_branch
from conversations.services import Written, message_send

from .factories import ConversationFactory, finish


def run_together(*calls: Callable[[], Any]) -> list[Any]:
    """Run each call in its own thread and database connection, released at the same moment."""
    barrier = threading.Barrier(len(calls))
    outcomes: list[Any] = [None] * len(calls)

    def worker(index: int, call: Callable[[], Any]) -> None:
        try:
            barrier.wait()
            outcomes[index] = call()
        except Exception as exc:
            outcomes[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=budget(60))
        assert not thread.is_alive(), "a writer did not finish"
    return outcomes


def send_from_a_fresh_copy(conversation_id: Any, content: str) -> Callable[[], Any]:
    return lambda: message_send(
        conversation=Conversation.objects.get(pk=conversation_id), content=content
    )


def assert_tree_is_valid(conversation: Conversation) -> None:
    conversation.refresh_from_db()
    messages = {m.pk: m for m in Message.objects.filter(conversation=conversation)}
    roots = [m for m in messages.values() if m.parent_id is None]
    assert len(roots) == 1
    assert roots[0].role == Message.Role.SYSTEM
    for message in messages.values():
        if message.role == Message.Role.USER:
            assert messages[message.parent_id].role in {"system", "assistant"}  # type: ignore[index]
        if message.role == Message.Role.ASSISTANT:
            assert messages[message.parent_id].role == "user"  # type: ignore[index]
        if message.current_child_id is not None:
            assert messages[message.current_child_id].parent_id == message.pk
    branch = active_branch(conversation=conversation)
    assert branch[0] == roots[0]
    assert branch[-1].pk == conversation.current_leaf_id
    for parent, child in itertools.pairwise(branch):
        assert parent.current_child_id == child.pk


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_sends_leave_one_valid_turn_and_one_409(user: Any) -> None:
    conversation = ConversationFactory.create(owner=user)

    for round_ in range(5):
        outcomes = run_together(
            send_from_a_fresh_copy(conversation.pk, f"left {round_}"),
            send_from_a_fresh_copy(conversation.pk, f"right {round_}"),
        )

        accepted = [o for o in outcomes if isinstance(o, Written)]
        refused = [o for o in outcomes if isinstance(o, ServiceError)]
        assert len(accepted) == 1, outcomes
        assert len(refused) == 1, outcomes
        assert (refused[0].code, refused[0].status) == ("generation_in_progress", 409)
        placeholder = accepted[0].placeholder
        conversation.refresh_from_db()
        assert conversation.current_leaf_id == placeholder.pk
        assert_tree_is_valid(conversation)
        finish(placeholder)

    assert Message.objects.filter(conversation=conversation, role="user").count() == 5
