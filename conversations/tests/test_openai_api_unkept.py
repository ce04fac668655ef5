"""A `/v1` key that keeps nothing: its answers write no conversation, message or generation
row; the turn and the finish cost no statement once the catalog is warm; the usage reaches
the ledger in batches, exactly once, even when the process that finished the answer dies
before its batch; every guarantee of the kept path holds (reservation, cancel, replay)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any, cast

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.services import api_key_create
from billing import ledger, quota
from billing.models import UsageEvent
from billing.services import usage_reconcile
from billing.tests.factories import subscribe
from chatsite.redis import sync_redis
from conversations import turns
from conversations.models import Conversation, Message
from inference import queue, services
from inference.models import Generation
from inference.tests.fixtures import (
    LiveEdge,
    register_pool,
    running_schedulers,
    stream_events,
    wait_for,
)

from .test_openai_api import HELLO, async_openai

pytestmark = pytest.mark.django_db(transaction=True)


def unkept_turn(user: User, text: str = "Hello", **options: Any) -> turns.UnkeptTurn:
    return turns.turn_unkept(
        user=user,
        model="smollm2-135m",
        system_prompt="Be brief.",
        messages=[("user", text)],
        **options,
    )


def job_of(generation_id: Any) -> queue.Job:
    fields = cast(dict[str, str], sync_redis().hgetall(queue.job_key(generation_id)))
    return queue.Job.from_fields(fields)


def nothing_written(user: User) -> bool:
    return not (
        Conversation.objects.filter(owner=user).exists()
        or Message.objects.filter(conversation__owner=user).exists()
        or Generation.objects.filter(user=user).exists()
    )


def test_the_turn_writes_no_row_and_costs_no_statement_once_warm(user: User) -> None:
    subscribe(user)
    unkept_turn(user, "A first question warms the catalog")  # the plan, the pool, the price

    with CaptureQueriesContext(connection) as queries:
        turn = unkept_turn(user, "A second question")

    assert [query["sql"] for query in queries.captured_queries] == []
    job = job_of(turn.generation.id)
    assert (job.kept, job.conversation_id, job.message_id) == (False, "", "")
    assert job.messages[-1] == {"role": "user", "content": "A second question"}
    assert job.messages[0] == {"role": "system", "content": "Be brief."}
    held = quota.held(user_id=user.pk, reservation_id=str(turn.generation.id))
    assert held is not None and held.tokens == job.prompt_tokens + job.max_tokens
    assert nothing_written(user)


def finish(gid: str, **outcome: Any) -> bool:
    return services.generation_finish(
        generation_id=gid,
        **{"status": Generation.Status.COMPLETE, "text": "Hi there.", **outcome},
        job=job_of(gid),
    )


def test_the_finish_costs_no_statement_and_the_usage_waits_in_the_outbox(user: User) -> None:
    subscribe(user)
    finish(str(unkept_turn(user).generation.id))  # warms the catalog: the pool, the plan
    turn = unkept_turn(user)
    gid = str(turn.generation.id)
    job = job_of(gid)

    with CaptureQueriesContext(connection) as queries:
        finished = services.generation_finish(
            generation_id=gid,
            status=Generation.Status.COMPLETE,
            text="Hi there.",
            finish_reason="stop",
            prompt_tokens=20,
            output_tokens=4,
            job=job,
        )

    assert finished is True
    assert [query["sql"] for query in queries.captured_queries] == []
    # Settled at once: nothing held any more; the event is owed, not yet written.
    assert quota.held(user_id=user.pk, reservation_id=gid) is None
    assert not UsageEvent.objects.filter(generation_id=gid).exists()
    assert ledger.outbox_size() >= 1
    # A second finish of the same answer (a cancel racing the end) changes nothing.
    assert not services.generation_finish(
        generation_id=gid, status=Generation.Status.CANCELLED, text="", job=job
    )
    assert [name for name, _ in stream_events(gid)].count("done") == 1


def test_the_ledger_gets_each_owed_event_once_whatever_dies_in_between(
    user: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    ends = []
    for index in range(3):
        gid = str(unkept_turn(user, f"Question {index}").generation.id)
        finish(gid, prompt_tokens=10 + index, output_tokens=3)
        ends.append(gid)

    # The writer dies after its INSERT committed and before it took the entries out.
    real_client = quota.client

    class DiesBeforeDeleting:
        def __getattr__(self, name: str) -> Any:
            if name == "xdel":
                raise ConnectionError("the process died here")
            return getattr(real_client(), name)

    monkeypatch.setattr(quota, "client", DiesBeforeDeleting)
    with pytest.raises(ConnectionError):
        ledger.ledger_flush()
    monkeypatch.setattr(quota, "client", real_client)
    assert UsageEvent.objects.filter(generation_id__in=ends).count() == 3
    assert ledger.outbox_size() == 3  # still owed, as far as the outbox knows

    # The next writer (or the reconciler) writes what is missing and skips what is there.
    with CaptureQueriesContext(connection) as queries:
        assert ledger.ledger_flush() == 3
    # The users still there, then one INSERT (in bulk_create's own transaction).
    statements = [q["sql"].split()[0] for q in queries.captured_queries]
    assert [word for word in statements if word not in ("BEGIN", "COMMIT")] == ["SELECT", "INSERT"]
    assert ledger.outbox_size() == 0
    rows = UsageEvent.objects.filter(generation_id__in=ends).order_by("prompt_tokens")
    assert [(e.prompt_tokens, e.output_tokens, e.status) for e in rows] == [
        (10, 3, "complete"),
        (11, 3, "complete"),
        (12, 3, "complete"),
    ]
    assert ledger.ledger_flush() == 0


def test_a_usage_event_of_a_user_deleted_before_the_batch_is_dropped(user: User) -> None:
    gid = str(unkept_turn(user).generation.id)
    finish(gid, prompt_tokens=5, output_tokens=1)
    User.objects.filter(pk=user.pk).delete()

    assert ledger.ledger_flush() == 1
    assert not UsageEvent.objects.filter(generation_id=gid).exists()
    assert ledger.outbox_size() == 0


async def test_a_scheduler_that_dies_before_its_batch_loses_no_usage(
    user: User, fake_workers: Any, live_edge: LiveEdge, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fake_workers(tokens=4)
    await sync_to_async(register_pool)(fake)
    raw_key = (await sync_to_async(api_key_create)(user=user, name="t", store_conversations=False))[
        1
    ]
    client = async_openai(live_edge, raw_key)
    # This replica writes no batch: it dies between the answer's end and its flush.
    monkeypatch.setattr("inference.scheduler.service.Scheduler.flush", _never_flushes)
    async with running_schedulers():
        completion = await client.chat.completions.create(model="smollm2-135m", messages=HELLO)
    gid = completion.id.removeprefix("chatcmpl-")
    assert completion.choices[0].message.content == "tok0 tok1 tok2 tok3 "
    assert not await UsageEvent.objects.filter(generation_id=gid).aexists()
    assert await sync_to_async(quota.held)(user_id=user.pk, reservation_id=gid) is None

    # The next replica to start writes what the dead one owed.
    monkeypatch.undo()
    async with running_schedulers():

        async def recorded() -> bool:
            return await UsageEvent.objects.filter(generation_id=gid).aexists()

        await wait_for(recorded)
    event = await UsageEvent.objects.aget(generation_id=gid)
    assert (event.prompt_tokens, event.output_tokens, event.status) == (11, 4, "complete")
    assert await sync_to_async(nothing_written)(user)


async def _never_flushes(self: Any) -> bool:
    return True


async def test_a_retry_with_the_same_idempotency_key_gets_the_same_answer_charged_once(
    user: User, fake_workers: Any, live_edge: LiveEdge
) -> None:
    fake = fake_workers(tokens=3)
    await sync_to_async(register_pool)(fake)
    raw_key = (await sync_to_async(api_key_create)(user=user, name="t", store_conversations=False))[
        1
    ]
    client = async_openai(live_edge, raw_key)
    headers = {"Idempotency-Key": f"retry-{uuid.uuid4()}"}

    async with running_schedulers():
        first = await client.chat.completions.create(
            model="smollm2-135m", messages=HELLO, extra_headers=headers
        )
        again = await client.chat.completions.create(
            model="smollm2-135m", messages=HELLO, extra_headers=headers
        )

    assert again.id == first.id
    assert again.choices[0].message.content == first.choices[0].message.content
    assert len(fake.requests) == 1
    gid = first.id.removeprefix("chatcmpl-")
    assert [str(e.generation_id) async for e in UsageEvent.objects.filter(user=user)] == [gid]
    assert await sync_to_async(nothing_written)(user)


def test_a_queued_answer_cancelled_is_released_and_charged_nothing(user: User) -> None:
    subscribe(user, message_cap=5)
    turn = unkept_turn(user)
    gid = str(turn.generation.id)

    services.generation_cancel_unkept(generation_id=gid)

    assert quota.held(user_id=user.pk, reservation_id=gid) is None
    assert not sync_redis().exists(queue.job_key(gid))
    done = [data for name, data in stream_events(gid) if name == "done"]
    assert len(done) == 1 and done[0]["status"] == "cancelled"
    ledger.ledger_flush()
    event = UsageEvent.objects.get(generation_id=gid)
    assert (event.status, event.prompt_tokens, event.output_tokens) == ("cancelled", 0, 0)
    # It never reached a model: the message cap counts it no more.
    counted = quota.cap_window(
        user_id=user.pk, pool_id=turn.generation.pool_id, window_ms=3_600_000, now=quota.now_ms()
    )
    assert gid not in counted
    services.generation_cancel_unkept(generation_id=gid)  # already over: nothing happens


def test_the_reconciler_keeps_the_slot_of_an_answer_still_running(
    user: User, settings: Any
) -> None:
    settings.BILLING_RECONCILE_GRACE_SECONDS = 0
    turn = unkept_turn(user)
    gid = str(turn.generation.id)

    # A moment later, past the grace: the reservation is open and has no row to look at.
    report = usage_reconcile(now=timezone.now() + timedelta(seconds=1))

    assert report.slots_kept == 1 and report.reservations_released == 0
    assert quota.held(user_id=user.pk, reservation_id=gid) is not None


def test_the_messages_a_turn_sends_again_are_counted_once(
    user: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    subscribe(user)
    counted: list[str] = []
    real = turns.count_tokens

    def counting(tokenizer: Any, text: str) -> int:
        counted.append(text)
        return real(tokenizer, text)

    monkeypatch.setattr(turns, "count_tokens", counting)
    first = [("user", "When does the bakery open?")]
    unkept_turn(user, first[0][1])
    assert counted == ["Be brief.", first[0][1]]

    following = [*first, ("assistant", "At seven."), ("user", "And on Sunday?")]

    def second_turn() -> queue.Job:
        turn = turns.turn_unkept(
            user=user, model="smollm2-135m", system_prompt="Be brief.", messages=following
        )
        return job_of(turn.generation.id)

    remembered = second_turn()
    # Only the answer and the new question are new to the tokenizer.
    assert counted[2:] == ["At seven.", "And on Sunday?"]
    turns.TOKEN_COUNTS.clear()
    counted_again = second_turn()
    assert len(counted) == 2 + 2 + 4
    # Counted once or every time, the prompt comes to the same size.
    assert remembered.prompt_tokens == counted_again.prompt_tokens > 0
