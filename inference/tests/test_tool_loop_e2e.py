"""The tool loop end to end: a real vLLM worker (with the `hermes` tool-call parser that
`run_worker` turns on) calls the shipped calculator, and the answer continues from its result.

Marked `e2e`; `make test` and CI run these with the workers the `real_workers` fixture starts.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.db import transaction

from billing.selectors import plan_for_user, pool_limits
from conversations.context import count_tokens, load_tokenizer
from conversations.models import Conversation, Message
from conversations.selectors import active_branch
from conversations.services import conversation_create, message_send
from conversations.turns import generation_start
from inference.models import Generation, ModelPool, Worker
from inference.services import pool_named
from plugins.services import conversation_tools_set

from .fixtures import RealWorker, finished, running_schedulers, stream_events, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

FORCE_CALCULATOR = {"type": "function", "function": {"name": "calculator"}}


def _register(workers: list[RealWorker]) -> None:
    pool = ModelPool.objects.create(name="smollm2-135m", served_model="smollm2-135m")
    for index, worker in enumerate(workers):
        Worker.objects.create(
            pool=pool, name=f"vllm-{index}", url=worker.url, state=Worker.State.HEALTHY
        )


def _ask_forcing_the_calculator(user: User, content: str) -> Generation:
    conversation = conversation_create(owner=user, model="smollm2-135m")
    # Tools start off in a conversation: the user switches the calculator on.
    conversation_tools_set(user=user, conversation=conversation, switches={"calculator": True})
    with transaction.atomic():
        placeholder = message_send(conversation=conversation, content=content).placeholder
        plan = plan_for_user(user=user)
        pool = pool_named(model=conversation.model)
        return generation_start(
            message=placeholder,
            user=user,
            plan=plan,
            pool=pool,
            limits=pool_limits(plan=plan, pool=pool),
            max_tokens=80,
            # Greedy, so the small model writes the expression it was asked about.
            params={"temperature": 0},
            tool_choice=FORCE_CALCULATOR,
        )


def _branch(conversation_id: Any) -> list[Message]:
    return active_branch(conversation=Conversation.objects.get(pk=conversation_id))


async def test_a_forced_calculator_call_runs_and_the_answer_continues_from_its_result(
    user: User, real_workers: list[RealWorker], settings: Any
) -> None:
    # One round, then the model must answer: keeps the run short on CPU workers.
    settings.TOOL_LOOP_MAX_ROUNDS = 1
    await sync_to_async(_register)(real_workers)
    generation = await sync_to_async(_ask_forcing_the_calculator)(user, "What is 12*7?")
    async with running_schedulers():
        await wait_for(lambda: finished(generation.id), within=180)

    generation = await Generation.objects.select_related("message").aget(pk=generation.id)
    assert generation.status == Generation.Status.COMPLETE, generation.error_message
    assert generation.message.content.strip()

    events = [e for e in await sync_to_async(stream_events)(generation.id) if e[0] != "queue"]
    names = [name for name, _ in events]
    assert names[:4] == ["meta", "meta", "tool_start", "tool_result"], names
    assert names[-1] == "done" and "delta" in names[4:-1]
    assert set(names[4:-1]) == {"delta"}
    start, result = events[2][1], events[3][1]
    assert start["name"] == "calculator"
    assert json.loads(start["arguments"])["expression"].replace(" ", "") == "12*7"
    assert result["ok"] is True
    assert json.loads(result["content"])["result"] == "84"
    streamed = "".join(data["text"] for name, data in events if name == "delta")
    assert streamed == generation.message.content

    branch = await sync_to_async(_branch)(generation.conversation_id)
    assert [m.role for m in branch] == ["system", "user", "assistant", "tool", "assistant"]
    caller, tool, answer = branch[2:]
    assert caller.metadata["tool_calls"][0]["function"]["name"] == "calculator"
    assert tool.metadata["tool_call_id"] == caller.metadata["tool_calls"][0]["id"]
    assert json.loads(tool.content)["result"] == "84"
    assert answer.pk == generation.message_id and answer.status == Message.Status.COMPLETE

    # Both requests are charged: the continuation re-read the prompt with the round in it.
    estimate = events[0][1]["prompt_tokens_estimate"]
    assert generation.prompt_tokens is not None and generation.prompt_tokens > 1.8 * estimate
    # ...and so are the call's tokens, beside those of the answer's text.
    text_tokens = count_tokens(load_tokenizer(str(django_settings.MODEL_DIR)), answer.content)
    assert generation.output_tokens is not None and generation.output_tokens > text_tokens + 5
