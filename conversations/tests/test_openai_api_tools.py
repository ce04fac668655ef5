"""Client-defined tools on `/v1/chat/completions` (OpenAI's function calling): `tools` and
`tool_choice` checked, the model's calls handed back as `tool_calls` (whole and streamed),
the client's `tool` messages written to the branch and the answer continuing from them.

The fast tests run a live edge, an in-process scheduler and a stand-in worker that
answers with scripted calls; the last one (marker e2e) runs the real vLLM worker."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import openai
import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client
from openai.types.chat import (
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionMessageParam,
    ChatCompletionToolParam,
)

from accounts.services import api_key_create
from chatsite.testing import budget
from conversations.models import Conversation, Message
from conversations.openai_api.shapes import Answer
from inference.models import Generation, Worker
from inference.tests.fixtures import LiveEdge, RealWorker, register_pool, running_schedulers

from .browser_conftest import register_real_workers

CHAT = "/v1/chat/completions"
MODEL = "smollm2-135m"
QUESTION: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is the weather in Paris?"}
]
WEATHER: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
FORCED: Any = {"type": "function", "function": {"name": "get_weather"}}
ARGUMENTS = '{"city": "Paris"}'


@pytest.fixture(autouse=True)
async def _close_thread_connections() -> AsyncIterator[None]:
    yield
    await sync_to_async(connections.close_all)()


def key_for(user: User) -> str:
    return api_key_create(user=user, name="tools tests", store_conversations=True)[1]


def async_openai(edge: LiveEdge, raw_key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{edge.url}/v1", api_key=raw_key, max_retries=0)


def call_message(call_id: str, arguments: str = ARGUMENTS) -> ChatCompletionMessageParam:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": "get_weather", "arguments": arguments},
            }
        ],
    }


def result_message(call_id: str, content: str = "18 C, sunny") -> ChatCompletionMessageParam:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def continued(message: Any, call_id: str, result: str = "18 C, sunny") -> list[Any]:
    """The question, the assistant's message with its calls as the client got it, and the
    result of the call: what a client sends to have the answer continue."""
    return [*QUESTION, message.model_dump(exclude_none=True), result_message(call_id, result)]


# Request checks

TOOL = json.loads(json.dumps(WEATHER))
CALLED = [*QUESTION, call_message("call-1")]


def _tool(**function: Any) -> dict[str, Any]:
    return {"type": "function", "function": {**TOOL["function"], **function}}


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"tools": TOOL}, "tools", "invalid_type"),
        ({"tools": []}, "tools", "invalid_value"),
        ({"tools": ["get_weather"]}, "tools[0]", "invalid_type"),
        ({"tools": [{**TOOL, "type": "retrieval"}]}, "tools[0].type", "unsupported_value"),
        ({"tools": [{"type": "function"}]}, "tools[0].function", "missing_required_parameter"),
        ({"tools": [_tool(name=7)]}, "tools[0].function.name", "invalid_type"),
        ({"tools": [_tool(name="get weather")]}, "tools[0].function.name", "invalid_value"),
        ({"tools": [_tool(name="x" * 65)]}, "tools[0].function.name", "invalid_value"),
        ({"tools": [TOOL, TOOL]}, "tools[1].function.name", "invalid_value"),
        ({"tools": [_tool(description=1)]}, "tools[0].function.description", "invalid_type"),
        ({"tools": [_tool(parameters="city")]}, "tools[0].function.parameters", "invalid_type"),
        (
            {"tools": [_tool(parameters={"type": "string"})]},
            "tools[0].function.parameters",
            "invalid_value",
        ),
        (
            {"tools": [_tool(parameters={"type": "object", "properties": 3})]},
            "tools[0].function.parameters",
            "invalid_value",
        ),
        ({"tool_choice": "auto"}, "tool_choice", "invalid_value"),
        ({"tools": [TOOL], "tool_choice": "always"}, "tool_choice", "invalid_value"),
        ({"tools": [TOOL], "tool_choice": 1}, "tool_choice", "invalid_type"),
        (
            {"tools": [TOOL], "tool_choice": {"type": "function"}},
            "tool_choice.function",
            "missing_required_parameter",
        ),
        (
            {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice.function.name",
            "invalid_value",
        ),
        # The tool loop in `messages`.
        (
            {"messages": [*CALLED, result_message("call-2")]},
            "messages[2].tool_call_id",
            "invalid_value",
        ),
        (
            {"messages": [*QUESTION, result_message("call-1")]},
            "messages[1].tool_call_id",
            "invalid_value",
        ),
        (
            {"messages": [*CALLED, result_message("call-1"), result_message("call-1")]},
            "messages[3].tool_call_id",
            "invalid_value",
        ),
        (
            {"messages": [*CALLED, {"role": "tool", "content": "18 C"}]},
            "messages[2].tool_call_id",
            "missing_required_parameter",
        ),
        ({"messages": CALLED}, "messages[1].tool_calls", "invalid_value"),
        (
            {"messages": [*CALLED, {"role": "user", "content": "And?"}]},
            "messages[1].tool_calls",
            "invalid_value",
        ),
        (
            {"messages": [*QUESTION, {"role": "assistant", "tool_calls": "get_weather"}]},
            "messages[1].tool_calls",
            "invalid_type",
        ),
        (
            {"messages": [*QUESTION, {"role": "assistant", "tool_calls": [{"id": "c"}]}]},
            "messages[1].tool_calls[0].type",
            "missing_required_parameter",
        ),
        (
            {"messages": [*QUESTION, call_message("call-1", arguments={"city": "Paris"})]},  # type: ignore[arg-type]
            "messages[1].tool_calls[0].function.arguments",
            "invalid_type",
        ),
        (
            {"messages": [*QUESTION, {"role": "function", "name": "f", "content": "1"}]},
            "messages[1].role",
            "unsupported_value",
        ),
        (
            {
                "messages": [
                    *CALLED,
                    result_message("call-1"),
                    {"role": "assistant", "content": "18"},
                ]
            },
            "messages",
            "invalid_value",
        ),
    ],
)
@pytest.mark.django_db
def test_wrong_tools_and_tool_loops_are_refused_naming_the_field(
    user: User, body: dict[str, Any], param: str, code: str
) -> None:
    request = {"model": MODEL, "messages": QUESTION, **body}
    client = Client(HTTP_AUTHORIZATION=f"Bearer {key_for(user)}")

    response = client.post(CHAT, request, "application/json")

    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
    assert error["message"]
    assert not Conversation.objects.exists()
    assert not Generation.objects.exists()


def test_an_answer_that_ends_in_calls_carries_them_and_a_withdrawn_one_does_not() -> None:
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    answer = Answer()
    answer.apply("tool_calls", {"tool_calls": calls})
    answer.apply("done", {"status": "complete", "finish_reason": "tool_calls"})
    assert answer.finish_reason == "tool_calls"
    assert answer.message() == {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "tool_calls": calls,
    }

    withdrawn = Answer()
    withdrawn.apply("tool_calls", {"tool_calls": calls})
    withdrawn.apply("retract", {})
    withdrawn.apply("done", {"status": "complete", "finish_reason": "tool_calls"})
    assert withdrawn.finish_reason == "content_filter"
    assert "tool_calls" not in withdrawn.message()


# Calls handed to the client and its results sent back, through a live edge


async def _rows(conversation_id: str) -> list[Message]:
    query = Message.objects.filter(conversation_id=conversation_id).order_by("created_at")
    return [message async for message in query]


@pytest.mark.django_db(transaction=True)
async def test_a_forced_call_comes_back_to_the_client_and_its_result_continues_the_answer(
    user: User, fake_workers: Any, live_edge: LiveEdge
) -> None:
    fake = fake_workers(tokens=3, tool_calls=[("get_weather", ARGUMENTS)])
    await sync_to_async(register_pool)(fake)
    client = async_openai(live_edge, await sync_to_async(key_for)(user))

    async with running_schedulers():
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=QUESTION, tools=[WEATHER], tool_choice=FORCED
        )
        called = raw.parse()
        [choice] = called.choices
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        [call] = choice.message.tool_calls or []
        assert call.type == "function"
        assert (call.id, call.function.name, call.function.arguments) == (
            "call-0",
            "get_weather",
            ARGUMENTS,
        )

        answered = await client.chat.completions.create(
            model=MODEL,
            messages=continued(choice.message, call.id),
            tools=[WEATHER],
        )

    assert answered.choices[0].finish_reason == "stop"
    assert answered.choices[0].message.content == "tok0 tok1 tok2 "
    assert answered.choices[0].message.tool_calls is None

    first, second = fake.requests
    assert first["tools"] == [WEATHER]
    assert first["tool_choice"] == FORCED
    assert second["tools"] == [WEATHER] and "tool_choice" not in second
    assert second["messages"][1:] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call-0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ARGUMENTS},
                }
            ],
        },
        {"role": "tool", "content": "18 C, sunny", "tool_call_id": "call-0"},
    ]

    # The calls are kept on the answer's message, and the client's loop on the new branch.
    first_rows = await _rows(raw.headers["x-chatsite-conversation-id"])
    assert first_rows[-1].metadata["tool_calls"][0]["id"] == "call-0"
    generation = await Generation.objects.aget(pk=answered.id.removeprefix("chatcmpl-"))
    rows = await _rows(str(generation.conversation_id))
    assert [(m.role, m.content) for m in rows] == [
        ("system", ""),
        ("user", "What is the weather in Paris?"),
        ("assistant", ""),
        ("tool", "18 C, sunny"),
        ("assistant", "tok0 tok1 tok2 "),
    ]
    assert rows[3].metadata == {"tool_call_id": "call-0", "name": "get_weather"}


@pytest.mark.django_db(transaction=True)
async def test_streamed_calls_arrive_as_tool_call_chunks(
    user: User, fake_workers: Any, live_edge: LiveEdge
) -> None:
    calls = [("get_weather", ARGUMENTS), ("get_weather", '{"city": "Lyon"}')]
    fake = fake_workers(tool_calls=calls)
    await sync_to_async(register_pool)(fake)
    client = async_openai(live_edge, await sync_to_async(key_for)(user))

    async with running_schedulers():
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            tools=[WEATHER],
            tool_choice="auto",
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]

    assert fake.requests[0]["tool_choice"] == "auto"
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert deltas, "no tool_calls chunk"
    assembled: dict[int, dict[str, str]] = {}
    for delta in deltas:
        entry = assembled.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
        if delta.id:
            assert delta.type == "function"
            entry["id"] = delta.id
        if delta.function is not None:
            entry["name"] += delta.function.name or ""
            entry["arguments"] += delta.function.arguments or ""
    assert assembled == {
        0: {"id": "call-0", "name": "get_weather", "arguments": ARGUMENTS},
        1: {"id": "call-1", "name": "get_weather", "arguments": '{"city": "Lyon"}'},
    }
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == ["tool_calls"]
    assert chunks[-1].usage is not None


@pytest.mark.django_db(transaction=True)
async def test_a_worker_that_cannot_call_tools_is_a_clear_400(
    user: User, fake_workers: Any, live_edge: LiveEdge
) -> None:
    fake = fake_workers(refuse_tools=True)
    await sync_to_async(register_pool)(fake)
    client = async_openai(live_edge, await sync_to_async(key_for)(user))

    async with running_schedulers():
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(
                model=MODEL, messages=QUESTION, tools=[WEATHER], tool_choice="required"
            )
        # Without tools the same worker answers.
        plain = await client.chat.completions.create(model=MODEL, messages=QUESTION)

    body: Any = refused.value.body
    assert (body["code"], body["param"]) == ("tools_unsupported", "tools")
    assert "tool" in body["message"]
    assert plain.choices[0].message.content


@pytest.mark.django_db(transaction=True)
async def test_a_clients_tools_reach_a_worker_that_serves_without_our_plugins(
    user: User, fake_workers: Any, live_edge: LiveEdge
) -> None:
    # A worker that once refused the plugins' tools answers the web chat without them; a
    # client's tools are still sent there, never dropped in silence.
    fake = fake_workers(tool_calls=[("get_weather", ARGUMENTS)])
    await sync_to_async(register_pool)(fake)
    worker = await Worker.objects.aget(url=fake.url)
    client = async_openai(live_edge, await sync_to_async(key_for)(user))

    async with running_schedulers() as [replica]:
        replica.no_tool_workers.add(worker.pk)
        called = await client.chat.completions.create(
            model=MODEL, messages=QUESTION, tools=[WEATHER], tool_choice="required"
        )

    assert fake.requests[0]["tools"] == [WEATHER]
    assert called.choices[0].finish_reason == "tool_calls"


# With the real vLLM worker (its tool-call parser and chat template)


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_real_model_calls_a_client_tool_and_answers_from_its_result(
    user: User,
    real_workers: list[RealWorker],
    live_edge: LiveEdge,
    scheduler: Callable[..., Any],
) -> None:
    register_real_workers(real_workers, max_output_tokens=256)
    scheduler()
    client = openai.OpenAI(
        base_url=f"{live_edge.url}/v1",
        api_key=key_for(user),
        max_retries=0,
        timeout=budget(180),  # a real model's answer
    )

    called = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        tools=[WEATHER],
        tool_choice=FORCED,
        max_tokens=48,
        temperature=0,
    )
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            tools=[WEATHER],
            tool_choice=FORCED,
            max_tokens=48,
            temperature=0,
            stream=True,
        )
    )

    [choice] = called.choices
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls or []
    assert isinstance(call, ChatCompletionMessageFunctionToolCall)
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments).get("city"), str)
    streamed = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert streamed[0].id and streamed[0].function and streamed[0].function.name == "get_weather"
    json.loads("".join(d.function.arguments or "" for d in streamed if d.function))
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"

    answered = client.chat.completions.create(
        model=MODEL,
        messages=continued(choice.message, call.id, "It is 18 degrees and sunny in Paris."),
        tools=[WEATHER],
        tool_choice="none",
        max_tokens=32,
        temperature=0,
    )
    assert answered.choices[0].finish_reason in {"stop", "length"}
    assert answered.choices[0].message.tool_calls is None
    assert (answered.choices[0].message.content or "").strip()
