"""The tool loop against stand-in workers and test plugins: rounds written to the branch,
events on the stream, misbehaving tools, the round cap, cancels and usage.

The stand-in workers stream tool calls as vLLM does; the loop against the real model is in
test_tool_loop_e2e.py. The plugins are the plugin framework's own test fakes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.models import User

from chatsite.testing import budget
from conversations.context import assemble_context, load_tokenizer
from conversations.models import Conversation, Message
from conversations.selectors import active_branch
from conversations.services import conversation_create
from conversations.turns import turn_regenerate
from inference import services
from inference.client import ToolCallAssembler, ToolCallDelta
from inference.management.commands.run_worker import build_worker_argv
from inference.models import Generation
from plugins.registry import Registry, registry_build, registry_reset
from plugins.tests import fakes

from .fixtures import (
    finished,
    register_pool,
    running_schedulers,
    send,
    send_unkept,
    stream_ended,
    stream_events,
    wait_for,
)

pytestmark = pytest.mark.django_db(transaction=True)

FAKES = "plugins.tests.fakes"


@pytest.fixture(autouse=True)
def test_plugins(settings: Any) -> Iterator[Registry]:
    """The registry holds the framework's fake plugins (built-ins, so on for every plan) and
    one whose dependency is missing (skipped, so its tool is unknown); conversations start
    with their tools switched on."""
    settings.PLUGINS_TOOLS_ON_BY_DEFAULT = True
    fakes.release_hang.clear()
    registry = registry_build(
        builtin=[
            f"{FAKES}:echo",
            f"{FAKES}:misbehaving",
            "plugins.tests.fake_missing_dependency:plugin",
        ],
        entry_points=[],
    )
    registry_reset(registry)
    yield registry
    fakes.release_hang.set()
    registry_reset()


def _branch(conversation_id: Any) -> list[Message]:
    return active_branch(conversation=Conversation.objects.get(pk=conversation_id))


def test_streamed_fragments_are_joined_into_calls_by_index() -> None:
    calls = ToolCallAssembler()
    calls.add([ToolCallDelta(index=0, id="a", name="echo")])
    calls.add(
        [ToolCallDelta(index=1, id="b", name="clock"), ToolCallDelta(index=0, arguments='{"te')]
    )
    calls.add(
        [ToolCallDelta(index=0, arguments='xt": "hi"}'), ToolCallDelta(index=1, arguments="{}")]
    )

    joined = calls.calls()

    assert [(c.id, c.name, c.arguments) for c in joined] == [
        ("a", "echo", '{"text": "hi"}'),
        ("b", "clock", "{}"),
    ]
    assert joined[0].to_openai() == {
        "id": "a",
        "type": "function",
        "function": {"name": "echo", "arguments": '{"text": "hi"}'},
    }


async def test_a_tool_call_is_run_written_to_the_branch_and_the_answer_continues(
    user: User, fake_workers: Callable[..., Any]
) -> None:
    fake = fake_workers(tokens=4, tool_calls=[("echo", '{"text": "hi there"}')])
    await sync_to_async(register_pool)(fake)
    turn = await send(user, "Say hi through the echo tool")
    async with running_schedulers():
        await wait_for(lambda: finished(turn.generation.id))

    generation = await Generation.objects.select_related("message").aget(pk=turn.generation.id)
    assert generation.status == Generation.Status.COMPLETE, generation.error_message
    assert generation.message.content == "tok0 tok1 tok2 tok3 "
    # Both rounds are charged: 11 prompt tokens each, 5 tokens of the call and 4 of the text.
    assert generation.prompt_tokens == 22
    assert generation.output_tokens == 9

    events = [e for e in await sync_to_async(stream_events)(turn.generation.id) if e[0] != "queue"]
    names = [name for name, _ in events]
    assert names[:4] == ["meta", "meta", "tool_start", "tool_result"]
    assert names[-1] == "done" and set(names[4:-1]) == {"delta"}
    start, result = events[2][1], events[3][1]
    assert start == {"id": "call-0", "name": "echo", "arguments": '{"text": "hi there"}'}
    assert result["ok"] is True and result["id"] == "call-0"
    assert json.loads(result["content"]) == {
        "text": "hi there",
        "user": user.pk,
        "greeting": "hello",
    }

    # The tree: question -> the call -> its result -> the answer (still the generation's).
    branch = await sync_to_async(_branch)(turn.conversation.pk)
    assert [m.role for m in branch] == ["system", "user", "assistant", "tool", "assistant"]
    _, question, caller, tool, answer = branch
    assert turn.user_message is not None and question.pk == turn.user_message.pk
    assert caller.metadata["tool_calls"][0]["function"]["name"] == "echo"
    assert tool.metadata == {"tool_call_id": "call-0", "name": "echo", "ok": True}
    assert json.loads(tool.content)["text"] == "hi there"
    assert answer.pk == turn.assistant_message.pk and answer.parent_id == tool.pk
    assert question.current_child_id == caller.pk and caller.current_child_id == tool.pk
    assert tool.current_child_id == answer.pk

    # The continuation went to the same worker with the round appended.
    assert len(fake.requests) == 2
    second = fake.requests[1]["messages"]
    assert second[-2]["role"] == "assistant" and second[-2]["tool_calls"][0]["id"] == "call-0"
    assert second[-1] == {"role": "tool", "tool_call_id": "call-0", "content": tool.content}
    assert fake.requests[0]["tools"][0]["function"]["name"] == "echo"


async def test_an_answer_kept_in_no_conversation_runs_its_tools_and_writes_no_round(
    user: User, fake_workers: Callable[..., Any]
) -> None:
    """A `/v1` key that keeps nothing: the plugins' tools are offered and run as the user's
    (in no conversation), the round lives in the run alone, and the answer continues."""
    fake = fake_workers(tokens=4, tool_calls=[("echo", '{"text": "hi there"}')])
    await sync_to_async(register_pool)(fake)
    gid = await send_unkept(user, "Echo hi")

    async with running_schedulers():
        await wait_for(lambda: stream_ended(gid))

    events = [e for e in await sync_to_async(stream_events)(gid) if e[0] != "queue"]
    result = next(data for name, data in events if name == "tool_result")
    assert result["ok"] is True
    assert json.loads(result["content"])["user"] == user.pk
    assert events[-1][1]["status"] == "complete"
    text = "".join(data["text"] for name, data in events if name == "delta")
    assert text == "tok0 tok1 tok2 tok3 "
    assert len(fake.requests) == 2
    assert fake.requests[1]["messages"][-1]["role"] == "tool"
    assert not await Conversation.objects.filter(owner=user).aexists()
    assert not await Generation.objects.filter(user=user).aexists()


async def test_the_next_turn_and_a_regenerate_see_the_tool_round(
    user: User, fake_workers: Callable[..., Any]
) -> None:
    fake = fake_workers(tokens=3, tool_calls=[("echo", '{"text": "x"}')], tool_trigger="echo")
    await sync_to_async(register_pool)(fake)
    first = await send(user, "Please echo x")
    async with running_schedulers():
        await wait_for(lambda: finished(first.generation.id))
        second = await send(user, "Thanks, and now?", first.conversation)
        await wait_for(lambda: finished(second.generation.id))
        # Regenerating the first answer asks the question again, above its tool round.
        answer = await Message.objects.aget(pk=first.assistant_message.pk)
        again = await sync_to_async(turn_regenerate)(user=user, message=answer)
        await wait_for(lambda: finished(again.generation.id))

    follow_up = fake.requests[2]["messages"]
    assert [m["role"] for m in follow_up] == ["user", "assistant", "tool", "assistant", "user"]
    assert follow_up[1]["tool_calls"][0]["function"]["arguments"] == '{"text": "x"}'
    assert follow_up[2]["tool_call_id"] == "call-0"

    assert (await Generation.objects.aget(pk=again.generation.id)).status == "complete"
    assert [m["role"] for m in fake.requests[3]["messages"]] == ["user"]
    # The new answer made its own round, beside the first one under the same question.
    branch = await sync_to_async(_branch)(first.conversation.pk)
    assert [m.role for m in branch] == ["system", "user", "assistant", "tool", "assistant"]
    assert first.user_message is not None and branch[1].pk == first.user_message.pk
    assert branch[-1].pk == again.assistant_message.pk
    assert await Message.objects.filter(parent=first.user_message.pk).acount() == 2


async def test_misbehaving_tools_give_clear_errors_and_the_answer_still_ends(
    user: User, other_user: User, fake_workers: Callable[..., Any], settings: Any
) -> None:
    # The hung tool's time limit is the one time that must pass. The other user's answer
    # (a fraction of a second of work) must end within it: that it does is asserted below by
    # order, not by time, and 5 s (scaled with the budgets) leaves a slow machine room.
    settings.PLUGINS_TOOL_TIMEOUT_SECONDS = budget(5)
    calls = [
        ("hang", "{}"),
        ("explode", "{}"),
        ("huge", "{}"),
        ("malformed", "{}"),
        ("weather", '{"city": "Oslo"}'),  # its plugin lacks a dependency: never registered
        ("echo", '{"text": '),  # the model's JSON broke off
    ]
    fake = fake_workers(tokens=3, tool_calls=calls, tool_trigger="tools")
    await sync_to_async(register_pool)(fake)
    slow = await send(user, "Use all the tools")
    async with running_schedulers():

        async def hanging() -> bool:
            events = await sync_to_async(stream_events)(slow.generation.id)
            return any(name == "tool_start" for name, _ in events)

        await wait_for(hanging)
        # While that tool hangs, the scheduler keeps serving someone else.
        quick = await send(other_user, "Just answer")
        await wait_for(lambda: finished(quick.generation.id))

        async def hang_ended() -> bool:
            events = await sync_to_async(stream_events)(slow.generation.id)
            return any(name == "tool_error" and data["name"] == "hang" for name, data in events)

        assert not await hang_ended()  # the other answer ended while the tool still hung
        assert not await finished(slow.generation.id)
        await wait_for(lambda: finished(slow.generation.id))

    generation = await Generation.objects.select_related("message").aget(pk=slow.generation.id)
    assert generation.status == Generation.Status.COMPLETE
    assert generation.message.content == "tok0 tok1 tok2 "
    events = await sync_to_async(stream_events)(slow.generation.id)
    errors = {data["name"]: data for name, data in events if name == "tool_error"}
    assert {name: error["code"] for name, error in errors.items()} == {
        "hang": "timeout",
        "explode": "failed",
        "huge": "too_large",
        "malformed": "malformed",
        "weather": "unknown_tool",
        "echo": "bad_arguments",
    }
    assert all(error["message"] for error in errors.values())
    assert "do-not-show" not in json.dumps(events)  # an exception's text may hold secrets
    assert [name for name, _ in events].count("tool_start") == len(calls)
    assert not any(name == "tool_result" for name, _ in events)

    # The model was told each failure as the tool's answer, and the broken arguments were
    # sent back as valid JSON (the worker parses them).
    sent = fake.requests[-1]["messages"]
    results = [m for m in sent if m["role"] == "tool"]
    assert len(results) == len(calls)
    assert all(m["content"].startswith("Tool error (") for m in results)
    broken = next(m for m in sent if m.get("tool_calls"))["tool_calls"][-1]["function"]
    assert json.loads(broken["arguments"]) == {"unparsed_arguments": '{"text": '}


async def test_rounds_are_capped_then_the_model_must_answer(
    user: User, fake_workers: Callable[..., Any], settings: Any
) -> None:
    settings.TOOL_LOOP_MAX_ROUNDS = 2
    fake = fake_workers(tokens=2, tool_calls=[("echo", '{"text": "again"}')], tool_rounds=99)
    await sync_to_async(register_pool)(fake)
    turn = await send(user, "Loop forever")
    async with running_schedulers():
        await wait_for(lambda: finished(turn.generation.id))

    generation = await Generation.objects.select_related("message").aget(pk=turn.generation.id)
    assert generation.status == Generation.Status.COMPLETE
    assert generation.message.content == "tok0 tok1 "
    events = await sync_to_async(stream_events)(turn.generation.id)
    assert [name for name, _ in events].count("tool_start") == 2
    assert [r.get("tool_choice") for r in fake.requests] == [None, None, "none"]
    branch = await sync_to_async(_branch)(turn.conversation.pk)
    roles = [m.role for m in branch]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]


async def test_a_cancel_during_a_tool_run_ends_the_answer_at_once(
    user: User, fake_workers: Callable[..., Any], settings: Any
) -> None:
    # The hang lasts until released (plugins/tests/fakes.py) and the tool's own limit is far
    # off: a cancel that waited for the tool would not end the answer within the test.
    settings.PLUGINS_TOOL_TIMEOUT_SECONDS = 600
    fake = fake_workers(tool_calls=[("hang", "{}")])
    await sync_to_async(register_pool)(fake)
    turn = await send(user, "Hang")
    async with running_schedulers():

        async def hanging() -> bool:
            events = await sync_to_async(stream_events)(turn.generation.id)
            return any(name == "tool_start" for name, _ in events)

        await wait_for(hanging)
        generation = await Generation.objects.select_related("pool").aget(pk=turn.generation.id)
        await sync_to_async(services.generation_cancel)(generation=generation)
        # At once, not when the tool ends: a time bound is the claim itself, and 15 s is
        # many times what a cancel takes on a slow machine.
        await wait_for(lambda: finished(turn.generation.id), within=15)
        fakes.release_hang.set()  # the tool returns now: nothing may come of it

    generation = await Generation.objects.aget(pk=turn.generation.id)
    assert generation.status == Generation.Status.CANCELLED
    events = await sync_to_async(stream_events)(turn.generation.id)
    assert events[-1][0] == "done" and events[-1][1]["status"] == "cancelled"
    assert len(fake.requests) == 1  # no continuation after the cancel


async def test_a_worker_without_a_tool_parser_answers_without_tools(
    user: User, fake_workers: Callable[..., Any]
) -> None:
    fake = fake_workers(tokens=3, refuse_tools=True, tool_calls=[("echo", '{"text": "x"}')])
    await sync_to_async(register_pool)(fake)
    turn = await send(user, "Hello")
    async with running_schedulers():
        await wait_for(lambda: finished(turn.generation.id))

    generation = await Generation.objects.select_related("message").aget(pk=turn.generation.id)
    assert generation.status == Generation.Status.COMPLETE
    assert generation.message.content == "tok0 tok1 tok2 "
    assert [bool(r.get("tools")) for r in fake.requests] == [True, False]
    events = await sync_to_async(stream_events)(turn.generation.id)
    assert "restart" not in [name for name, _ in events]


def test_a_failed_answer_drops_its_question_and_tool_round_from_the_context(user: User) -> None:
    conversation = conversation_create(owner=user, system_prompt="Be brief.")
    root = conversation.current_leaf
    assert root is not None

    def add(parent: Message | None, role: str, content: str, **extra: Any) -> Message:
        return Message.objects.create(
            conversation=conversation, parent=parent, role=role, content=content, **extra
        )

    question = add(root, "user", "What is 2+2?")
    caller = add(
        question,
        "assistant",
        "",
        metadata={
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "calc", "arguments": "{}"}}
            ]
        },
    )
    result = add(caller, "tool", "4", metadata={"tool_call_id": "c", "name": "calc", "ok": True})
    failed = add(result, "assistant", "", status=Message.Status.FAILED)
    newest = add(failed, "user", "Hello?")
    tokenizer = load_tokenizer(str(settings.MODEL_DIR))

    dropped = assemble_context(
        branch=[root, question, caller, result, failed, newest],
        tokenizer=tokenizer,
        budget_tokens=4000,
    )
    assert [m["role"] for m in dropped.messages] == ["system", "user"]

    answer = add(result, "assistant", "It is 4.")
    kept = assemble_context(
        branch=[root, question, caller, result, answer, add(answer, "user", "And 3+3?")],
        tokenizer=tokenizer,
        budget_tokens=4000,
    )
    assert [m["role"] for m in kept.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
    ]
    assert kept.messages[2]["tool_calls"][0]["id"] == "c"
    assert kept.messages[3] == {"role": "tool", "content": "4", "tool_call_id": "c"}


def test_workers_start_with_the_hermes_tool_parser_and_strict_arguments() -> None:
    argv = build_worker_argv(
        python="python", model="/m", port=1, device="cpu", chat_template="/t.jinja"
    )
    assert argv[argv.index("--tool-call-parser") + 1] == "hermes"
    assert "--enable-auto-tool-choice" in argv
    assert argv[argv.index("--tool-strict-level") + 1] == "parameter"
    assert argv[argv.index("--chat-template") + 1] == "/t.jinja"

    plain = build_worker_argv(
        python="python", model="/m", port=1, device="cpu", tool_call_parser=None
    )
    assert "--tool-call-parser" not in plain and "--enable-auto-tool-choice" not in plain
    assert "--chat-template" not in plain
