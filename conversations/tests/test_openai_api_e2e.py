"""The OpenAI-compatible API end to end, with the official `openai` package as the client:
a live edge, a scheduler process and the real vLLM workers serving SmolLM2."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai
import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.utils import timezone
from openai.types.chat import ChatCompletionMessageParam

from accounts.services import api_key_create
from billing.models import UsageEvent
from billing.tests.factories import subscribe
from chatsite.testing import budget, wait_for, wait_until
from conversations.models import Conversation
from inference.models import Generation, ModelPool
from inference.tests.fixtures import LiveEdge, RealWorker, aborted_in_vllm

from .browser_conftest import register_real_workers

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

MODEL = "smollm2-135m"
QUESTION: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "You are a helpful assistant. Answer in one sentence."},
    {"role": "user", "content": "What is bread made of?"},
]
MAX_TOKENS = 16


@pytest.fixture
def stack(
    real_workers: list[RealWorker], live_edge: LiveEdge, scheduler: Callable[..., Any]
) -> LiveEdge:
    """The real workers registered, a scheduler process running, the edge answering."""
    register_real_workers(real_workers, max_output_tokens=256)
    scheduler()
    return live_edge


def sdk(edge: LiveEdge, raw_key: str) -> openai.OpenAI:
    # A real model's answer on CPU workers.
    return openai.OpenAI(
        base_url=f"{edge.url}/v1", api_key=raw_key, max_retries=0, timeout=budget(180)
    )


def key_for(user: User, *, store: bool = True) -> str:
    return api_key_create(user=user, name="e2e", store_conversations=store)[1]


def test_the_sync_client_gets_whole_and_streamed_answers_with_usage(
    user: User, stack: LiveEdge
) -> None:
    client = sdk(stack, key_for(user))

    models = client.models.list()
    completion = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=MAX_TOKENS, temperature=0
    )
    chunks = list(
        client.chat.completions.create(
            # `auto` picks the small pool for a short question: the same model answers.
            model="auto",
            messages=QUESTION,
            max_completion_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )

    assert [model.id for model in models.data] == [MODEL, "auto"]
    text = completion.choices[0].message.content
    assert text and text.strip()
    assert completion.choices[0].finish_reason in {"stop", "length"}
    assert completion.usage is not None
    assert completion.usage.prompt_tokens > 10
    assert 0 < completion.usage.completion_tokens <= MAX_TOKENS
    generation = Generation.objects.get(pk=completion.id.removeprefix("chatcmpl-"))
    assert generation.status == Generation.Status.COMPLETE
    assert generation.message.content == text
    assert (generation.prompt_tokens, generation.output_tokens) == (
        completion.usage.prompt_tokens,
        completion.usage.completion_tokens,
    )
    assert generation.conversation.source == Conversation.Source.API

    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed.strip()
    assert {c.model for c in chunks} == {MODEL}
    # Greedy decoding of the same prompt: the same answer, streamed in pieces.
    assert streamed == text
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == completion.usage.completion_tokens
    # Its usage reaches the ledger in the scheduler's next batch.
    events = UsageEvent.objects.filter(generation_id=chunks[0].id.removeprefix("chatcmpl-"))
    wait_until(events.exists, what="the streamed answer's usage event")
    assert events.get().output_tokens == chunks[-1].usage.completion_tokens


async def test_the_async_client_streams_and_an_unkept_key_leaves_only_usage(
    user: User, stack: LiveEdge
) -> None:
    raw_key = await sync_to_async(key_for)(user, store=False)
    client = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=raw_key, max_retries=0)

    stream = await client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        max_tokens=MAX_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    whole = await client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=MAX_TOKENS
    )

    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip()
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert whole.choices[0].message.content
    assert not await Conversation.objects.filter(owner=user).aexists()
    assert not await Generation.objects.filter(user=user).aexists()

    # An unkept answer's usage reaches the ledger in the scheduler's next batch.
    async def both_recorded() -> bool:
        return await UsageEvent.objects.filter(user=user).acount() == 2

    await wait_for(both_recorded)
    charged = {
        str(e.generation_id): e.output_tokens async for e in UsageEvent.objects.filter(user=user)
    }
    assert charged == {
        chunks[0].id.removeprefix("chatcmpl-"): chunks[-1].usage.completion_tokens,
        whole.id.removeprefix("chatcmpl-"): whole.usage.completion_tokens if whole.usage else -1,
    }


def test_refusals_raise_the_sdks_exceptions(user: User, stack: LiveEdge) -> None:
    ModelPool.objects.create(name="pro-only", served_model=MODEL, tiers=["pro"])
    subscribe(user, tier="free", message_cap=1, message_cap_window_seconds=3600)
    client = sdk(stack, key_for(user))

    with pytest.raises(openai.AuthenticationError):
        sdk(stack, "csk_not-a-key").chat.completions.create(model=MODEL, messages=QUESTION)
    with pytest.raises(openai.PermissionDeniedError) as outside:
        client.chat.completions.create(model="pro-only", messages=QUESTION)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=QUESTION)
    client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4)
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4)

    assert outside.value.code == "model_not_in_plan"
    assert refused.value.code == "message_cap_reached"
    assert refused.value.type == "rate_limit_error"
    assert int(refused.value.response.headers["retry-after"]) > 0
    assert refused.value.response.headers["x-ratelimit-limit-requests"]


def test_closing_a_stream_cancels_the_request_inside_vllm(
    user: User, stack: LiveEdge, real_workers: list[RealWorker]
) -> None:
    client = sdk(stack, key_for(user))
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Write a very long story about a baker."}],
        max_tokens=256,
        stream=True,
    )
    pieces = 0
    for chunk in stream:
        pieces += bool(chunk.choices and chunk.choices[0].delta.content)
        if pieces >= 3:
            break
    generation_id = chunk.id.removeprefix("chatcmpl-")
    # Which worker serves it, and how many answers it runs, are not read here: the row
    # learns its worker beside the answer, and a gauge read between two engine steps may
    # say anything. vLLM's log names the request it aborts, whichever worker that is.
    left_at = timezone.now()
    stream.close()

    wait_until(
        lambda: Generation.objects.get(pk=generation_id).is_final,
        every=0.2,
        what="the generation cancelled",
    )
    generation = Generation.objects.get(pk=generation_id)
    assert generation.status == Generation.Status.CANCELLED, (
        f"the answer ended before the client left: {generation.status}, "
        f"{generation.output_tokens} tokens, {generation.finish_reason!r}, admitted "
        f"{generation.admitted_at}, first token {generation.first_token_at}, finished "
        f"{generation.finished_at}; the client left {left_at}"
    )
    # vLLM aborts on the closed connection at its next engine step (seconds on a busy
    # 2-core machine).
    wait_until(
        lambda: aborted_in_vllm(real_workers, generation_id),
        every=0.2,
        what="vLLM aborting the request",
    )
    # Charged for what was produced before the client left, not for the 256 it could have.
    events = UsageEvent.objects.filter(generation_id=generation_id)
    event = wait_until(events.first, what="the usage event, in the scheduler's next batch")
    assert event is not None
    assert event.status == Generation.Status.CANCELLED
    assert 0 < event.output_tokens < 256
    assert event.prompt_tokens > 0
