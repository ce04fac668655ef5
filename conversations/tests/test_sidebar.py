"""The sidebar: newest activity first, title search, keyset pages, no tombstones."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from chatsite.errors import ServiceError
from conversations.models import Conversation
from conversations.removal import conversation_remove
from conversations.selectors import conversation_sidebar
from conversations.services import conversation_rename

from .factories import ConversationFactory, exchange

pytestmark = pytest.mark.django_db


def titles(user: Any, **kwargs: Any) -> list[str]:
    page = conversation_sidebar(user=user, **kwargs)
    return [conversation.title for conversation in page.conversations]


def test_a_new_message_moves_a_conversation_to_the_top_and_a_rename_does_not(user: Any) -> None:
    first = ConversationFactory.create(owner=user, title="first")
    second = ConversationFactory.create(owner=user, title="second")
    ConversationFactory.create(owner=user, title="third")
    assert titles(user) == ["third", "second", "first"]

    exchange(first, "hello again")
    assert titles(user) == ["first", "third", "second"]

    conversation_rename(conversation=second, title="second, renamed")
    assert titles(user) == ["first", "third", "second, renamed"]


def test_search_matches_titles_case_insensitively(user: Any) -> None:
    ConversationFactory.create(owner=user, title="Trip to Lisbon")
    ConversationFactory.create(owner=user, title="lisbon restaurants")
    ConversationFactory.create(owner=user, title="Tax return")
    ConversationFactory.create(title="Lisbon, someone else's")

    assert titles(user, query="LISBON") == ["lisbon restaurants", "Trip to Lisbon"]
    assert titles(user, query="  tax ") == ["Tax return"]
    assert titles(user, query="paris") == []


def test_deleted_conversations_are_hidden(user: Any) -> None:
    kept = ConversationFactory.create(owner=user, title="kept")
    gone = ConversationFactory.create(owner=user, title="gone")
    conversation_remove(conversation=gone)

    page = conversation_sidebar(user=user)

    assert page.conversations == [kept]
    assert Conversation.objects.filter(pk=gone.pk).exists()


def test_cursor_pages_cover_every_conversation_once(user: Any) -> None:
    made = [ConversationFactory.create(owner=user, title=f"c{n}") for n in range(7)]
    seen: list[str] = []
    cursor = None
    pages = 0

    while True:
        page = conversation_sidebar(user=user, cursor=cursor, limit=3)
        seen.extend(conversation.title for conversation in page.conversations)
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            break

    assert pages == 3
    assert seen == [conversation.title for conversation in reversed(made)]


def test_cursor_pages_hold_across_equal_activity_times(user: Any) -> None:
    made = [ConversationFactory.create(owner=user) for _ in range(5)]
    same_time = made[0].last_activity_at
    Conversation.objects.filter(owner=user).update(last_activity_at=same_time)

    first = conversation_sidebar(user=user, limit=2)
    second = conversation_sidebar(user=user, cursor=first.next_cursor, limit=2)
    third = conversation_sidebar(user=user, cursor=second.next_cursor, limit=2)

    ids = [c.pk for page in (first, second, third) for c in page.conversations]
    assert sorted(ids, reverse=True) == ids
    assert set(ids) == {c.pk for c in made}
    assert third.next_cursor is None


def test_activity_during_paging_repeats_nothing_already_shown(user: Any) -> None:
    made = {n: ConversationFactory.create(owner=user, title=f"c{n}") for n in range(6)}
    first = conversation_sidebar(user=user, limit=3)
    assert [c.title for c in first.conversations] == ["c5", "c4", "c3"]

    # c2, not yet shown, gets a message: it moves to the top (seen on refresh), and the next
    # page goes on after c3 without showing c3 again, as an offset would.
    exchange(made[2], "bump")
    rest = conversation_sidebar(user=user, cursor=first.next_cursor, limit=3)

    assert [c.title for c in rest.conversations] == ["c1", "c0"]
    assert titles(user, limit=1) == ["c2"]


@pytest.mark.parametrize("cursor", ["!!!", "e30", "WyJ5ZXN0ZXJkYXkiLCAiMSJd"])
def test_a_bad_cursor_is_refused(user: Any, cursor: str) -> None:
    with pytest.raises(ServiceError) as caught:
        conversation_sidebar(user=user, cursor=cursor)

    assert (caught.value.code, caught.value.status) == ("invalid_cursor", 400)


def test_the_api_pages_with_next_cursor(api_client: APIClient, user: Any) -> None:
    for n in range(5):
        ConversationFactory.create(owner=user, title=f"chat {n}")
    ConversationFactory.create(owner=user, title="other")

    first = api_client.get("/api/v1/conversations", {"q": "chat", "limit": "3"}).json()
    second = api_client.get(
        "/api/v1/conversations", {"q": "chat", "limit": "3", "cursor": first["next_cursor"]}
    ).json()

    assert [c["title"] for c in first["results"]] == ["chat 4", "chat 3", "chat 2"]
    assert [c["title"] for c in second["results"]] == ["chat 1", "chat 0"]
    assert second["next_cursor"] is None
