"""The OpenAI-compatible API (`/v1`): request checks and error shapes in-process; whole and
streamed answers through a live edge, an in-process scheduler and a stand-in worker,
read with the official `openai` client. The same against real vLLM workers is in
test_openai_api_e2e.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client
from openai.types.chat import ChatCompletionMessageParam

from accounts.models import ApiKey
from accounts.services import api_key_create
from billing import quota
from billing.models import UsageEvent
from billing.tests.factories import subscribe
from chatsite.testing import assert_error, budget
from conversations.models import Conversation, Message
from conversations.openai_api.errors import from_service_error
from conversations.openai_api.shapes import Answer
from conversations.services import conversation_create
from conversations.turns import turn_send
from inference.models import Generation, ModelPool
from inference.tests.fixtures import (
    LiveEdge,
    register_pool,
    running_schedulers,
    stream_events,
    wait_for,
)

CHAT = "/v1/chat/completions"
DROP = object()  # a field left out of the request
HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello"}]


@pytest.fixture(autouse=True)
async def _close_thread_connections() -> AsyncIterator[None]:
    yield
    await sync_to_async(connections.close_all)()


def key_for(user: User, *, store: bool = True) -> str:
    return api_key_create(user=user, name="openai tests", store_conversations=store)[1]


def bearer_client(raw_key: str) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw_key}")


def assert_openai_error(
    response: Any, status: int, *, type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""
    assert response.status_code == status, response.content
    body = json.loads(response.content)
    assert set(body) == {"error"}
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    assert error["type"] == type
    assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    return error


# Authentication and models


@pytest.mark.django_db
def test_models_lists_only_the_pools_the_plan_may_use(user: User) -> None:
    ModelPool.objects.create(name="big-model", served_model="big", tiers=["pro"])
    ModelPool.objects.create(name="retired", served_model="old", is_active=False)

    response = bearer_client(key_for(user)).get("/v1/models")

    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    # The plan's pools, then `auto` (answered by the small pool or the large).
    assert [model["id"] for model in body["data"]] == ["smollm2-135m", "auto"]
    assert body["data"][0]["object"] == "model"
    assert isinstance(body["data"][0]["created"], int)
    assert response["x-ratelimit-limit-requests"]


@pytest.mark.django_db
def test_a_model_outside_the_plan_is_not_found(user: User) -> None:
    ModelPool.objects.create(name="big-model", served_model="big", tiers=["pro"])
    client = bearer_client(key_for(user))

    assert client.get("/v1/models/smollm2-135m").json()["id"] == "smollm2-135m"
    assert_openai_error(
        client.get("/v1/models/big-model"),
        404,
        type="not_found_error",
        param="model",
        code="model_not_found",
    )


@pytest.mark.django_db
def test_a_missing_or_bad_key_is_401(user: User) -> None:
    raw_key = key_for(user)
    ApiKey.objects.filter(user=user).update(revoked_at="2026-01-01T00:00:00Z")

    for client in (Client(), bearer_client("csk_nope"), bearer_client(raw_key)):
        for response in (client.get("/v1/models"), client.post(CHAT, {}, "application/json")):
            assert_openai_error(response, 401, type="authentication_error")
            assert response["WWW-Authenticate"] == "Bearer"


@pytest.mark.django_db
def test_a_session_cookie_does_not_authenticate_v1(user: User) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)

    response = client.post(CHAT, {"model": "smollm2-135m", "messages": HELLO}, "application/json")

    # Not a CSRF failure (403) and not the session's user: no key, no entry.
    assert_openai_error(response, 401, type="authentication_error", code="missing_api_key")
    assert not Conversation.objects.exists()


@pytest.mark.django_db
def test_v1_needs_no_csrf_token_with_a_key(user: User) -> None:
    client = Client(enforce_csrf_checks=True, HTTP_AUTHORIZATION=f"Bearer {key_for(user)}")
    response = client.post(CHAT, {"model": "nope", "messages": HELLO}, "application/json")
    assert_openai_error(response, 404, type="not_found_error", param="model")


# Request checks


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"model": DROP}, "model", "missing_required_parameter"),
        ({"model": 7, "messages": HELLO}, "model", "invalid_type"),
        ({"messages": DROP}, "messages", "missing_required_parameter"),
        ({"model": "smollm2-135m", "messages": "hi"}, "messages", "invalid_type"),
        ({"model": "smollm2-135m", "messages": []}, "messages", "invalid_value"),
        ({"messages": [{"content": "hi"}]}, "messages[0].role", "missing_required_parameter"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role", None),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "invalid_type"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content[0].type",
            "unsupported_value",
        ),
        (
            {"messages": [*HELLO, {"role": "assistant", "content": "Hi!"}]},
            "messages",
            "invalid_value",
        ),
        (
            # A tool result answers a call of the assistant message before it.
            {"messages": [*HELLO, {"role": "tool", "tool_call_id": "x", "content": "42"}]},
            "messages[1].tool_call_id",
            "invalid_value",
        ),
        ({"temperature": "hot"}, "temperature", "invalid_type"),
        ({"temperature": 2.5}, "temperature", "invalid_value"),
        ({"top_p": True}, "top_p", "invalid_type"),
        ({"max_tokens": 0}, "max_tokens", "invalid_value"),
        ({"max_tokens": 1.5}, "max_tokens", "invalid_type"),
        ({"max_completion_tokens": "10"}, "max_completion_tokens", "invalid_type"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "invalid_value"),
        ({"stop": [1]}, "stop[0]", "invalid_type"),
        ({"stream": "yes"}, "stream", "invalid_type"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "invalid_value"),
        (
            {"stream": True, "stream_options": {"include_usage": "yes"}},
            "stream_options.include_usage",
            "invalid_type",
        ),
        ({"n": 2}, "n", "unsupported_value"),
        ({"n": "1"}, "n", "invalid_type"),
        ({"user": 42}, "user", "invalid_type"),
    ],
)
@pytest.mark.django_db
def test_wrong_fields_are_refused_naming_the_field(
    user: User, body: dict[str, Any], param: str, code: str | None
) -> None:
    request = {"model": "smollm2-135m", "messages": HELLO, **body}
    request = {name: value for name, value in request.items() if value is not DROP}

    response = bearer_client(key_for(user)).post(CHAT, request, "application/json")

    assert_openai_error(response, 400, type="invalid_request_error", param=param, code=code)
    assert not Conversation.objects.exists()
    assert not Generation.objects.exists()


@pytest.mark.django_db
def test_a_body_that_is_not_json_is_400(user: User) -> None:
    response = bearer_client(key_for(user)).post(CHAT, "{oops", "application/json")
    assert_openai_error(response, 400, type="invalid_request_error", code="invalid_json")


@pytest.mark.django_db
def test_an_unknown_model_is_404_and_one_outside_the_plan_403(user: User) -> None:
    ModelPool.objects.create(name="big-model", served_model="big", tiers=["pro"])
    client = bearer_client(key_for(user))

    unknown = client.post(CHAT, {"model": "gpt-9", "messages": HELLO}, "application/json")
    outside = client.post(CHAT, {"model": "big-model", "messages": HELLO}, "application/json")

    assert_openai_error(unknown, 404, type="not_found_error", param="model", code="model_not_found")
    assert_openai_error(
        outside, 403, type="permission_error", param="model", code="model_not_in_plan"
    )
    assert not Conversation.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_quota_refusal_is_429_with_retry_after_and_leaves_nothing(user: User) -> None:
    subscribe(user, requests_per_minute=1)
    turn_send(user=user, conversation=conversation_create(owner=user), content="first")
    before = set(Conversation.objects.values_list("pk", flat=True))

    response = bearer_client(key_for(user)).post(
        CHAT, {"model": "smollm2-135m", "messages": HELLO}, "application/json"
    )

    error = assert_openai_error(
        response, 429, type="rate_limit_error", code="rate_limited_requests"
    )
    assert "requests per minute" in error["message"]
    assert int(response["Retry-After"]) >= 1
    assert response["x-ratelimit-limit-requests"] == "1"
    assert response["x-ratelimit-remaining-requests"] == "0"
    assert set(Conversation.objects.values_list("pk", flat=True)) == before


@pytest.mark.django_db
def test_too_many_requests_from_one_address_are_refused_before_the_key_is_read(
    user: User, settings: Any
) -> None:
    settings.BILLING_ABUSE_RATES = {**settings.BILLING_ABUSE_RATES, "message_post": "2/h"}
    client = bearer_client("csk_not-a-key")
    body = {"model": "smollm2-135m", "messages": HELLO}

    statuses = [client.post(CHAT, body, "application/json").status_code for _ in range(2)]
    refused = client.post(CHAT, body, "application/json")

    assert statuses == [401, 401]
    assert_openai_error(refused, 429, type="rate_limit_error", code="rate_limited")
    assert int(refused["Retry-After"]) >= 1


def test_service_errors_map_to_openai_types() -> None:
    from chatsite.errors import ServiceError

    too_long = from_service_error(ServiceError("message_too_long", "Too long.", status=413))
    suspended = from_service_error(ServiceError("account_suspended", "Suspended.", status=403))
    tokens = from_service_error(
        ServiceError("rate_limited_tokens", "Later.", status=429, detail={"retry_after": 7})
    )
    broken = from_service_error(ServiceError("tokenizer_missing", "No tokenizer.", status=503))

    assert (too_long.status, too_long.type, too_long.param) == (
        400,
        "invalid_request_error",
        "messages",
    )
    assert (suspended.status, suspended.type, suspended.code) == (
        403,
        "permission_error",
        "account_suspended",
    )
    assert (tokens.status, tokens.type, tokens.retry_after) == (429, "rate_limit_error", 7)
    assert tokens.response()["Retry-After"] == "7"
    assert (broken.status, broken.type) == (503, "server_error")


def test_a_retracted_answer_ends_with_content_filter_and_no_text() -> None:
    answer = Answer()
    assert answer.apply("delta", {"text": "some bad "}) == "some bad "
    answer.apply("retract", {"reason": "content_filter", "categories": ["S1"]})
    assert answer.apply("delta", {"text": "words"}) == ""
    answer.apply("done", {"status": "complete", "finish_reason": "content_filter"})

    assert answer.text == ""
    assert answer.finish_reason == "content_filter"


def test_a_restart_starts_the_text_over_and_unknown_reasons_read_as_stop() -> None:
    answer = Answer()
    answer.apply("delta", {"text": "first try"})
    answer.apply("restart", {"reason": "worker_disconnected", "attempt": 2})
    answer.apply("delta", {"text": "second"})
    answer.apply("done", {"status": "complete", "finish_reason": "abort", "output_tokens": 3})

    assert answer.text == "second"
    assert answer.finish_reason == "stop"
    assert answer.usage() == {"prompt_tokens": 0, "completion_tokens": 3, "total_tokens": 3}


def test_the_usage_says_what_the_prefix_cache_saved() -> None:
    answer = Answer()
    answer.apply("delta", {"text": "hi"})
    done = {"status": "complete", "finish_reason": "stop", "prompt_tokens": 700}
    answer.apply("done", {**done, "output_tokens": 2, "cached_tokens": 512})
    assert answer.usage() == {
        "prompt_tokens": 700,
        "completion_tokens": 2,
        "total_tokens": 702,
        "prompt_tokens_details": {"cached_tokens": 512},
    }


# Whole and streamed answers through a live edge, with the official client


def async_openai(edge: LiveEdge, raw_key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{edge.url}/v1", api_key=raw_key, max_retries=0)


async def generation_of(conversation_id: Any) -> Generation:
    return await Generation.objects.select_related("message").aget(conversation_id=conversation_id)


@pytest.mark.django_db(transaction=True)
async def test_a_whole_answer_is_a_chat_completion_stored_as_an_api_conversation(
    user: User, fake_workers: Any, live_edge: LiveEdge
) -> None:
    fake = fake_workers(tokens=6)
    await sync_to_async(register_pool)(fake)
    raw_key = await sync_to_async(key_for)(user)
    client = async_openai(live_edge, raw_key)

    async with running_schedulers():
        raw = await client.chat.completions.with_raw_response.create(
            model="smollm2-135m",
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": [{"type": "text", "text": "How are you?"}]},
            ],
            temperature=0.3,
            top_p=0.9,
            stop=["\n\n"],
            max_tokens=4,
            user="customer-7",
            extra_body={"some_future_field": {"x": 1}},
        )
    completion = raw.parse()

    assert completion.object == "chat.completion"
    assert completion.model == "smollm2-135m"
    [choice] = completion.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == "tok0 tok1 tok2 tok3 "
    assert choice.finish_reason == "length"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (11, 4)
    assert completion.usage.total_tokens == 15
    assert raw.headers["x-ratelimit-limit-requests"]

    [sent] = fake.requests
    assert sent["temperature"] == 0.3 and sent["top_p"] == 0.9 and sent["stop"] == ["\n\n"]
    assert sent["max_tokens"] == 4
    assert "some_future_field" not in sent and "user" not in sent
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "user"]
    assert sent["messages"][-1]["content"] == "How are you?"

    conversation_id = raw.headers["x-chatsite-conversation-id"]
    conversation = await Conversation.objects.aget(pk=conversation_id)
    assert conversation.source == Conversation.Source.API
    assert conversation.system_prompt == "Be brief."
    rows = [
        m async for m in Message.objects.filter(conversation=conversation).order_by("created_at")
    ]
    assert [(m.role, m.content) for m in rows] == [
        ("system", "Be brief."),
        ("user", "Hi"),
        ("assistant", "Hello!"),
        ("user", "How are you?"),
        ("assistant", "tok0 tok1 tok2 tok3 "),
    ]
    assert completion.id == f"chatcmpl-{(await generation_of(conversation_id)).pk}"


@pytest.mark.django_db(transaction=True)
async def test_a_pools_sampling_defaults_fill_in_what_a_request_leaves_out(
    user: User, fake_workers: Any, live_edge: LiveEdge
) -> None:
    fake = fake_workers(tokens=6)
    pool = await sync_to_async(register_pool)(fake)
    pool.sampling_defaults = {"temperature": 0.9, "seed": 7, "min_tokens": 50}
    await pool.asave(update_fields=["sampling_defaults"])
    client = async_openai(live_edge, await sync_to_async(key_for)(user))

    async with running_schedulers():
        await client.chat.completions.create(
            model="smollm2-135m",
            messages=[{"role": "user", "content": "Hi"}],
            temperature=0.3,
            max_tokens=4,
        )
        await client.chat.completions.create(
            model="smollm2-135m", messages=[{"role": "user", "content": "Hi"}]
        )

    chosen, left_out = fake.requests
    # The request's own temperature wins; the least it writes is held to what it allows.
    assert (chosen["temperature"], chosen["seed"], chosen["min_tokens"]) == (0.3, 7, 4)
    assert (left_out["temperature"], left_out["seed"], left_out["min_tokens"]) == (0.9, 7, 50)


@pytest.mark.django_db(transaction=True)
async def test_sends_arriving_at_once_each_get_their_own_answer_and_one_charge(
    user: User, fake_workers: Any, live_edge: LiveEdge
) -> None:
    """The edge runs these sends' database work on a pool of threads (EDGE_SYNC_THREADS):
    each still gets its own conversation, answer and usage event, and an unkept key's
    conversations are all gone after."""
    await sync_to_async(subscribe)(user)  # room for twelve at once
    fake = fake_workers(tokens=3)
    await sync_to_async(register_pool)(fake)
    raw_key = await sync_to_async(key_for)(user, store=False)
    client = async_openai(live_edge, raw_key)

    async def ask(index: int) -> str:
        completion = await client.chat.completions.create(
            model="smollm2-135m", messages=[{"role": "user", "content": f"question {index}"}]
        )
        return completion.choices[0].message.content or ""

    async with running_schedulers():
        answers = await asyncio.gather(*(ask(index) for index in range(12)))

    assert answers == ["tok0 tok1 tok2 "] * 12
    asked = sorted(request["messages"][-1]["content"] for request in fake.requests)
    assert asked == sorted(f"question {index}" for index in range(12))
    assert await UsageEvent.objects.filter(user=user).acount() == 12
    assert not await Conversation.objects.filter(owner=user).aexists()


@pytest.mark.django_db(transaction=True)
async def test_a_streamed_answer_is_chunks_with_usage_and_done(
    user: User, fake_workers: Any, live_edge: LiveEdge
) -> None:
    fake = fake_workers(tokens=20, token_delay=0.02)
    await sync_to_async(register_pool)(fake)
    raw_key = await sync_to_async(key_for)(user)
    client = async_openai(live_edge, raw_key)

    async with running_schedulers():
        stream = await client.chat.completions.create(
            model="smollm2-135m",
            messages=HELLO,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]

    assert {chunk.object for chunk in chunks} == {"chat.completion.chunk"}
    assert len({chunk.id for chunk in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "".join(f"tok{i} " for i in range(20))
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 3
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == ["stop"]
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (11, 20)


@pytest.mark.django_db(transaction=True)
async def test_a_stream_carries_the_rate_limit_headers_and_ends_with_done(
    user: User, fake_workers: Any, live_edge: LiveEdge
) -> None:
    fake = fake_workers(tokens=3)
    await sync_to_async(register_pool)(fake)
    raw_key = await sync_to_async(key_for)(user)
    body = {"model": "smollm2-135m", "messages": HELLO, "stream": True}

    async with (
        running_schedulers(),
        httpx.AsyncClient(timeout=budget(60)) as http,
        http.stream(
            "POST",
            f"{live_edge.url}{CHAT}",
            json=body,
            headers={"Authorization": f"Bearer {raw_key}"},
        ) as response,
    ):
        lines = [line async for line in response.aiter_lines() if line]

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    # The caller's buckets as this request left them: its request counted, its tokens held.
    limit = int(response.headers["x-ratelimit-limit-requests"])
    assert int(response.headers["x-ratelimit-remaining-requests"]) == limit - 1
    tokens = int(response.headers["x-ratelimit-limit-tokens"])
    assert 0 <= int(response.headers["x-ratelimit-remaining-tokens"]) < tokens
    assert lines[-1] == "data: [DONE]"
    # No usage chunk unless asked for, and no `usage` key in the chunks either.
    assert all('"usage"' not in line for line in lines)


@pytest.mark.django_db(transaction=True)
async def test_a_key_that_keeps_nothing_leaves_only_the_usage(
    user: User, fake_workers: Any, live_edge: LiveEdge
) -> None:
    fake = fake_workers(tokens=5)
    await sync_to_async(register_pool)(fake)
    raw_key = await sync_to_async(key_for)(user, store=False)
    client = async_openai(live_edge, raw_key)

    async with running_schedulers():
        raw = await client.chat.completions.with_raw_response.create(
            model="smollm2-135m", messages=HELLO
        )
        stream = await client.chat.completions.create(
            model="smollm2-135m", messages=HELLO, stream=True
        )
        streamed = [chunk async for chunk in stream]
    completion = raw.parse()

    assert completion.choices[0].message.content == "tok0 tok1 tok2 tok3 tok4 "
    assert "x-chatsite-conversation-id" not in raw.headers
    assert streamed[-1].choices[0].finish_reason == "stop"
    assert not await Conversation.objects.filter(owner=user).aexists()
    assert not await Message.objects.filter(conversation__owner=user).aexists()
    assert not await Generation.objects.filter(user=user).aexists()
    events = [e async for e in UsageEvent.objects.filter(user=user)]
    assert len(events) == 2
    assert {(e.prompt_tokens, e.output_tokens, e.status) for e in events} == {(11, 5, "complete")}
    generation_ids = {str(completion.id).removeprefix("chatcmpl-"), streamed[0].id[9:]}
    assert {str(e.generation_id) for e in events} == generation_ids
    # The edge read both answers from the worker (inference/relay.py): their streams carry
    # the scheduler's order and the text once, not a delta a token.
    for generation_id in generation_ids:
        names = [name for name, _ in await sync_to_async(stream_events)(generation_id)]
        assert names == ["meta", "relay", "delta", "done"]
    # The reservations were settled with the real usage: nothing is held any more.
    for generation_id in generation_ids:
        assert (
            await sync_to_async(quota.held)(user_id=user.pk, reservation_id=generation_id) is None
        )


@pytest.mark.django_db(transaction=True)
async def test_closing_the_stream_cancels_the_generation_and_charges_what_was_made(
    user: User, fake_workers: Any, live_edge: LiveEdge
) -> None:
    fake = fake_workers(tokens=2000, token_delay=0.01)
    await sync_to_async(register_pool)(fake)
    raw_key = await sync_to_async(key_for)(user, store=False)
    client = async_openai(live_edge, raw_key)

    async with running_schedulers():
        stream = await client.chat.completions.create(
            model="smollm2-135m", messages=HELLO, stream=True
        )
        received = ""
        async for chunk in stream:
            received += chunk.choices[0].delta.content or ""
            if len(received) > 20:
                break
        generation_id = chunk.id.removeprefix("chatcmpl-")
        await stream.close()

        async def settled() -> bool:
            return await UsageEvent.objects.filter(generation_id=generation_id).aexists()

        await wait_for(settled)
        await wait_for(lambda: _gone(user))

    async def aborted() -> bool:
        return fake.aborted == 1

    # The worker sees its connection closed at its next write.
    await wait_for(aborted)
    event = await UsageEvent.objects.aget(generation_id=generation_id)
    assert event.status == Generation.Status.CANCELLED
    assert 0 < event.output_tokens < 2000
    assert await sync_to_async(quota.held)(user_id=user.pk, reservation_id=generation_id) is None


async def _gone(user: User) -> bool:
    return not await Conversation.objects.filter(owner=user).aexists()


@pytest.mark.django_db(transaction=True)
async def test_an_answer_rejected_in_the_queue_is_a_503_or_an_error_event(
    user: User, live_edge: LiveEdge, settings: Any
) -> None:
    # With no worker the answer is refused once it has waited a second: a slower machine only
    # makes it wait longer before the refusal.
    settings.SCHEDULER_MAX_QUEUE_SECONDS = 1
    await sync_to_async(register_pool)()  # no worker: the queue times out
    raw_key = await sync_to_async(key_for)(user)
    client = async_openai(live_edge, raw_key)

    async with running_schedulers():
        with pytest.raises(openai.InternalServerError) as whole:
            await client.chat.completions.create(model="smollm2-135m", messages=HELLO)
        stream = await client.chat.completions.create(
            model="smollm2-135m", messages=HELLO, stream=True
        )
        with pytest.raises(openai.APIError) as streamed:
            async for _ in stream:
                pass

    assert whole.value.status_code == 503
    assert whole.value.body["type"] == "server_error"  # type: ignore[index]
    assert whole.value.body["code"] == "queue_timeout"  # type: ignore[index]
    assert "queue_timeout" in str(streamed.value.body)


# The per-key setting on the keys API and page


@pytest.mark.django_db
def test_the_keys_api_creates_and_changes_the_storage_setting(api_client: Any) -> None:
    created = api_client.post(
        "/api/v1/api-keys", {"name": "bot", "store_conversations": False}, format="json"
    )
    assert created.status_code == 201
    assert created.json()["store_conversations"] is False

    changed = api_client.patch(
        f"/api/v1/api-keys/{created.json()['id']}", {"store_conversations": True}, format="json"
    )

    assert changed.status_code == 200
    assert changed.json()["store_conversations"] is True
    assert ApiKey.objects.get(pk=created.json()["id"]).store_conversations is True
    default = api_client.post("/api/v1/api-keys", {"name": "plain"}, format="json")
    assert default.json()["store_conversations"] is True


@pytest.mark.django_db
def test_another_users_key_setting_cannot_be_changed(api_client: Any, other_user: User) -> None:
    theirs, _ = api_key_create(user=other_user, name="theirs")
    response = api_client.patch(
        f"/api/v1/api-keys/{theirs.pk}", {"store_conversations": False}, format="json"
    )
    assert_error(response, 404, "not_found")
    assert ApiKey.objects.get(pk=theirs.pk).store_conversations is True


@pytest.mark.django_db
def test_the_keys_page_shows_and_changes_the_storage_setting(user: User, other_user: User) -> None:
    key, _ = api_key_create(user=user, name="laptop")
    theirs, _ = api_key_create(user=other_user, name="theirs")
    client = Client()
    client.force_login(user)

    page = client.get("/accounts/api-keys/")
    assert b"kept as conversations" in page.content
    assert f"/accounts/api-keys/{key.pk}/storage/".encode() in page.content

    response = client.post(f"/accounts/api-keys/{key.pk}/storage/", {})
    assert response.status_code == 302
    key.refresh_from_db()
    assert key.store_conversations is False
    client.post(f"/accounts/api-keys/{key.pk}/storage/", {"store_conversations": "on"})
    key.refresh_from_db()
    assert key.store_conversations is True

    assert client.post(f"/accounts/api-keys/{theirs.pk}/storage/", {}).status_code == 404
    theirs.refresh_from_db()
    assert theirs.store_conversations is True

    created = client.post("/accounts/api-keys/", {"name": "unkept"})
    assert created.status_code == 200
    assert ApiKey.objects.get(user=user, name="unkept").store_conversations is False
