"""The conversations JSON API: shapes, the tree through HTTP, and every refusal's code."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from chatsite.errors import ServiceError
from chatsite.redis import sync_redis
from chatsite.testing import assert_error
from conversations import turns
from conversations.models import Conversation, Message
from inference import queue
from inference.models import Generation

from .factories import ConversationFactory, exchange

pytestmark = pytest.mark.django_db

API = "/api/v1/conversations"


@pytest.fixture
def conversation(user: Any) -> Conversation:
    return ConversationFactory.create(owner=user)


def test_create_answers_the_conversation_with_its_root(api_client: APIClient) -> None:
    response = api_client.post(
        API, {"system_prompt": "Be brief.", "title": "Plans", "model": "smollm2-135m"}
    )

    assert response.status_code == 201
    body = response.json()
    conversation = Conversation.objects.get(pk=body["id"])
    assert body["title"] == "Plans"
    assert body["source"] == "api"
    assert body["current_leaf_id"] == str(conversation.current_leaf_id)
    [root] = body["messages"]
    assert (root["role"], root["content"], root["parent_id"]) == ("system", "Be brief.", None)
    assert (root["sibling_index"], root["sibling_count"]) == (1, 1)


def test_create_with_no_body_uses_the_defaults(session_client: APIClient) -> None:
    token = csrf_token(session_client)

    response = session_client.post(API, {}, HTTP_X_CSRFTOKEN=token)

    assert response.status_code == 201
    body = response.json()
    assert (body["model"], body["title"], body["system_prompt"]) == ("smollm2-135m", "", "")
    assert body["source"] == "web"


def csrf_token(client: APIClient) -> str:
    client.get("/")
    return str(client.cookies["csrftoken"].value)


def test_create_refuses_a_too_long_system_prompt(api_client: APIClient) -> None:
    prompt = "x" * (settings.SYSTEM_PROMPT_MAX_CHARS + 1)

    response = api_client.post(API, {"system_prompt": prompt}, format="json")

    assert_error(response, 413, "system_prompt_too_long")
    assert not Conversation.objects.exists()


@pytest.mark.parametrize(
    ("model", "code"), [("  ", "invalid_model"), (7, "invalid_model"), ("m" * 101, "unknown_model")]
)
def test_create_refuses_a_bad_model(api_client: APIClient, model: Any, code: str) -> None:
    response = api_client.post(API, {"model": model}, format="json")

    assert_error(response, 400, code)
    assert not Conversation.objects.exists()


def test_detail_shows_the_active_branch_with_sibling_positions(
    api_client: APIClient, conversation: Conversation
) -> None:
    user_message, _ = exchange(conversation, "one", answer="first")
    edited = api_client.post(
        f"{API}/{conversation.pk}/messages/{user_message.pk}/edit", {"content": "one!"}
    ).json()

    body = api_client.get(f"{API}/{conversation.pk}").json()

    messages = body["messages"]
    assert [(m["role"], m["content"]) for m in messages] == [
        ("system", "You are a helpful assistant."),
        ("user", "one!"),
        ("assistant", ""),
    ]
    assert messages[1]["sibling_index"] == 2
    assert messages[1]["sibling_count"] == 2
    assert messages[1]["sibling_ids"] == [str(user_message.pk), edited["user_message"]["id"]]
    assert messages[2]["status"] == "queued"
    assert body["current_leaf_id"] == edited["assistant_message"]["id"]


def test_send_answers_the_message_the_placeholder_and_the_leaf(
    api_client: APIClient, conversation: Conversation, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        response = api_client.post(f"{API}/{conversation.pk}/messages", {"content": "Hello!"})

    assert response.status_code == 201
    body = response.json()
    assert set(body) == {"user_message", "assistant_message", "current_leaf_id", "generation"}
    assert body["user_message"]["content"] == "Hello!"
    assert body["user_message"]["parent_id"] == str(conversation.current_leaf_id)
    assert body["assistant_message"]["status"] == "queued"
    assert body["assistant_message"]["parent_id"] == body["user_message"]["id"]
    assert body["current_leaf_id"] == body["assistant_message"]["id"]
    assert Message.objects.filter(conversation=conversation).count() == 3
    # The answer is queued for the scheduler, and the client is told where to watch it.
    generation = Generation.objects.get(message_id=body["assistant_message"]["id"])
    assert body["generation"] == {
        "id": str(generation.id),
        "status": "queued",
        "stream_url": f"/api/v1/generations/{generation.id}/stream",
        "cancel_url": f"/api/v1/generations/{generation.id}/cancel",
    }
    redis = sync_redis()
    assert redis.zscore(queue.queue_key(generation.pool.name, generation.tier), str(generation.id))
    assert redis.hget(queue.job_key(generation.id), "messages")


def test_send_under_an_explicit_parent(api_client: APIClient, conversation: Conversation) -> None:
    _, first_answer = exchange(conversation, "one")
    exchange(conversation, "two")

    response = api_client.post(
        f"{API}/{conversation.pk}/messages",
        {"content": "two, again", "parent_id": str(first_answer.pk)},
        format="json",
    )

    assert response.status_code == 201
    assert response.json()["user_message"]["parent_id"] == str(first_answer.pk)


def test_send_accepts_exactly_the_longest_message(
    api_client: APIClient, conversation: Conversation
) -> None:
    # Common words, so the longest message also fits the model's 8k-token window.
    content = ("hello " * settings.MESSAGE_MAX_CHARS)[: settings.MESSAGE_MAX_CHARS]

    response = api_client.post(f"{API}/{conversation.pk}/messages", {"content": content})

    assert response.status_code == 201
    assert Message.objects.get(pk=response.json()["user_message"]["id"]).content == content


def test_send_refuses_a_message_the_model_cannot_read(
    api_client: APIClient, conversation: Conversation
) -> None:
    # Within the character limit, but far more tokens than the model's context window.
    content = "x" * settings.MESSAGE_MAX_CHARS

    response = api_client.post(f"{API}/{conversation.pk}/messages", {"content": content})

    assert_error(response, 400, "context_too_long")
    assert not Message.objects.filter(conversation=conversation, role="user").exists()


def test_send_refuses_one_character_more(api_client: APIClient, conversation: Conversation) -> None:
    content = "x" * (settings.MESSAGE_MAX_CHARS + 1)

    response = api_client.post(f"{API}/{conversation.pk}/messages", {"content": content})

    error = assert_error(response, 413, "message_too_long")
    assert error["detail"]["max_chars"] == settings.MESSAGE_MAX_CHARS
    assert Message.objects.filter(conversation=conversation).count() == 1


@pytest.mark.parametrize("content", ["", "   ", "\n\t "])
def test_send_refuses_an_empty_message(
    api_client: APIClient, conversation: Conversation, content: str
) -> None:
    response = api_client.post(
        f"{API}/{conversation.pk}/messages", {"content": content}, format="json"
    )

    assert_error(response, 400, "empty_message")


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({}, "missing_field"),
        ({"content": None}, "missing_field"),
        ({"content": 42}, "invalid_content"),
        ({"content": ["hi"]}, "invalid_content"),
        ({"content": True}, "invalid_content"),
        ({"content": "hi", "parent_id": "not-a-uuid"}, "invalid_parent_id"),
        ({"content": "hi", "parent_id": 7}, "invalid_parent_id"),
    ],
)
def test_send_refuses_malformed_fields(
    api_client: APIClient, conversation: Conversation, body: dict[str, Any], code: str
) -> None:
    response = api_client.post(f"{API}/{conversation.pk}/messages", body, format="json")

    assert_error(response, 400, code)
    assert Message.objects.filter(conversation=conversation).count() == 1


def test_malformed_json_is_a_400(api_client: APIClient, conversation: Conversation) -> None:
    response = api_client.post(
        f"{API}/{conversation.pk}/messages", "{not json", content_type="application/json"
    )

    assert_error(response, 400, "malformed_request")


def test_send_refuses_a_parent_from_another_conversation(
    api_client: APIClient, conversation: Conversation, user: Any
) -> None:
    elsewhere = ConversationFactory.create(owner=user)
    _, answer = exchange(elsewhere, "hi")

    response = api_client.post(
        f"{API}/{conversation.pk}/messages",
        {"content": "hello", "parent_id": str(answer.pk)},
        format="json",
    )

    assert_error(response, 400, "unknown_parent")


def test_send_refuses_an_unknown_parent(api_client: APIClient, conversation: Conversation) -> None:
    response = api_client.post(
        f"{API}/{conversation.pk}/messages",
        {"content": "hello", "parent_id": "00000000-0000-4000-8000-000000000000"},
        format="json",
    )

    assert_error(response, 400, "unknown_parent")


def test_send_refuses_two_user_turns_in_a_row(
    api_client: APIClient, conversation: Conversation
) -> None:
    user_message, _ = exchange(conversation, "one")

    response = api_client.post(
        f"{API}/{conversation.pk}/messages",
        {"content": "two", "parent_id": str(user_message.pk)},
        format="json",
    )

    assert_error(response, 400, "invalid_parent")


def test_send_refuses_while_an_answer_is_queued(
    api_client: APIClient, conversation: Conversation
) -> None:
    first = api_client.post(f"{API}/{conversation.pk}/messages", {"content": "one"})
    assert first.status_code == 201

    response = api_client.post(f"{API}/{conversation.pk}/messages", {"content": "two"})

    assert_error(response, 409, "generation_in_progress")
    assert Message.objects.filter(conversation=conversation).count() == 3


def test_edit_and_regenerate_refuse_while_an_answer_streams(
    api_client: APIClient, conversation: Conversation
) -> None:
    user_message, answer = exchange(conversation, "one")
    Message.objects.filter(pk=answer.pk).update(status=Message.Status.STREAMING)
    base = f"{API}/{conversation.pk}/messages"

    edit = api_client.post(f"{base}/{user_message.pk}/edit", {"content": "one!"})
    regenerate = api_client.post(f"{base}/{answer.pk}/regenerate")

    assert_error(edit, 409, "generation_in_progress")
    assert_error(regenerate, 409, "generation_in_progress")


def test_edit_forks_and_the_old_branch_is_still_readable(
    api_client: APIClient, conversation: Conversation
) -> None:
    user_message, answer = exchange(conversation, "one", answer="old answer")
    base = f"{API}/{conversation.pk}"

    response = api_client.post(f"{base}/messages/{user_message.pk}/edit", {"content": "uno"})

    assert response.status_code == 201
    body = response.json()
    assert body["user_message"]["parent_id"] == str(user_message.parent_id)
    assert body["current_leaf_id"] == body["assistant_message"]["id"]
    old = api_client.get(f"{base}/messages/{answer.pk}").json()
    assert (old["content"], old["status"]) == ("old answer", "complete")
    switched = api_client.post(f"{base}/branch", {"message_id": str(user_message.pk)}).json()
    assert [m["content"] for m in switched["messages"][1:]] == ["one", "old answer"]
    assert switched["current_leaf_id"] == str(answer.pk)


def test_edit_refuses_an_assistant_message(
    api_client: APIClient, conversation: Conversation
) -> None:
    _, answer = exchange(conversation, "one")

    response = api_client.post(
        f"{API}/{conversation.pk}/messages/{answer.pk}/edit", {"content": "x"}
    )

    assert_error(response, 400, "not_a_user_message")


def test_edit_checks_the_content_like_a_send(
    api_client: APIClient, conversation: Conversation
) -> None:
    user_message, _ = exchange(conversation, "one")
    url = f"{API}/{conversation.pk}/messages/{user_message.pk}/edit"

    assert_error(api_client.post(url, {"content": " "}), 400, "empty_message")
    too_long = "x" * (settings.MESSAGE_MAX_CHARS + 1)
    assert_error(api_client.post(url, {"content": too_long}), 413, "message_too_long")
    assert_error(api_client.post(url, {}, format="json"), 400, "missing_field")


def test_regenerate_adds_a_queued_sibling(
    api_client: APIClient, conversation: Conversation
) -> None:
    user_message, answer = exchange(conversation, "one")

    response = api_client.post(f"{API}/{conversation.pk}/messages/{answer.pk}/regenerate")

    assert response.status_code == 201
    body = response.json()
    assert body["assistant_message"]["parent_id"] == str(user_message.pk)
    assert body["assistant_message"]["status"] == "queued"
    assert body["current_leaf_id"] == body["assistant_message"]["id"]
    assert user_message.children.count() == 2


def test_regenerate_refuses_a_user_message(
    api_client: APIClient, conversation: Conversation
) -> None:
    user_message, _ = exchange(conversation, "one")

    response = api_client.post(f"{API}/{conversation.pk}/messages/{user_message.pk}/regenerate")

    assert_error(response, 400, "not_an_assistant_message")


def test_branch_refuses_the_root(api_client: APIClient, conversation: Conversation) -> None:
    response = api_client.post(
        f"{API}/{conversation.pk}/branch", {"message_id": str(conversation.current_leaf_id)}
    )

    assert_error(response, 400, "cannot_switch_to_root")


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({}, "missing_field"),
        ({"message_id": "nope"}, "invalid_message_id"),
        ({"message_id": 5}, "invalid_message_id"),
    ],
)
def test_branch_refuses_malformed_fields(
    api_client: APIClient, conversation: Conversation, body: dict[str, Any], code: str
) -> None:
    response = api_client.post(f"{API}/{conversation.pk}/branch", body, format="json")

    assert_error(response, 400, code)


def test_branch_to_a_message_of_another_conversation_is_404(
    api_client: APIClient, conversation: Conversation, user: Any
) -> None:
    elsewhere = ConversationFactory.create(owner=user)
    user_message, _ = exchange(elsewhere, "hi")

    response = api_client.post(
        f"{API}/{conversation.pk}/branch", {"message_id": str(user_message.pk)}
    )

    assert_error(response, 404, "not_found")


def test_a_message_under_another_conversations_url_is_404(
    api_client: APIClient, conversation: Conversation, user: Any
) -> None:
    elsewhere = ConversationFactory.create(owner=user)
    user_message, answer = exchange(elsewhere, "hi")
    base = f"{API}/{conversation.pk}/messages"

    assert_error(api_client.get(f"{base}/{user_message.pk}"), 404, "not_found")
    assert_error(
        api_client.post(f"{base}/{user_message.pk}/edit", {"content": "x"}), 404, "not_found"
    )
    assert_error(api_client.post(f"{base}/{answer.pk}/regenerate"), 404, "not_found")
    assert user_message.parent is not None
    assert user_message.parent.children.count() == 1


@pytest.mark.parametrize(
    "url",
    [
        f"{API}/not-a-uuid",
        f"{API}/12345/messages",
        f"{API}/00000000-0000-4000-8000-000000000000/messages/xyz",
    ],
)
def test_a_malformed_id_in_the_path_is_404(api_client: APIClient, url: str) -> None:
    assert api_client.get(url).status_code == 404


def test_rename_sets_the_title(api_client: APIClient, conversation: Conversation) -> None:
    response = api_client.patch(f"{API}/{conversation.pk}", {"title": "Lisbon"}, format="json")

    assert response.status_code == 200
    assert (response.json()["title"], response.json()["title_set_by_user"]) == ("Lisbon", True)
    conversation.refresh_from_db()
    assert conversation.title == "Lisbon"


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"title": "  "}, 400, "empty_title"),
        ({"title": "x" * 201}, 400, "title_too_long"),
        ({}, 400, "nothing_to_update"),
        ({"title": 5}, 400, "invalid_title"),
    ],
)
def test_rename_refuses_bad_titles(
    api_client: APIClient,
    conversation: Conversation,
    body: dict[str, Any],
    status: int,
    code: str,
) -> None:
    response = api_client.patch(f"{API}/{conversation.pk}", body, format="json")

    assert_error(response, status, code)


def test_delete_leaves_a_tombstone_that_reads_as_404_and_refuses_writes(
    api_client: APIClient, other_api_client: APIClient, conversation: Conversation
) -> None:
    user_message, answer = exchange(conversation, "one")
    url = f"{API}/{conversation.pk}"

    response = api_client.delete(url)

    assert response.status_code == 204
    assert not Message.objects.filter(conversation_id=conversation.pk).exists()
    assert Conversation.objects.get(pk=conversation.pk).deleted_at is not None
    assert_error(api_client.get(url), 404, "not_found")
    assert_error(api_client.delete(url), 404, "not_found")
    assert_error(api_client.patch(url, {"title": "x"}), 404, "not_found")
    assert_error(api_client.post(f"{url}/messages", {"content": "hi"}), 400, "conversation_deleted")
    assert_error(
        api_client.post(f"{url}/messages/{user_message.pk}/edit", {"content": "hi"}),
        400,
        "conversation_deleted",
    )
    assert_error(
        api_client.post(f"{url}/messages/{answer.pk}/regenerate"), 400, "conversation_deleted"
    )
    # Someone else still learns nothing about it.
    assert_error(other_api_client.post(f"{url}/messages", {"content": "hi"}), 404, "not_found")
    assert not Message.objects.filter(conversation_id=conversation.pk).exists()


def test_list_shows_the_sidebar_page(api_client: APIClient, user: Any) -> None:
    older = ConversationFactory.create(owner=user, title="Older")
    newer = ConversationFactory.create(owner=user, title="Newer")
    ConversationFactory.create(title="Someone else's")

    response = api_client.get(API)

    assert response.status_code == 200
    body = response.json()
    assert [c["id"] for c in body["results"]] == [str(newer.pk), str(older.pk)]
    assert body["next_cursor"] is None


@pytest.mark.parametrize("cursor", ["garbage", "bm90IGpzb24", "WzEsMl0", "WyJ4IiwieSJd"])
def test_list_refuses_a_bad_cursor(api_client: APIClient, cursor: str) -> None:
    assert_error(api_client.get(API, {"cursor": cursor}), 400, "invalid_cursor")


def test_list_refuses_a_bad_limit(api_client: APIClient) -> None:
    assert_error(api_client.get(API, {"limit": "many"}), 400, "invalid_limit")


def test_the_schema_describes_every_conversation_endpoint(api_client: APIClient) -> None:
    response = api_client.get("/api/schema/", {"format": "json"})

    assert response.status_code == 200
    paths = response.json()["paths"]
    for path, methods in {
        "/api/v1/conversations": {"get", "post"},
        "/api/v1/conversations/{conversation_id}": {"get", "patch", "delete"},
        "/api/v1/conversations/{conversation_id}/messages": {"post"},
        "/api/v1/conversations/{conversation_id}/messages/{message_id}": {"get"},
        "/api/v1/conversations/{conversation_id}/messages/{message_id}/edit": {"post"},
        "/api/v1/conversations/{conversation_id}/messages/{message_id}/regenerate": {"post"},
        "/api/v1/conversations/{conversation_id}/branch": {"post"},
    }.items():
        assert methods <= set(paths[path]), path
    send = paths["/api/v1/conversations/{conversation_id}/messages"]["post"]
    assert {"201", "400", "404", "409", "413"} <= set(send["responses"])


def test_a_send_that_fails_after_its_tree_change_writes_nothing(
    api_client: APIClient, conversation: Conversation, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The tree change takes no savepoint inside the turn's transaction: a failure after it
    # (here, starting the generation) rolls the messages back with the rest.
    def refuse(**_: Any) -> Generation:
        raise ServiceError("no_room", "No room for the answer.", status=503)

    real_start = turns.generation_start
    monkeypatch.setattr(turns, "generation_start", refuse)
    response = api_client.post(f"{API}/{conversation.pk}/messages", {"content": "one"})
    assert_error(response, 503, "no_room")
    assert Message.objects.filter(conversation=conversation).count() == 1  # the root
    conversation.refresh_from_db()
    assert conversation.current_leaf_id == Message.objects.get(conversation=conversation).pk

    monkeypatch.setattr(turns, "generation_start", real_start)
    again = api_client.post(f"{API}/{conversation.pk}/messages", {"content": "one"})
    assert again.status_code == 201, again.content
    assert Message.objects.filter(conversation=conversation).count() == 3
