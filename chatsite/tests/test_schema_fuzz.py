"""The JSON API against its own OpenAPI schema: schemathesis generates requests for every
operation the schema lists (valid ones and ones that break it), sends them to the app in this
process with a real API key, and checks that none gets a 5xx and that every answer is shaped
as the schema says for its status.

Each request is pointed at the caller's own rows (a conversation, its messages, a generation,
a key), so that it reaches the code behind the lookup rather than stopping at 404.

Bounded and deterministic: a few examples per operation (derandomized: the same requests on
every run, a few seconds in all), each against the same database and Redis (its writes are
rolled back, Redis is emptied), so no example depends on what an earlier one wrote. Sending a
message only queues its answer after commit, which never comes here: no worker is needed.

The schema's responses are accurate enough to check every answer's body against them; its
statuses are not all listed (the API keys' 400 and 404, every 401/403/405/415), so the status
code check is left off.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
import schemathesis
from django.conf import settings
from django.core import signals
from django.db import close_old_connections, transaction
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.renderers import OpenApiJsonRenderer
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from rest_framework.test import APIClient
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from accounts.models import ApiKey
from accounts.services import api_key_create
from chatsite.redis import sync_redis
from chatsite.testing import assert_error, budget
from chatsite.wsgi import application
from conversations.services import conversation_create, message_send
from conversations.tests.factories import finish, sent
from conversations.turns import turn_send
from inference.models import ModelPool

# The schema as /api/schema/ serves it, as JSON (what a client generator reads).
RAW_SCHEMA: dict[str, Any] = json.loads(
    OpenApiJsonRenderer().render(SchemaGenerator().get_schema(request=None, public=True))
)
schema = schemathesis.openapi.from_dict(RAW_SCHEMA)
schema.app = application

CHECKS = [not_a_server_error, response_schema_conformance]


@dataclass(frozen=True)
class Seeded:
    """What the generated requests are pointed at: the caller's own rows, so that a request
    reaches the code behind the lookup instead of stopping at 404."""

    raw_key: str
    path_values: dict[str, Any]

    def point(self, case: schemathesis.Case) -> None:
        """Replace the generated path parameters with the seeded rows' ids (the message by
        what the operation takes: a user message to edit, an answer to regenerate)."""
        values = dict(self.path_values)
        if case.path.endswith("/regenerate"):
            values["message_id"] = values.pop("answer_id")
        for name in list(case.path_parameters or {}):
            if name in values:
                case.path_parameters[name] = values[name]


@pytest.fixture
def seeded(user: Any) -> Seeded:
    """The caller with a full-scope key and a second key, a conversation answered once (a
    send, an edit or a regeneration in it is taken), and another whose answer is queued (no
    worker: it stays queued) for the generation's routes."""
    ModelPool.objects.get_or_create(
        name=settings.DEFAULT_MODEL, defaults={"served_model": settings.DEFAULT_MODEL}
    )
    _, raw_key = api_key_create(user=user, name="schema fuzz", scope=ApiKey.Scope.FULL)
    other_key, _ = api_key_create(user=user, name="another key")
    answered = conversation_create(owner=user)
    question, answer = sent(message_send(conversation=answered, content="Hello?"))
    finish(answer, "Hello!")
    queued = turn_send(user=user, conversation=conversation_create(owner=user), content="Hi")
    return Seeded(
        raw_key=raw_key,
        path_values={
            "conversation_id": str(answered.pk),
            "message_id": str(question.pk),
            "answer_id": str(answer.pk),
            "generation_id": str(queued.generation.pk),
            "key_id": other_key.pk,
        },
    )


@pytest.fixture
def connection_kept_across_requests() -> Iterator[None]:
    """As Django's test client does: the app's end-of-request handler would close the test's
    connection (and with it the transaction every example runs in)."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


@pytest.mark.django_db
@pytest.mark.usefixtures("connection_kept_across_requests")
# Both limits are failure points only (scaled budgets), far above what the run and a request
# take even on a loaded machine: only a run or a request that hangs trips them.
@pytest.mark.timeout(budget(300))
@schema.parametrize()
@hypothesis_settings(
    max_examples=10,
    deadline=timedelta(seconds=budget(10)),
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_no_request_gets_a_server_error_and_every_answer_fits_the_schema(
    case: schemathesis.Case, seeded: Seeded
) -> None:
    seeded.point(case)
    sync_redis().flushdb()
    with transaction.atomic():
        response = case.call(
            headers={"Authorization": f"Bearer {seeded.raw_key}"},
            # A server always names the peer (werkzeug's test client does not).
            environ_base={"REMOTE_ADDR": "127.0.0.1"},
        )
        transaction.set_rollback(True)
    case.validate_response(response, checks=CHECKS)


@pytest.mark.parametrize(
    ("path", "component", "required"),
    [
        ("/api/v1/conversations/{conversation_id}/tools", "ConversationToolSwitch", "tools"),
        ("/api/v1/api-keys/{key_id}", "ApiKeyUpdate", "store_conversations"),
    ],
)
@pytest.mark.django_db
def test_each_patch_documents_the_field_it_refuses_to_go_without(
    seeded: Seeded, path: str, component: str, required: str
) -> None:
    """These PATCH views are not partial updates: the schema says so, and a body without the
    field is a 400. (A conversation's PATCH is partial, any of title, folder, pinned and
    archived: an empty one is refused as `nothing_to_update`, conversations/tests/test_api.py.)"""
    body = RAW_SCHEMA["paths"][path]["patch"]["requestBody"]
    assert body["required"] is True
    assert body["content"]["application/json"]["schema"]["$ref"].endswith(f"/{component}")
    assert required in RAW_SCHEMA["components"]["schemas"][component]["required"]

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {seeded.raw_key}")
    url = path.format(**seeded.path_values)
    assert_error(client.patch(url, {}, format="json"), 400, "missing_field")
