"""A client's JSON body: every way it can be wrong is one `BadJSON`, never another exception;
and the APIs answer each with a 4xx in their own shape, a body too large with 413 before it
is read."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from django.test import Client
from hypothesis import given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from accounts.services import api_key_create
from chatsite import jsonbody
from conversations.openai_api.errors import OpenAIError
from conversations.openai_api.parsing import parse_chat_completion
from conversations.tests.factories import ConversationFactory
from inference.models import ModelPool

DEEP = b"[" * 10_000 + b"]" * 10_000
DEEP_OBJECT = b'{"a":' * 10_000 + b"1" + b"}" * 10_000


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (DEEP, "nested too deep"),
        (b'{"max_tokens": NaN}', "NaN is not a JSON number"),
        (b'{"max_tokens": Infinity}', "Infinity is not a JSON number"),
        (b'{"max_tokens": -Infinity}', "-Infinity is not a JSON number"),
        (b'{"max_tokens": 1e400}', "too large"),
        (b'{"text": "\xff\xfe"}', "not UTF-8"),
        (b'{"a": 1', "not valid JSON"),
        (b"9" * 5000, "not valid JSON"),  # past Python's digit limit for int()
        (b'{"content": "half \\ud83d of a pair"}', "lone surrogate"),
        (b'{"tools": {"\\udfff": true}}', "lone surrogate"),
        (b'[[["\\uDBFF"]]]', "lone surrogate"),
        (b'{"content": "a\\u0000b"}', "NUL character"),
    ],
)
def test_what_json_does_not_allow_is_refused_with_a_reason(raw: bytes, why: str) -> None:
    with pytest.raises(jsonbody.BadJSON, match=why):
        jsonbody.loads(raw)


def test_json_is_read_as_json() -> None:
    assert jsonbody.loads(b'{"a": [1, 2.5, "\xc3\xa9", null, true]}') == {
        "a": [1, 2.5, "é", None, True]
    }
    assert jsonbody.loads("1e300") == 1e300
    # A pair of surrogate escapes is one character; an escaped backslash is no escape.
    assert jsonbody.loads(b'["\\ud83d\\ude00", "\\\\u0000"]') == ["\U0001f600", "\\u0000"]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_are_json_or_bad_json(raw: bytes) -> None:
    try:
        value = jsonbody.loads(raw)
    except jsonbody.BadJSON as exc:
        assert str(exc)
    else:
        assert value == json.loads(raw.decode("utf-8"))


# Values of any JSON shape, in the places of a chat completion's fields.
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
FIELDS = st.sampled_from(
    [
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "n",
        "stream",
        "stream_options",
        "stop",
        "tools",
        "tool_choice",
        "seed",
        "user",
    ]
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(FIELDS, JSON_VALUES, max_size=6))
def test_the_v1_parser_takes_a_request_or_refuses_it_in_openais_shape(body: dict[str, Any]) -> None:
    body.setdefault("model", "smollm2-135m")
    try:
        wanted = parse_chat_completion(json.dumps(body).encode())
    except OpenAIError as exc:
        assert 400 <= exc.status < 500 and exc.message
    else:
        assert wanted.model == str(body["model"]).strip()


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(categories=["Cs", "Cc", "Lu", "Ll", "Nd", "Zs"]), max_size=12))
def test_any_text_in_a_v1_message_is_taken_as_utf_8_text_or_refused(text: str) -> None:
    """Surrogates included: what is taken can be stored and echoed; the rest is a 400."""
    body = {"model": "smollm2-135m", "messages": [{"role": "user", "content": text}]}
    try:
        wanted = parse_chat_completion(json.dumps(body).encode())
    except OpenAIError as exc:
        assert exc.status == 400 and exc.message.encode("utf-8")
    else:
        ((_, content, _),) = wanted.messages
        # As JSON reads it: two surrogates that make a pair are one character.
        assert content == json.loads(json.dumps(text)) and "\x00" not in content
        content.encode("utf-8")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_the_v1_parser_refuses_any_bytes_in_openais_shape(raw: bytes) -> None:
    # Random bytes are never a whole request (no model and messages): always a 400.
    with pytest.raises(OpenAIError) as refused:
        parse_chat_completion(raw)
    assert refused.value.status == 400


# Through the endpoints


def _openai_error(response: Any, status: int, code: str) -> None:
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"].startswith("application/json")
    error = response.json()["error"]
    assert error["code"] == code and error["message"] and error["type"]


def _service_error(response: Any, status: int, code: str) -> None:
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert body["error"]["code"] == code and body["error"]["message"]


@pytest.fixture
def raw_key(user: Any) -> str:
    return api_key_create(user=user, name="bad input")[1]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "raw",
    [
        DEEP,
        DEEP_OBJECT,
        b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}], '
        b'"max_tokens": 1e400}',
        b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}], '
        b'"max_tokens": NaN}',
        b'{"model": "smollm2-135m", "temperature": Infinity}',
        b'{"model": "\xff"}',
    ],
)
def test_v1_answers_malformed_json_with_400_in_openais_shape(raw_key: str, raw: bytes) -> None:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    response = client.post("/v1/chat/completions", raw, content_type="application/json")
    _openai_error(response, 400, "invalid_json")


@pytest.mark.django_db
@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "a\\ud800", "messages": [{"role": "user", "content": "hi"}]}',
        b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "h\\ud800i"}]}',
        b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "h\\u0000i"}]}',
    ],
)
def test_v1_answers_text_postgres_cannot_hold_with_400_not_500(raw_key: str, raw: bytes) -> None:
    """A lone surrogate or a NUL, echoed in an error or written to Postgres, was a 500."""
    ModelPool.objects.get_or_create(name="smollm2-135m", defaults={"served_model": "fake"})
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    response = client.post("/v1/chat/completions", raw, content_type="application/json")
    _openai_error(response, 400, "invalid_json")


@pytest.mark.django_db
def test_a_body_past_the_limit_is_413_before_it_is_read(raw_key: str, settings: Any) -> None:
    settings.API_MAX_BODY_BYTES = 1024 * 1024
    big = json.dumps(
        {"model": "smollm2-135m", "messages": [{"role": "user", "content": "x" * (3 << 20)}]}
    )
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    _openai_error(
        client.post("/v1/chat/completions", big, content_type="application/json"),
        413,
        "request_too_large",
    )
    api = Client(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    _service_error(
        api.post("/api/v1/conversations", big, content_type="application/json"),
        413,
        "request_too_large",
    )
    # Under the limit, the same endpoints read the body as before.
    small = json.dumps({"model": "smollm2-135m", "messages": "not a list"})
    _openai_error(
        client.post("/v1/chat/completions", small, content_type="application/json"),
        400,
        "invalid_type",
    )


@pytest.mark.django_db
@pytest.mark.parametrize("raw", [DEEP, DEEP_OBJECT, b'{"title": NaN}', b'{"title": "\xff"}'])
def test_the_api_answers_malformed_json_with_400_in_its_shape(
    api_client: APIClient, user: Any, raw: bytes
) -> None:
    response = api_client.post("/api/v1/conversations", raw, content_type="application/json")
    _service_error(response, 400, "malformed_request")
    conversation = ConversationFactory.create(owner=user).pk
    response = api_client.post(
        f"/api/v1/conversations/{conversation}/messages", raw, content_type="application/json"
    )
    _service_error(response, 400, "malformed_request")


@pytest.mark.django_db
def test_a_tool_switch_named_with_a_lone_surrogate_is_400_not_500(
    api_client: APIClient, user: Any
) -> None:
    """A 500 before: the unknown name was echoed in the error, which could not be written as
    UTF-8 (the schema fuzz, chatsite/tests/test_schema_fuzz.py, generates no lone surrogate)."""
    conversation = ConversationFactory.create(owner=user).pk
    response = api_client.patch(
        f"/api/v1/conversations/{conversation}/tools",
        b'{"tools": {"calc\\ud800": true}}',
        content_type="application/json",
    )
    _service_error(response, 400, "malformed_request")


@pytest.mark.django_db
def test_a_sidebar_cursor_of_deep_json_is_an_invalid_cursor(api_client: APIClient) -> None:
    cursor = base64.urlsafe_b64encode(DEEP).decode().rstrip("=")
    response = api_client.get("/api/v1/conversations", {"cursor": cursor})
    _service_error(response, 400, "invalid_cursor")
