"""API key scopes: a chat key chats (/v1, conversations, messages, generations) and cannot
manage the account (API keys, billing); a full key and a session can. Revoked keys are 401
everywhere from their next request on."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIClient

from accounts.models import ApiKey
from accounts.services import api_key_create, api_key_revoke
from chatsite.errors import ServiceError
from chatsite.testing import assert_error
from conversations.models import Conversation
from conversations.services import conversation_create
from inference.models import ModelPool

pytestmark = pytest.mark.django_db

KEYS = "/api/v1/api-keys"


def bearer(raw_key: str) -> APIClient:
    client = APIClient(enforce_csrf_checks=True)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client


@pytest.fixture
def chat_key(user: User) -> tuple[ApiKey, str]:
    return api_key_create(user=user, name="bot", scope=ApiKey.Scope.CHAT)


@pytest.fixture
def full_key(user: User) -> tuple[ApiKey, str]:
    return api_key_create(user=user, name="admin script", scope=ApiKey.Scope.FULL)


@pytest.fixture
def conversation(user: User) -> Conversation:
    ModelPool.objects.get_or_create(
        name=settings.DEFAULT_MODEL, defaults={"served_model": settings.DEFAULT_MODEL}
    )
    return conversation_create(owner=user, title="Scoped")


def test_a_chat_key_chats_over_the_conversation_api(
    chat_key: tuple[ApiKey, str], conversation: Conversation
) -> None:
    client = bearer(chat_key[1])

    created = client.post("/api/v1/conversations", {}, format="json")
    sent = client.post(
        f"/api/v1/conversations/{conversation.pk}/messages", {"content": "Hi"}, format="json"
    )

    assert created.status_code == 201, created.content
    assert sent.status_code == 201, sent.content
    generation_id = sent.json()["generation"]["id"]
    assert client.get(f"/api/v1/generations/{generation_id}").status_code == 200
    assert client.get(f"/api/v1/conversations/{conversation.pk}").status_code == 200
    assert client.get(f"/api/v1/conversations/{conversation.pk}/tools").status_code == 200
    cancel = client.post(f"/api/v1/generations/{generation_id}/cancel", format="json")
    assert cancel.status_code == 200, cancel.content


def test_a_chat_key_chats_over_v1(
    chat_key: tuple[ApiKey, str], conversation: Conversation, own_catalog_version: None
) -> None:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {chat_key[1]}")

    response = client.get("/v1/models")

    assert response.status_code == 200, response.content
    assert settings.DEFAULT_MODEL in [model["id"] for model in response.json()["data"]]


@pytest.mark.parametrize(
    ("method", "url", "body"),
    [
        ("get", KEYS, None),
        ("post", KEYS, {"name": "escalated"}),
        ("post", KEYS, {"name": "escalated", "scope": "full"}),
        ("post", KEYS, {"name": "sideways", "scope": "chat"}),
        ("get", KEYS + "/{full}", None),
        ("patch", KEYS + "/{full}", {"store_conversations": False}),
        ("delete", KEYS + "/{full}", None),
        ("delete", KEYS + "/{chat}", None),
        ("get", "/api/v1/billing/usage", None),
        ("get", "/api/v1/billing/statements", None),
    ],
)
def test_a_chat_key_cannot_manage_the_account(
    chat_key: tuple[ApiKey, str],
    full_key: tuple[ApiKey, str],
    method: str,
    url: str,
    body: Any,
) -> None:
    before = sorted(ApiKey.objects.values_list("pk", "revoked_at", "store_conversations"))

    response = getattr(bearer(chat_key[1]), method)(
        url.format(full=full_key[0].pk, chat=chat_key[0].pk), body, format="json"
    )

    error = assert_error(response, 403, "insufficient_scope")
    assert error["detail"] == {"key_scope": "chat", "required_scope": "full"}
    assert "full" in error["message"]
    assert sorted(ApiKey.objects.values_list("pk", "revoked_at", "store_conversations")) == before


def test_a_full_key_creates_lists_and_revokes_keys(full_key: tuple[ApiKey, str]) -> None:
    client = bearer(full_key[1])

    plain = client.post(KEYS, {"name": "bot"}, format="json")
    wide = client.post(KEYS, {"name": "deploy", "scope": "full"}, format="json")
    listing = client.get(KEYS)
    revoked = client.delete(f"{KEYS}/{plain.json()['id']}")

    assert plain.status_code == 201 and wide.status_code == 201
    assert plain.json()["scope"] == "chat", "a new key is chat only unless asked"
    assert wide.json()["scope"] == "full"
    assert {key["name"]: key["scope"] for key in listing.json()} == {
        "bot": "chat",
        "deploy": "full",
        "admin script": "full",
    }
    assert revoked.status_code == 204
    assert ApiKey.objects.get(pk=plain.json()["id"]).revoked_at is not None
    assert client.get("/api/v1/billing/usage").status_code == 200


def test_a_scope_that_does_not_exist_is_400(full_key: tuple[ApiKey, str]) -> None:
    response = bearer(full_key[1]).post(KEYS, {"name": "x", "scope": "admin"}, format="json")

    assert_error(response, 400, "invalid_scope")
    assert not ApiKey.objects.filter(name="x").exists()


def test_a_session_manages_keys_of_any_scope(session_client: APIClient) -> None:
    session_client.get("/")
    token = session_client.cookies["csrftoken"].value

    response = session_client.post(
        KEYS, {"name": "deploy", "scope": "full"}, format="json", HTTP_X_CSRFTOKEN=token
    )
    revoked = session_client.delete(f"{KEYS}/{response.json()['id']}", HTTP_X_CSRFTOKEN=token)

    assert response.status_code == 201, response.content
    assert response.json()["scope"] == "full"
    assert revoked.status_code == 204
    assert session_client.get("/api/v1/billing/statements").status_code == 200


def test_a_key_never_creates_a_wider_key(user: User, chat_key: tuple[ApiKey, str]) -> None:
    with pytest.raises(ServiceError) as refused:
        api_key_create(user=user, name="wider", scope=ApiKey.Scope.FULL, created_with=chat_key[0])

    assert refused.value.code == "insufficient_scope"
    assert refused.value.status == 403
    assert not ApiKey.objects.filter(name="wider").exists()
    narrower, _ = api_key_create(
        user=user, name="narrower", scope=ApiKey.Scope.CHAT, created_with=chat_key[0]
    )
    assert narrower.scope == ApiKey.Scope.CHAT


def test_a_revoked_key_is_401_everywhere_at_once(
    user: User, chat_key: tuple[ApiKey, str], full_key: tuple[ApiKey, str]
) -> None:
    api = bearer(full_key[1])
    v1 = Client(HTTP_AUTHORIZATION=f"Bearer {full_key[1]}")
    assert api.get("/api/v1/conversations").status_code == 200
    assert v1.get("/v1/models").status_code == 200

    api_key_revoke(user=user, key_id=full_key[0].pk)

    assert_error(api.get("/api/v1/conversations"), 401, "authentication_failed")
    assert_error(api.get(KEYS), 401, "authentication_failed")
    assert v1.get("/v1/models").status_code == 401
    events = Client(HTTP_AUTHORIZATION=f"Bearer {full_key[1]}").get("/api/v1/events/stream")
    assert_error(events, 401, "not_authenticated")
    # The other key goes on.
    assert bearer(chat_key[1]).get("/api/v1/conversations").status_code == 200


def test_the_keys_page_creates_a_key_of_the_chosen_scope_and_shows_it(
    client: Client, user: User
) -> None:
    client.force_login(user)

    client.post("/accounts/api-keys/", {"name": "default"})
    client.post("/accounts/api-keys/", {"name": "deploy", "scope": "full"})
    page = client.get("/accounts/api-keys/").content.decode()

    assert ApiKey.objects.get(user=user, name="default").scope == ApiKey.Scope.CHAT
    assert ApiKey.objects.get(user=user, name="deploy").scope == ApiKey.Scope.FULL
    assert 'name="scope"' in page
    assert "Chat only" in page and "Full account" in page


def test_admin_lists_the_scope(admin_client: Client, full_key: tuple[ApiKey, str]) -> None:
    page = admin_client.get("/admin/accounts/apikey/").content.decode()

    assert "Full account" in page
    assert "column-scope" in page


def _api_routes(patterns: list[URLPattern | URLResolver], prefix: str = "") -> dict[str, str]:
    """Every route's name under /api/v1/ and /v1/, with the scope its view requires."""
    routes: dict[str, str] = {}
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            routes.update(_api_routes(pattern.url_patterns, route))
        elif route.startswith(("api/v1/", "v1/")) and pattern.name:
            view = getattr(pattern.callback, "cls", None)
            routes[pattern.name] = str(getattr(view, "required_scope", ApiKey.Scope.CHAT))
    return routes


def test_every_api_route_has_a_decided_scope() -> None:
    """A new endpoint is chat unless it says otherwise: this list makes that a decision."""
    full = {
        "api-key-list",
        "api-key-detail",
        "billing-usage",
        "billing-statements",
        "account-export",
    }
    chat = {
        "models",
        "model",
        "chat-completions",
        "user-event-stream",
        "conversation-list",
        "conversation-detail",
        "message-list",
        "message-detail",
        "message-edit",
        "message-regenerate",
        "branch-switch",
        "folder-list",
        "folder-detail",
        "message-search",
        "conversation-export-json",
        "conversation-export-markdown",
        "import-list",
        "import-detail",
        "conversation-share",
        "share-list",
        "share-revoke",
        "message-feedback",
        "attachment-list",
        "attachment-detail",
        "attachment-content",
        "personalization",
        "memory-list",
        "memory-detail",
        "memory-confirm",
        "memory-dismiss",
        "conversation-tools",
        "generation-detail",
        "generation-stream",
        "generation-cancel",
    }

    routes = _api_routes(get_resolver().url_patterns)

    assert routes == {name: "full" for name in full} | {name: "chat" for name in chat}
