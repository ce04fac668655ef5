"""Folders, pins and archive: the services, the sidebar's filters and keyset, and the API."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from chatsite.errors import ServiceError
from chatsite.testing import assert_error
from conversations.models import Conversation, Folder
from conversations.selectors import UNFILED, conversation_sidebar
from conversations.services import conversation_organize, folder_create, folder_delete

from .factories import ConversationFactory

pytestmark = pytest.mark.django_db

API = "/api/v1/conversations"


def titles(user: Any, **kwargs: Any) -> list[str]:
    return [c.title for c in conversation_sidebar(user=user, **kwargs).conversations]


def test_pinned_conversations_come_first_and_archived_ones_leave_the_main_list(
    user: Any,
) -> None:
    one, two, three, four = (ConversationFactory.create(owner=user, title=t) for t in "abcd")
    assert titles(user) == ["d", "c", "b", "a"]

    conversation_organize(conversation=one, pinned=True)
    conversation_organize(conversation=three, archived=True)
    assert titles(user) == ["a", "d", "b"]
    assert titles(user, archived=True) == ["c"]
    assert titles(user, pinned=True) == ["a"]

    # Archiving unpins; unarchiving brings it back to its place in time.
    conversation_organize(conversation=one, archived=True)
    one.refresh_from_db()
    assert one.archived and not one.pinned
    conversation_organize(conversation=three, archived=False)
    assert titles(user) == ["d", "c", "b"]
    assert {two.pk, four.pk} <= {c.pk for c in conversation_sidebar(user=user).conversations}


def test_keyset_pages_cross_from_pinned_to_unpinned_without_gaps_or_repeats(user: Any) -> None:
    made = [ConversationFactory.create(owner=user, title=f"c{i}") for i in range(7)]
    for conversation in made[1:6:2]:  # c1, c3, c5 pinned
        conversation_organize(conversation=conversation, pinned=True)

    seen: list[str] = []
    cursor = None
    while True:
        page = conversation_sidebar(user=user, cursor=cursor, limit=2)
        seen += [c.title for c in page.conversations]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == ["c5", "c3", "c1", "c6", "c4", "c2", "c0"]


def test_a_folder_holds_conversations_and_deleting_it_keeps_them(user: Any) -> None:
    work = folder_create(owner=user, name="Work")
    a = ConversationFactory.create(owner=user, title="a")
    ConversationFactory.create(owner=user, title="b")
    conversation_organize(conversation=a, folder=work)
    assert titles(user, folder=work) == ["a"]
    assert titles(user, folder=UNFILED) == ["b"]

    folder_delete(folder=work)
    a.refresh_from_db()
    assert a.folder_id is None and a.deleted_at is None
    assert titles(user, folder=UNFILED) == ["b", "a"]


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("   ", "empty_folder_name"),
        ("x" * 61, "folder_name_too_long"),
        ("bad\u0000name", "invalid_folder_name"),
        ("right\u202eleft", "invalid_folder_name"),
    ],
)
def test_folder_names_are_checked(user: Any, name: str, code: str) -> None:
    with pytest.raises(ServiceError) as caught:
        folder_create(owner=user, name=name)
    assert caught.value.code == code


def test_folder_names_are_unique_per_user_whatever_the_case(user: Any, other_user: Any) -> None:
    folder_create(owner=user, name="Recipes")
    with pytest.raises(ServiceError) as caught:
        folder_create(owner=user, name="  recipes ")
    assert caught.value.code == "folder_name_taken"
    assert folder_create(owner=other_user, name="Recipes").name == "Recipes"


@override_settings(FOLDERS_MAX_PER_USER=2)
def test_a_user_has_at_most_the_cap_of_folders(api_client: APIClient) -> None:
    for name in ("one", "two"):
        assert api_client.post("/api/v1/folders", {"name": name}, format="json").status_code == 201
    refused = api_client.post("/api/v1/folders", {"name": "three"}, format="json")
    assert assert_error(refused, 409, "too_many_folders")["detail"] == {"max_folders": 2}


def test_folder_crud_over_the_api(api_client: APIClient, user: Any) -> None:
    created = api_client.post("/api/v1/folders", {"name": " Travel  plans "}, format="json")
    assert created.status_code == 201, created.content
    folder_id = created.json()["id"]
    assert created.json()["name"] == "Travel plans"

    renamed = api_client.patch(f"/api/v1/folders/{folder_id}", {"name": "Trips"}, format="json")
    assert renamed.json()["name"] == "Trips"
    assert [f["name"] for f in api_client.get("/api/v1/folders").json()["results"]] == ["Trips"]

    conversation = ConversationFactory.create(owner=user)
    moved = api_client.patch(
        f"{API}/{conversation.pk}", {"folder_id": folder_id, "pinned": True}, format="json"
    )
    assert moved.status_code == 200, moved.content
    assert moved.json()["folder_id"] == folder_id and moved.json()["pinned"] is True

    listed = api_client.get(API, {"folder": folder_id}).json()["results"]
    assert [c["id"] for c in listed] == [str(conversation.pk)]

    assert api_client.delete(f"/api/v1/folders/{folder_id}").status_code == 204
    assert api_client.get(f"{API}/{conversation.pk}").json()["folder_id"] is None
    assert_error(api_client.get(API, {"folder": folder_id}), 404, "not_found")


def test_archive_and_unarchive_over_the_api(api_client: APIClient, user: Any) -> None:
    conversation = ConversationFactory.create(owner=user, title="old trip")
    archived = api_client.patch(f"{API}/{conversation.pk}", {"archived": True}, format="json")
    assert archived.json()["archived"] is True
    assert api_client.get(API).json()["results"] == []
    shown = api_client.get(API, {"archived": "true"}).json()["results"]
    assert [c["title"] for c in shown] == ["old trip"]
    # Still reachable by its address.
    assert api_client.get(f"{API}/{conversation.pk}").status_code == 200

    api_client.patch(f"{API}/{conversation.pk}", {"archived": False}, format="json")
    assert [c["title"] for c in api_client.get(API).json()["results"]] == ["old trip"]


def test_another_users_folders_and_conversations_are_not_found(
    api_client: APIClient, user: Any, other_user: Any
) -> None:
    theirs = folder_create(owner=other_user, name="Theirs")
    their_chat = ConversationFactory.create(owner=other_user)
    mine = ConversationFactory.create(owner=user)

    assert_error(api_client.patch(f"/api/v1/folders/{theirs.pk}", {"name": "x"}), 404, "not_found")
    assert_error(api_client.delete(f"/api/v1/folders/{theirs.pk}"), 404, "not_found")
    assert_error(api_client.get(API, {"folder": str(theirs.pk)}), 404, "not_found")
    into_theirs = api_client.patch(f"{API}/{mine.pk}", {"folder_id": str(theirs.pk)}, format="json")
    assert_error(into_theirs, 404, "not_found")
    assert_error(
        api_client.patch(f"{API}/{their_chat.pk}", {"pinned": True}, format="json"),
        404,
        "not_found",
    )
    assert Folder.objects.get(pk=theirs.pk).name == "Theirs"
    assert not Conversation.objects.get(pk=their_chat.pk).pinned
    mine.refresh_from_db()
    assert mine.folder_id is None


@pytest.mark.parametrize(
    ("call", "code"),
    [
        (lambda c: c.get(API, {"folder": "nope"}), "invalid_folder"),
        (lambda c: c.get(API, {"pinned": "maybe"}), "invalid_pinned"),
        (lambda c: c.get(API, {"cursor": "bm90IGpzb24"}), "invalid_cursor"),
        (lambda c: c.post("/api/v1/folders", {"name": 5}, format="json"), "invalid_name"),
        (lambda c: c.post("/api/v1/folders", {"name": ""}, format="json"), "empty_folder_name"),
    ],
)
def test_bad_input_is_a_400_in_the_error_shape(api_client: APIClient, call: Any, code: str) -> None:
    assert_error(call(api_client), 400, code)


def test_session_writes_to_folders_need_csrf(session_client: APIClient) -> None:
    refused = session_client.post("/api/v1/folders", {"name": "x"}, format="json")
    assert refused.status_code == 403
    assert not Folder.objects.exists()
