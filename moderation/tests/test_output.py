"""Output moderation while an answer streams: a stand-in worker (FakeWorker) is scripted to
turn bad mid-answer; the scheduler must stop it, retract it and store it `blocked`, for staff
eyes only."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from billing.models import UsageEvent
from chatsite.redis import async_redis
from chatsite.testing import budget
from conversations.models import Message
from conversations.turns import Turn
from inference import edge_relay, queue
from inference.api.stream import _stored_events
from inference.models import Generation
from inference.tests.fake_worker import FakeWorker
from inference.tests.fixtures import (
    LiveEdge,
    finished,
    register_pool,
    running_schedulers,
    send,
    send_unkept,
    stream_ended,
    stream_events,
    wait_for,
)
from inference.tests.test_stream import bearer, collect, stream_url
from moderation.models import Flag
from moderation.output import StreamingOutputGuard

from .helpers import API, INSULT

pytestmark = pytest.mark.django_db(transaction=True)

CALM = "The weather today is calm and mild. "


class ScriptedWorker(FakeWorker):
    """A FakeWorker that streams the given pieces of text instead of `tok<n>`; with
    `hold_at`, it waits before that piece until `hold_until` is set, then goes on."""

    def __init__(
        self,
        script: list[str],
        *,
        hold_at: int | None = None,
        hold_until: threading.Event | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(tokens=len(script), **kwargs)
        self.script = script
        self.hold_at = hold_at
        self.hold_until = hold_until

    def _handler(self) -> Any:
        base = super()._handler()
        worker = self

        class Scripted(base):  # type: ignore[valid-type,misc]
            def _stream(self, body: dict[str, Any], mode: str) -> None:
                for index, piece in enumerate(worker.script):
                    if index == worker.hold_at and worker.hold_until is not None:
                        # No more text until then, however long the checks take here (the
                        # budget only ends the wait for a check that never trips: the whole
                        # answer then comes, and fails the test).
                        worker.hold_until.wait(budget(60))
                    delta = {"content": piece}
                    self._event({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
                    # The pace of the tokens, part of the scenario: nothing waits on it.
                    time.sleep(worker.token_delay)
                self._event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
                usage = {"prompt_tokens": 11, "completion_tokens": len(worker.script)}
                self._event({"choices": [], "usage": usage})
                self._chunk(b"data: [DONE]\n\n")
                self._chunk(b"")

        return Scripted


@pytest.fixture
def small_windows(settings: Any) -> None:
    # Windows of 20 tokens (80 characters) overlapping by 5: a check every 60 characters.
    settings.MODERATION_WINDOW_TOKENS = 20
    settings.MODERATION_WINDOW_OVERLAP_TOKENS = 5


@pytest.fixture
def tripped(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set once an output check blocks an answer (the scheduler runs in this process)."""
    event = threading.Event()
    check = StreamingOutputGuard.check

    async def noted(self: StreamingOutputGuard, excerpt: str) -> Any:
        verdict = await check(self, excerpt)
        if verdict.is_blocked:
            event.set()
        return verdict

    monkeypatch.setattr(StreamingOutputGuard, "check", noted)
    return event


async def run_bad_answer(user: User, tripped: threading.Event) -> tuple[Turn, ScriptedWorker]:
    script = [CALM] * 4 + [INSULT] + [CALM] * 80
    # Two calm pieces after the insult make a window due that holds it (a check every 60
    # characters); then the worker waits for that check to trip before it sends the rest,
    # so how far the answer gets does not depend on how long the checks take.
    fake = ScriptedWorker(script, token_delay=0.02, hold_at=7, hold_until=tripped)
    fake.start()
    await sync_to_async(register_pool)(fake)
    turn = await send(user)
    async with running_schedulers():
        await wait_for(lambda: finished(turn.generation.id))
        # The upstream request was closed mid-answer (vLLM aborts it).
        await wait_for(lambda: _aborted(fake))
    fake.stop()
    return turn, fake


async def _aborted(fake: FakeWorker) -> bool:
    return fake.aborted >= 1


async def test_a_stream_that_turns_bad_is_stopped_retracted_and_stored_blocked(
    user: User, small_windows: None, tripped: threading.Event
) -> None:
    turn, _ = await run_bad_answer(user, tripped)

    generation = await Generation.objects.select_related("message").aget(pk=turn.generation.id)
    assert generation.status == Generation.Status.COMPLETE
    assert generation.finish_reason == "content_filter"
    message = generation.message
    assert message.status == Message.Status.BLOCKED
    # The original is kept (for staff), cut where the generation was stopped.
    assert INSULT in message.content
    assert len(message.content) < len(CALM) * 80
    # Charged for what was produced, not for the whole script.
    assert generation.output_tokens is not None and 0 < generation.output_tokens < 85 * 8

    events = await sync_to_async(stream_events)(turn.generation.id)
    names = [name for name, _ in events]
    assert names[-2:] == ["retract", "done"]
    # The stream no longer holds the text: a client that re-attaches cannot get it back.
    assert "delta" not in names
    retract = events[-2][1]
    assert retract["reason"] == "content_filter"
    assert retract["categories"] == ["harassment"]
    assert retract["notice"]
    assert events[-1][1]["finish_reason"] == "content_filter"

    flag = await Flag.objects.aget(user=user)
    assert flag.direction == Flag.Direction.OUTPUT
    assert flag.action == Flag.Action.RETRACTED
    assert flag.message_id == message.pk and flag.conversation_id == turn.conversation.pk
    assert INSULT in flag.excerpt


async def test_an_answer_that_keeps_no_row_is_withdrawn_and_flagged_against_its_user(
    user: User, small_windows: None, tripped: threading.Event
) -> None:
    """A `/v1` key that keeps nothing: no message to mark blocked, so the flag names the user
    alone; the answer is withdrawn from the stream and charged as produced, once."""
    script = [CALM] * 4 + [INSULT] + [CALM] * 80
    fake = ScriptedWorker(script, token_delay=0.02, hold_at=7, hold_until=tripped)
    fake.start()
    await sync_to_async(register_pool)(fake)
    gid = await send_unkept(user, "The weather?")

    async with running_schedulers():
        await wait_for(lambda: stream_ended(gid))
    fake.stop()

    names = [name for name, _ in await sync_to_async(stream_events)(gid)]
    assert names[-2:] == ["retract", "done"] and "delta" not in names
    flag = await Flag.objects.aget(user=user)
    assert (flag.direction, flag.action) == (Flag.Direction.OUTPUT, Flag.Action.RETRACTED)
    assert flag.conversation_id is None and flag.message_id is None
    assert INSULT in flag.excerpt
    event = await UsageEvent.objects.aget(generation_id=gid)
    assert event.status == "complete" and 0 < event.output_tokens < 85 * 8
    assert not await Generation.objects.filter(user=user).aexists()
    assert not await Message.objects.filter(conversation__owner=user).aexists()


async def test_a_relayed_answer_is_checked_by_its_edge_withdrawn_and_flagged(
    user: User, small_windows: None, tripped: threading.Event
) -> None:
    """The same answer read from the worker by the edge that queued it (inference/
    edge_relay.py, in this event loop): the edge's checks stop it, the edge flags it, the
    scheduler withdraws it from the stream and charges it as produced, once."""
    script = [CALM] * 4 + [INSULT] + [CALM] * 80
    fake = ScriptedWorker(script, token_delay=0.02, hold_at=7, hold_until=tripped)
    fake.start()
    await sync_to_async(register_pool)(fake)
    gid = await send_unkept(user, "The weather?", relay=True)

    seen: list[tuple[str, Any]] = []
    async with running_schedulers():
        items = edge_relay.follow(gid, user_id=user.pk, relay=True)
        async with contextlib.aclosing(items):
            async for item in items:
                if item is not None:
                    seen.append(item)
        await wait_for(lambda: _aborted(fake))
    fake.stop()
    await edge_relay.close_client()

    names = [name for name, _ in seen]
    assert names[-2:] == ["retract", "done"] and seen[-1][1]["finish_reason"] == "content_filter"
    # The stream keeps no text of it: the order, the withdrawal, the end.
    assert [name for name, _ in await sync_to_async(stream_events)(gid)] == [
        "meta",
        "relay",
        "retract",
        "done",
    ]
    flag = await Flag.objects.aget(user=user)
    assert (flag.direction, flag.action) == (Flag.Direction.OUTPUT, Flag.Action.RETRACTED)
    assert flag.conversation_id is None and INSULT in flag.excerpt

    async def charged() -> bool:
        return await UsageEvent.objects.filter(generation_id=gid).aexists()

    await wait_for(charged)
    event = await UsageEvent.objects.aget(generation_id=gid)
    assert event.status == "complete" and 0 < event.output_tokens < 85 * 8


async def test_a_trip_the_timer_finds_stops_an_answer_whose_tokens_outrun_the_interval(
    user: User, small_windows: None, settings: Any, tripped: threading.Event
) -> None:
    """Tokens every 20 ms, text sent every 200 ms: every flush after the first is the
    timer's, so the answer must stop at the chunk after a timer's check trips, not at a
    flush of the loop's own that never comes (it used to stream to its end). The worker
    sends that chunk, and the rest, only once the check has tripped."""
    settings.SCHEDULER_COALESCE_MS = 200
    turn, fake = await run_bad_answer(user, tripped)

    generation = await Generation.objects.select_related("message").aget(pk=turn.generation.id)
    assert generation.finish_reason == "content_filter"
    assert fake.aborted == 1
    assert len(generation.message.content) < len(CALM) * 40


async def test_the_whole_text_is_checked_at_the_end(user: User, settings: Any) -> None:
    # Windows larger than the answer: only the final check sees it.
    settings.MODERATION_WINDOW_TOKENS = 2000
    scripted = ScriptedWorker([CALM, INSULT], token_delay=0.01)
    scripted.start()
    await sync_to_async(register_pool)(scripted)
    turn = await send(user)
    async with running_schedulers():
        await wait_for(lambda: finished(turn.generation.id))
    scripted.stop()

    message = await Message.objects.aget(pk=turn.assistant_message.pk)
    assert message.status == Message.Status.BLOCKED
    names = [name for name, _ in await sync_to_async(stream_events)(turn.generation.id)]
    assert names[-2:] == ["retract", "done"] and "delta" not in names


async def test_a_clean_answer_is_not_touched(user: User, small_windows: None) -> None:
    scripted = ScriptedWorker([CALM] * 10, token_delay=0.005)
    scripted.start()
    await sync_to_async(register_pool)(scripted)
    turn = await send(user)
    async with running_schedulers():
        await wait_for(lambda: finished(turn.generation.id))
    scripted.stop()

    message = await Message.objects.aget(pk=turn.assistant_message.pk)
    assert message.status == Message.Status.COMPLETE
    assert message.content == CALM * 10
    names = [name for name, _ in await sync_to_async(stream_events)(turn.generation.id)]
    assert "retract" not in names and "delta" in names
    assert not await Flag.objects.filter(user=user).aexists()


def _views_of(user: User, staff: User, turn: Turn) -> dict[str, str]:
    api = APIClient()
    api.force_login(user)
    page = Client()
    page.force_login(user)
    admin = Client()
    admin.force_login(staff)
    message_id = turn.assistant_message.pk
    flag = Flag.objects.get(message_id=message_id)
    detail = api.get(f"{API}/{turn.conversation.pk}")
    assert detail.status_code == 200
    answer = next(m for m in detail.json()["messages"] if m["id"] == str(message_id))
    assert answer["status"] == "blocked" and answer["content"] == "" and answer["notice"]
    return {
        "api": detail.content.decode(),
        "page": page.get(f"/c/{turn.conversation.pk}").content.decode(),
        "replay": _stored_events(turn.generation.id).decode(),
        "admin_message": admin.get(
            f"/admin/conversations/message/{message_id}/change/"
        ).content.decode(),
        "admin_flag": admin.get(f"/admin/moderation/flag/{flag.pk}/change/").content.decode(),
    }


async def test_the_user_never_sees_the_blocked_text_again_but_staff_do(
    user: User, staff: User, small_windows: None, tripped: threading.Event
) -> None:
    turn, _ = await run_bad_answer(user, tripped)

    views = await sync_to_async(_views_of)(user, staff, turn)

    shown = "worthless idiot"
    assert shown not in views["api"]
    assert shown not in views["page"]
    assert shown not in views["replay"] and "event: retract" in views["replay"]
    assert shown in views["admin_message"]
    assert shown in views["admin_flag"]


async def test_a_client_reattaching_after_a_retract_gets_no_text(
    user: User, small_windows: None, live_edge: LiveEdge, tripped: threading.Event
) -> None:
    turn, _ = await run_bad_answer(user, tripped)
    headers = await sync_to_async(bearer)(user)
    assert await async_redis().exists(queue.stream_key(turn.generation.id))

    events = await collect(stream_url(live_edge, turn.generation.id), headers)

    names = [event.event for event in events if event.event != "comment"]
    assert names[-2:] == ["retract", "done"]
    assert "delta" not in names
