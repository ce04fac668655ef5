"""Who may touch what: another user's objects are 404 everywhere, strangers get 401, and
browser sessions need a CSRF token while API keys do not."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from rest_framework.test import APIClient

from accounts.models import ApiKey
from accounts.services import api_key_create
from conversations.models import Conversation, Feedback, Message, Share
from conversations.services import feedback_set, share_create

from .factories import ConversationFactory, exchange

pytestmark = pytest.mark.django_db


@dataclass
class Victim:
    """Objects of `other_user`, and one conversation of `user` to mix them with."""

    conversation: Conversation
    user_message: Message
    answer: Message
    own_conversation: Conversation
    api_key: ApiKey
    share: Share

    def rows(self) -> tuple[Any, ...]:
        conversation = Conversation.objects.get(pk=self.conversation.pk)
        return (
            conversation.title,
            conversation.current_leaf_id,
            conversation.deleted_at,
            sorted(
                Message.objects.filter(conversation=conversation).values_list(
                    "id", "content", "status", "current_child_id"
                )
            ),
            ApiKey.objects.get(pk=self.api_key.pk).revoked_at,
            list(Share.objects.filter(conversation=conversation).values_list("id", "revoked_at")),
            list(Feedback.objects.values_list("message_id", "rating", "reason")),
        )


@pytest.fixture
def victim(user: Any, other_user: Any) -> Victim:
    conversation = ConversationFactory.create(owner=other_user, title="Private")
    user_message, answer = exchange(conversation, "a secret")
    key, _ = api_key_create(user=other_user, name="private")
    feedback_set(message=answer, user=other_user, rating="up")
    return Victim(
        conversation=conversation,
        user_message=user_message,
        answer=answer,
        own_conversation=ConversationFactory.create(owner=user),
        api_key=key,
        share=share_create(conversation=conversation),
    )


C = "/api/v1/conversations/{conversation}"
OWN = "/api/v1/conversations/{own}"

# Every endpoint and method that names an object, with a body that would otherwise succeed.
ENDPOINTS = [
    ("get", C, None),
    ("patch", C, {"title": "Mine now"}),
    ("delete", C, None),
    ("post", C + "/messages", {"content": "hello"}),
    ("post", C + "/messages", {"content": "hello", "parent_id": "{answer}"}),
    ("post", OWN + "/messages", {"content": "hello", "parent_id": "{answer}"}),
    ("get", C + "/messages/{user_message}", None),
    ("get", OWN + "/messages/{user_message}", None),
    ("post", C + "/messages/{user_message}/edit", {"content": "edited"}),
    ("post", OWN + "/messages/{user_message}/edit", {"content": "edited"}),
    ("post", C + "/messages/{answer}/regenerate", None),
    ("post", OWN + "/messages/{answer}/regenerate", None),
    ("post", C + "/branch", {"message_id": "{user_message}"}),
    ("post", OWN + "/branch", {"message_id": "{user_message}"}),
    ("get", "/api/v1/api-keys/{api_key}", None),
    ("delete", "/api/v1/api-keys/{api_key}", None),
    ("post", C + "/shares", None),
    ("post", "/api/v1/shares/{share}/revoke", None),
    ("put", C + "/messages/{answer}/feedback", {"rating": "down", "reason": "other"}),
    ("put", OWN + "/messages/{answer}/feedback", {"rating": "down", "reason": "other"}),
    ("delete", C + "/messages/{answer}/feedback", None),
    ("delete", OWN + "/messages/{answer}/feedback", None),
]
# A mention of another user's message in a body of one's own conversation is a bad reference,
# not a hidden object: it is answered like any unknown id.
EXPECTED = {("post", OWN + "/messages"): (400, "unknown_parent")}


def fill(template: Any, victim: Victim) -> Any:
    if template is None:
        return None
    if isinstance(template, dict):
        return {key: fill(value, victim) for key, value in template.items()}
    return template.format(
        conversation=victim.conversation.pk,
        own=victim.own_conversation.pk,
        user_message=victim.user_message.pk,
        answer=victim.answer.pk,
        api_key=victim.api_key.pk,
        share=victim.share.pk,
    )


def call(client: APIClient, method: str, url: str, body: Any) -> Any:
    return getattr(client, method)(url, body, format="json")


@pytest.mark.parametrize(("method", "url", "body"), ENDPOINTS)
def test_another_users_objects_are_404_and_untouched(
    api_client: APIClient, victim: Victim, method: str, url: str, body: Any
) -> None:
    before = victim.rows()

    response = call(api_client, method, fill(url, victim), fill(body, victim))

    status, code = EXPECTED.get((method, url), (404, "not_found"))
    assert response.status_code == status, response.content
    assert response.json()["error"]["code"] == code
    assert victim.rows() == before
    assert "secret" not in response.content.decode()


@pytest.mark.parametrize(("method", "url", "body"), ENDPOINTS)
def test_a_session_user_gets_the_same_404(
    session_client: APIClient, victim: Victim, method: str, url: str, body: Any
) -> None:
    session_client.get("/")
    token = session_client.cookies["csrftoken"].value

    response = getattr(session_client, method)(
        fill(url, victim), fill(body, victim), format="json", HTTP_X_CSRFTOKEN=token
    )

    assert response.status_code == EXPECTED.get((method, url), (404,))[0]


@pytest.mark.parametrize(
    ("method", "url", "body"),
    [
        ("get", "/api/v1/conversations", None),
        ("post", "/api/v1/conversations", {}),
        ("get", "/api/v1/api-keys", None),
        *ENDPOINTS,
    ],
)
def test_an_anonymous_call_is_401(victim: Victim, method: str, url: str, body: Any) -> None:
    response = call(APIClient(), method, fill(url, victim), fill(body, victim))

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "not_authenticated"
    assert response.headers["WWW-Authenticate"] == "Bearer"


def test_a_wrong_api_key_is_401(victim: Victim) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer csk_not-a-real-key")

    response = client.get("/api/v1/conversations")

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "authentication_failed"


@pytest.fixture
def own(user: Any) -> Conversation:
    conversation = ConversationFactory.create(owner=user)
    exchange(conversation, "one")
    return conversation


# Each unsafe method a browser session can call, and what it answers once the token is there.
WRITES = [
    ("post", "/api/v1/conversations", {}, 201),
    ("patch", "/api/v1/conversations/{id}", {"title": "Renamed"}, 200),
    ("delete", "/api/v1/conversations/{id}", None, 204),
    ("post", "/api/v1/conversations/{id}/messages", {"content": "two"}, 201),
    ("post", "/api/v1/conversations/{id}/shares", None, 201),
    ("post", "/api/v1/api-keys", {"name": "laptop"}, 201),
]


@pytest.mark.parametrize(("method", "url", "body", "status"), WRITES)
def test_a_session_write_without_a_csrf_token_is_403(
    session_client: APIClient, own: Conversation, method: str, url: str, body: Any, status: int
) -> None:
    before = Message.objects.count(), Conversation.objects.filter(deleted_at=None).count()

    response = getattr(session_client, method)(url.format(id=own.pk), body, format="json")

    assert response.status_code == 403
    assert response.json()["error"]["code"] == "permission_denied"
    assert "CSRF" in response.json()["error"]["message"]
    assert (Message.objects.count(), Conversation.objects.filter(deleted_at=None).count()) == (
        before
    )


@pytest.mark.parametrize(("method", "url", "body", "status"), WRITES)
def test_a_session_write_with_the_csrf_token_succeeds(
    session_client: APIClient, own: Conversation, method: str, url: str, body: Any, status: int
) -> None:
    session_client.get("/")
    token = session_client.cookies["csrftoken"].value

    response = getattr(session_client, method)(
        url.format(id=own.pk), body, format="json", HTTP_X_CSRFTOKEN=token
    )

    assert response.status_code == status, response.content


@pytest.mark.parametrize(("method", "url", "body", "status"), WRITES)
def test_an_api_key_write_needs_no_csrf_token(
    user: Any, own: Conversation, method: str, url: str, body: Any, status: int
) -> None:
    _, raw_key = api_key_create(user=user, name="script", scope=ApiKey.Scope.FULL)
    client = APIClient(enforce_csrf_checks=True)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")

    response = getattr(client, method)(url.format(id=own.pk), body, format="json")

    assert response.status_code == status, response.content
