"""A request that finds Redis away answers 503 with Retry-After in its API's own shape, never
a 500, and writes nothing it would then lose (the client sends it again)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from accounts.services import api_key_create
from chatsite import redis as chatsite_redis
from conversations.models import Message
from conversations.services import conversation_create
from conversations.turns import turn_send
from inference.tests.fixtures import register_pool


@pytest.fixture
def redis_away(settings: Any) -> Iterator[None]:
    """Redis at an address where nothing listens, for the code under test only."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings.REDIS_URL = f"redis://127.0.0.1:{port}/0"
    settings.CACHES = {"default": {**settings.CACHES["default"], "LOCATION": settings.REDIS_URL}}
    chatsite_redis._pooled.cache_clear()
    yield
    chatsite_redis._pooled.cache_clear()


def _bearer(user: User) -> str:
    return f"Bearer {api_key_create(user=user, name='outage', scope='full')[1]}"


@pytest.mark.django_db(transaction=True)
def test_a_message_sent_while_redis_is_away_is_refused_with_503_and_not_kept(
    user: User, redis_away: None
) -> None:
    register_pool()
    conversation = conversation_create(owner=user)
    client = APIClient(HTTP_AUTHORIZATION=_bearer(user))

    response = client.post(
        f"/api/v1/conversations/{conversation.id}/messages", {"content": "Hi"}, format="json"
    )

    assert response.status_code == 503, response.content
    assert response["Retry-After"] == "2"
    assert json.loads(response.content)["error"]["code"] == "service_unavailable"
    assert not Message.objects.filter(conversation=conversation, role="user").exists()


@pytest.mark.django_db(transaction=True)
def test_v1_while_redis_is_away_answers_503_in_openais_shape(user: User, redis_away: None) -> None:
    register_pool()
    client = Client(HTTP_AUTHORIZATION=_bearer(user))

    response = client.post(
        "/v1/chat/completions",
        {"model": "smollm2-135m", "messages": [{"role": "user", "content": "Hi"}]},
        content_type="application/json",
    )

    assert response.status_code == 503, response.content
    assert response["Retry-After"] == "2"
    error = json.loads(response.content)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "server_error" and error["code"] == "service_unavailable"


@pytest.mark.django_db(transaction=True)
def test_a_stream_opened_while_redis_is_away_answers_503(
    user: User, settings: Any, request: pytest.FixtureRequest
) -> None:
    register_pool()
    turn = turn_send(user=user, conversation=conversation_create(owner=user), content="Hi")
    request.getfixturevalue("redis_away")
    client = APIClient(HTTP_AUTHORIZATION=_bearer(user))

    response = client.get(f"/api/v1/generations/{turn.generation.id}/stream")

    assert response.status_code == 503, getattr(response, "content", b"")
    assert json.loads(response.content)["error"]["code"] == "service_unavailable"
