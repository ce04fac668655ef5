"""The conversation tree: sends, edits, regenerations, branch switches, deletion."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, connection
from django.test.utils import CaptureQueriesContext

from chatsite.errors import ServiceError
from conversations.models import Conversation, Message
from conversations.removal import conversation_remove
from conversations.selectors import active_branch, message_ancestry, sibling_positions
from conversations.services import (
    branch_switch,
    conversation_create,
    conversation_rename,
    message_edit,
    message_regenerate,
    message_send,
)

from .factories import ConversationFactory, exchange, finish, sent

pytestmark = pytest.mark.django_db


def contents(conversation: Conversation) -> list[str]:
    conversation.refresh_from_db()
    return [message.content for message in active_branch(conversation=conversation)]


def test_create_makes_one_root_system_message_holding_the_prompt(user: Any) -> None:
    conversation = conversation_create(owner=user, system_prompt="Be brief.", title="Plans")

    root = Message.objects.get(conversation=conversation)
    assert root.role == Message.Role.SYSTEM
    assert root.content == "Be brief."
    assert root.parent is None
    assert conversation.current_leaf == root
    assert conversation.model == "smollm2-135m"
    assert conversation.title == "Plans"
    assert conversation.title_set_by_user is True


def test_a_second_root_is_refused_by_the_database() -> None:
    conversation = ConversationFactory.create()

    with pytest.raises(IntegrityError):
        Message.objects.create(conversation=conversation, role=Message.Role.SYSTEM)


def test_send_adds_a_user_message_and_a_queued_placeholder_as_the_leaf() -> None:
    conversation = ConversationFactory.create(model="tiny-model")
    root = Message.objects.get(conversation=conversation)
    before = conversation.last_activity_at

    user_message, placeholder = sent(message_send(conversation=conversation, content="Hi there"))

    conversation.refresh_from_db()
    assert user_message.parent == root
    assert (user_message.role, user_message.status) == ("user", "complete")
    assert placeholder.parent == user_message
    assert (placeholder.role, placeholder.status, placeholder.content) == (
        "assistant",
        "queued",
        "",
    )
    assert placeholder.model == "tiny-model"
    assert conversation.current_leaf == placeholder
    assert conversation.last_activity_at > before
    root.refresh_from_db()
    user_message.refresh_from_db()
    assert root.current_child == user_message
    assert user_message.current_child == placeholder


def test_send_under_an_older_answer_continues_that_branch() -> None:
    conversation = ConversationFactory.create()
    _, a1 = exchange(conversation, "one")
    exchange(conversation, "two")

    u2b, a2b = sent(message_send(conversation=conversation, content="two again", parent=a1.pk))
    finish(a2b, "answer two again")

    assert contents(conversation)[1:] == ["one", "Re: one", "two again", "answer two again"]
    a1.refresh_from_db()
    assert a1.current_child == u2b
    assert [
        p.count for p in sibling_positions(branch=active_branch(conversation=conversation))
    ] == [
        1,
        1,
        1,
        2,
        1,
    ]


def test_edit_forks_a_new_branch_and_keeps_the_old_one() -> None:
    conversation = ConversationFactory.create()
    exchange(conversation, "one")
    u2, _ = exchange(conversation, "two", answer="old answer")
    exchange(conversation, "three")

    new_user, placeholder = sent(message_edit(message=u2, content="two, edited"))
    finish(placeholder, "new answer")

    assert new_user.parent_id == u2.parent_id
    assert contents(conversation)[1:] == ["one", "Re: one", "two, edited", "new answer"]
    # The old branch is untouched and one switch away, down to its deepest turn.
    assert Message.objects.get(pk=u2.pk).content == "two"
    branch_switch(message=u2)
    assert contents(conversation)[1:] == [
        "one",
        "Re: one",
        "two",
        "old answer",
        "three",
        "Re: three",
    ]


def test_regenerate_adds_a_sibling_answer() -> None:
    conversation = ConversationFactory.create()
    user_message, answer = exchange(conversation, "one", answer="first try")

    placeholder = message_regenerate(message=answer).placeholder

    conversation.refresh_from_db()
    assert placeholder.parent == user_message
    assert placeholder.status == Message.Status.QUEUED
    assert conversation.current_leaf == placeholder
    assert list(user_message.children.values_list("id", flat=True)) == [answer.pk, placeholder.pk]
    answer.refresh_from_db()
    assert (answer.content, answer.status) == ("first try", "complete")


def build_deep_tree(conversation: Conversation) -> dict[str, Message]:
    """Nine levels below the root, with forks at four of them.

    root ─ u1 ┬ a1 ┬ u2 ─ a2 ┬ u3 ─ a3 ─ u4 ─ a4
              │    │         └ u3b ─ a3b ─ u4b ┬ a4b
              │    │                           └ a4c
              │    └ u2b ─ a2b ─ u3c ─ a3c
              └ a1b ─ u2d ─ a2d
    """
    m: dict[str, Message] = {}
    m["u1"], m["a1"] = exchange(conversation, "u1", answer="a1")
    m["u2"], m["a2"] = exchange(conversation, "u2", answer="a2")
    m["u3"], m["a3"] = exchange(conversation, "u3", answer="a3")
    m["u4"], m["a4"] = exchange(conversation, "u4", answer="a4")
    m["u3b"], placeholder = sent(message_edit(message=m["u3"], content="u3b"))
    m["a3b"] = finish(placeholder, "a3b")
    m["u4b"], m["a4b"] = exchange(conversation, "u4b", answer="a4b")
    m["a4c"] = finish(message_regenerate(message=m["a4b"]).placeholder, "a4c")
    m["u2b"], placeholder = sent(message_edit(message=m["u2"], content="u2b"))
    m["a2b"] = finish(placeholder, "a2b")
    m["u3c"], m["a3c"] = exchange(conversation, "u3c", answer="a3c")
    m["a1b"] = finish(message_regenerate(message=m["a1"]).placeholder, "a1b")
    m["u2d"], m["a2d"] = exchange(conversation, "u2d", answer="a2d")
    return m


def switch(conversation: Conversation, message: Message) -> list[str]:
    branch_switch(message=message)
    conversation.refresh_from_db()
    return [message.content for message in active_branch(conversation=conversation)][1:]


def test_branch_switch_shows_the_deepest_leaf_last_viewed() -> None:
    conversation = ConversationFactory.create()
    m = build_deep_tree(conversation)
    assert contents(conversation)[1:] == ["u1", "a1b", "u2d", "a2d"]

    # Under u2 the last branch viewed went through u3b and, under u4b, the regenerated a4c.
    assert switch(conversation, m["u2"]) == ["u1", "a1", "u2", "a2", "u3b", "a3b", "u4b", "a4c"]
    assert conversation.current_leaf == m["a4c"]

    assert switch(conversation, m["u3"]) == ["u1", "a1", "u2", "a2", "u3", "a3", "u4", "a4"]
    assert switch(conversation, m["a1b"]) == ["u1", "a1b", "u2d", "a2d"]
    # Back to a1: it remembers u2, under which u3 was the last one switched to.
    assert switch(conversation, m["a1"]) == ["u1", "a1", "u2", "a2", "u3", "a3", "u4", "a4"]
    assert switch(conversation, m["u2b"]) == ["u1", "a1", "u2b", "a2b", "u3c", "a3c"]
    # Switching deep inside a branch not on screen moves every fork above it too.
    assert switch(conversation, m["a4b"]) == ["u1", "a1", "u2", "a2", "u3b", "a3b", "u4b", "a4b"]
    assert switch(conversation, m["a1b"]) == ["u1", "a1b", "u2d", "a2d"]
    assert switch(conversation, m["a1"])[-1] == "a4b"
    assert conversation.current_leaf == m["a4b"]


def test_branch_switch_does_not_move_the_conversation_in_the_sidebar() -> None:
    conversation = ConversationFactory.create()
    u1, _ = exchange(conversation, "one")
    message_edit(message=u1, content="one, edited")
    conversation.refresh_from_db()
    before = conversation.last_activity_at

    branch_switch(message=u1)

    conversation.refresh_from_db()
    assert conversation.last_activity_at == before


def test_sibling_positions_on_a_deep_tree() -> None:
    conversation = ConversationFactory.create()
    m = build_deep_tree(conversation)
    branch_switch(message=m["a4b"])
    conversation.refresh_from_db()
    branch = active_branch(conversation=conversation)

    positions = sibling_positions(branch=branch)

    assert [
        (message.content, p.index, p.count) for message, p in zip(branch, positions, strict=True)
    ] == [
        ("You are a helpful assistant.", 1, 1),
        ("u1", 1, 1),
        ("a1", 1, 2),
        ("u2", 1, 2),
        ("a2", 1, 1),
        ("u3b", 2, 2),
        ("a3b", 1, 1),
        ("u4b", 1, 1),
        ("a4b", 1, 2),
    ]
    assert positions[5].sibling_ids == (m["u3"].pk, m["u3b"].pk)
    assert positions[8].sibling_ids == (m["a4b"].pk, m["a4c"].pk)


def test_the_active_branch_and_its_positions_take_one_query_each(
    django_assert_num_queries: Any,
) -> None:
    conversation = ConversationFactory.create()
    build_deep_tree(conversation)
    conversation.refresh_from_db()

    with django_assert_num_queries(1):
        branch = active_branch(conversation=conversation)
    with django_assert_num_queries(1):
        sibling_positions(branch=branch)
    assert len(branch) == 5


def test_ancestry_runs_root_first() -> None:
    conversation = ConversationFactory.create()
    root = conversation.current_leaf
    u1, a1 = exchange(conversation, "one")
    u2, _ = exchange(conversation, "two")

    ancestry = message_ancestry(message_id=u2.pk)

    assert ancestry == [root, u1, a1, u2]


def test_delete_removes_every_message_and_keeps_a_tombstone() -> None:
    conversation = ConversationFactory.create(title="Secret plans", system_prompt="Secret prompt")
    exchange(conversation, "one")
    exchange(conversation, "two")

    conversation_remove(conversation=conversation)

    tombstone = Conversation.objects.get(pk=conversation.pk)
    assert tombstone.deleted_at is not None
    assert (tombstone.title, tombstone.system_prompt, tombstone.current_leaf) == ("", "", None)
    assert not Message.objects.filter(conversation_id=conversation.pk).exists()


def test_rename_sets_a_user_title_without_moving_the_conversation() -> None:
    conversation = ConversationFactory.create(title="")
    before = conversation.last_activity_at

    conversation_rename(conversation=conversation, title="  Trip to Lisbon  ")

    conversation.refresh_from_db()
    assert (conversation.title, conversation.title_set_by_user) == ("Trip to Lisbon", True)
    assert conversation.last_activity_at == before


@pytest.mark.parametrize("write", ["send", "edit", "regenerate", "switch", "rename"])
def test_every_write_into_a_deleted_conversation_is_refused(write: str) -> None:
    conversation = ConversationFactory.create()
    user_message, answer = exchange(conversation, "one")
    stale = Conversation.objects.get(pk=conversation.pk)
    user_message = Message.objects.select_related("conversation").get(pk=user_message.pk)
    answer = Message.objects.select_related("conversation").get(pk=answer.pk)
    conversation_remove(conversation=stale)

    calls = {
        "send": lambda: message_send(conversation=conversation, content="hello"),
        "edit": lambda: message_edit(message=user_message, content="again"),
        "regenerate": lambda: message_regenerate(message=answer).placeholder,
        "switch": lambda: branch_switch(message=user_message),
        "rename": lambda: conversation_rename(conversation=conversation, title="New"),
    }
    with pytest.raises(ServiceError) as caught:
        calls[write]()

    assert (caught.value.code, caught.value.status) == ("conversation_deleted", 400)
    assert not Message.objects.filter(conversation_id=conversation.pk).exists()


def test_a_turn_is_refused_while_an_answer_is_being_generated() -> None:
    conversation = ConversationFactory.create()
    user_message, placeholder = sent(message_send(conversation=conversation, content="one"))
    Message.objects.filter(pk=placeholder.pk).update(status=Message.Status.STREAMING)

    for call in (
        lambda: message_send(conversation=conversation, content="two"),
        lambda: message_edit(message=user_message, content="one again"),
        lambda: message_regenerate(message=placeholder).placeholder,
    ):
        with pytest.raises(ServiceError) as caught:
            call()
        assert (caught.value.code, caught.value.status) == ("generation_in_progress", 409)
    assert Message.objects.filter(conversation=conversation).count() == 3


def test_a_send_from_an_old_copy_goes_under_the_leaf_the_locked_row_names() -> None:
    """The leaf is read with the lock: a copy of the conversation taken before the last turn
    (or a turn that waited for the lock) still continues the branch on screen."""
    conversation = ConversationFactory.create()
    old_copy = Conversation.objects.get(pk=conversation.pk)
    _, answer = exchange(conversation, "one")

    user_message, placeholder = sent(message_send(conversation=old_copy, content="two"))

    assert user_message.parent_id == answer.pk
    assert Conversation.objects.get(pk=conversation.pk).current_leaf_id == placeholder.pk
    assert [m.pk for m in active_branch(conversation=old_copy)][-3:] == [
        answer.pk,
        user_message.pk,
        placeholder.pk,
    ]


def test_a_turn_is_accepted_after_a_failed_answer() -> None:
    conversation = ConversationFactory.create()
    placeholder = message_send(conversation=conversation, content="one").placeholder
    Message.objects.filter(pk=placeholder.pk).update(status=Message.Status.FAILED)

    user_message, _ = sent(message_send(conversation=conversation, content="one more time"))

    assert user_message.parent_id == placeholder.pk


def test_tree_writes_run_a_bounded_number_of_queries() -> None:
    conversation = ConversationFactory.create()
    build_deep_tree(conversation)
    conversation.refresh_from_db()

    with CaptureQueriesContext(connection) as shallow:
        exchange(conversation, "x")
    for _ in range(10):
        exchange(conversation, "more")
    with CaptureQueriesContext(connection) as deep:
        exchange(conversation, "y")

    assert len(deep) == len(shallow)
