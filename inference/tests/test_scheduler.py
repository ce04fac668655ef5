"""The scheduler against stand-in workers: admission, placement, streaming, faults, cancels.

The stand-ins are allowed here because these tests are about our side of a worker's fault;
the real vLLM worker is exercised in test_e2e_vllm.py.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.models import User
from django.db import OperationalError

from billing.tests.factories import subscribe
from chatsite.redis import async_redis, sync_redis
from chatsite.testing import budget
from conversations.models import Message
from inference import queue, services
from inference.models import Generation, Worker
from inference.scheduler import run as scheduler_run

from .fixtures import (
    finished,
    generation_status,
    register_pool,
    running_schedulers,
    send,
    send_turn,
    stream_events,
    wait_for,
)

pytestmark = pytest.mark.django_db(transaction=True)


def events_named(generation_id: Any) -> list[str]:
    return [name for name, _ in stream_events(generation_id)]


async def test_answer_is_streamed_and_persisted_once(user: User, fake_workers: Any) -> None:
    fake = fake_workers(tokens=6)
    await sync_to_async(register_pool)(fake)
    turn = await send(user)
    async with running_schedulers():
        await wait_for(lambda: finished(turn.generation.id))

    generation = await Generation.objects.select_related("message", "worker").aget(
        pk=turn.generation.id
    )
    assert generation.status == Generation.Status.COMPLETE
    assert generation.message.status == Message.Status.COMPLETE
    assert generation.message.content == "".join(f"tok{i} " for i in range(6))
    assert generation.prompt_tokens == 11
    assert generation.output_tokens == 6
    assert generation.message.output_tokens == 6
    assert generation.finish_reason == "stop"
    assert generation.worker is not None and generation.worker.url == fake.url
    assert generation.admitted_at and generation.first_token_at and generation.finished_at

    events = await sync_to_async(stream_events)(turn.generation.id)
    names = [name for name, _ in events]
    assert names[0] == "meta" and names[-1] == "done"
    assert "delta" in names and "error" not in names
    text = "".join(data["text"] for name, data in events if name == "delta")
    assert text == generation.message.content
    assert events[-1][1]["status"] == "complete"
    # The request carried the tier's priority and the conversation's messages.
    request = fake.requests[0]
    assert request["priority"] == services.tier_priority("free")
    assert request["messages"][-1] == {"role": "user", "content": "Hello there"}
    assert request["stream"] is True


async def test_tokens_are_coalesced_into_fewer_events(
    user: User, fake_workers: Any, settings: Any
) -> None:
    settings.SCHEDULER_COALESCE_MS = 500
    fake = fake_workers(tokens=40, token_delay=0.005)
    await sync_to_async(register_pool)(fake)
    turn = await send(user)
    async with running_schedulers():
        await wait_for(lambda: finished(turn.generation.id))
    deltas = [n for n in await sync_to_async(events_named)(turn.generation.id) if n == "delta"]
    # 40 tokens 5 ms apart are ~200 ms of output: the first goes out at once, the rest in a
    # 500 ms window or two, not 40 events. (Fewer than 15 holds while the 40 take under 7 s:
    # the window is long so that a slow machine's pace stays far inside the bound.)
    assert 1 < len(deltas) < 15


async def test_worker_dying_mid_stream_restarts_on_another(user: User, fake_workers: Any) -> None:
    dying = fake_workers(mode="die")
    healthy = fake_workers(tokens=5)
    await sync_to_async(register_pool)(dying, healthy)
    # Make the dying worker the conversation's sticky one, so it is tried first.
    turn = await send(user)
    dying_row = await Worker.objects.aget(url=dying.url)
    await async_redis().set(queue.affinity_key(turn.conversation.id), dying_row.id)
    async with running_schedulers():
        await wait_for(lambda: finished(turn.generation.id))

    generation = await Generation.objects.select_related("message", "worker").aget(
        pk=turn.generation.id
    )
    assert generation.status == Generation.Status.COMPLETE
    assert generation.attempts == 2
    assert generation.worker is not None and generation.worker.url == healthy.url
    assert generation.message.content == "".join(f"tok{i} " for i in range(5))
    names = await sync_to_async(events_named)(turn.generation.id)
    assert "restart" in names
    # What came after the restart is the whole answer; the partial text before it is void.
    events = await sync_to_async(stream_events)(turn.generation.id)
    after = [d["text"] for n, d in events[names.index("restart") :] if n == "delta"]
    assert "".join(after) == generation.message.content


@pytest.mark.parametrize(
    ("mode", "code"),
    [("die", "worker_unreachable"), ("error500", "worker_error"), ("garbage", "bad_response")],
)
async def test_lone_faulty_worker_fails_the_generation(
    user: User, fake_workers: Any, mode: str, code: str
) -> None:
    fake = fake_workers(mode=mode)
    await sync_to_async(register_pool)(fake)
    turn = await send(user)
    async with running_schedulers():
        await wait_for(lambda: finished(turn.generation.id))

    generation = await Generation.objects.select_related("message").aget(pk=turn.generation.id)
    assert generation.status == Generation.Status.FAILED
    assert generation.error_code == code
    assert generation.message.status == Message.Status.FAILED
    events = await sync_to_async(stream_events)(turn.generation.id)
    names = [n for n, _ in events]
    assert names[-2:] == ["error", "done"]
    assert events[-2][1]["code"] == code


async def test_hung_worker_is_detected_and_generation_fails(
    user: User, fake_workers: Any, settings: Any
) -> None:
    settings.SCHEDULER_STALL_SECONDS = 1
    # Nothing but the stall detector can end it within the budget: not the first-token time
    # (nor the client's read timeout, the longer of the two), nor the hang (released when
    # the worker stops).
    settings.SCHEDULER_FIRST_TOKEN_SECONDS = 3600
    fake = fake_workers(mode="hang")
    await sync_to_async(register_pool)(fake)
    turn = await send(user)
    async with running_schedulers():
        await wait_for(lambda: finished(turn.generation.id))
    generation = await Generation.objects.select_related("message").aget(pk=turn.generation.id)
    assert generation.status == Generation.Status.FAILED
    assert generation.error_code == "worker_stalled"
    # The three tokens that did arrive are kept with the failed message.
    assert generation.message.content == "tok0 tok1 tok2 "
    assert generation.output_tokens is not None and generation.output_tokens > 0


async def test_an_answer_waiting_in_the_workers_queue_past_the_stall_time_completes(
    user: User, fake_workers: Any, settings: Any
) -> None:
    # Before its first token a request may wait behind a full batch inside vLLM: the stall
    # time does not apply yet, the (longer) first-token time does.
    # The worker's wait (2.5 s, a timed wait: no faster or slower with the machine) is past
    # the stall time and well within the first-token time.
    settings.SCHEDULER_STALL_SECONDS = 1
    settings.SCHEDULER_FIRST_TOKEN_SECONDS = 60
    fake = fake_workers(first_token_delay=2.5)
    await sync_to_async(register_pool)(fake)
    turn = await send(user)
    async with running_schedulers():
        await wait_for(lambda: finished(turn.generation.id))
    generation = await Generation.objects.aget(pk=turn.generation.id)
    assert generation.status == Generation.Status.COMPLETE
    assert generation.output_tokens == 8


async def test_an_answer_that_never_begins_fails_after_the_first_token_time(
    user: User, fake_workers: Any, settings: Any
) -> None:
    # Nothing but the first-token time can end it within the budget: not the stall time (nor
    # the client's read timeout), nor the worker's wait (released when the worker stops).
    settings.SCHEDULER_STALL_SECONDS = 3600
    settings.SCHEDULER_FIRST_TOKEN_SECONDS = 1
    fake = fake_workers(first_token_delay=3600)
    await sync_to_async(register_pool)(fake)
    turn = await send(user)
    async with running_schedulers():
        await wait_for(lambda: finished(turn.generation.id))
    generation = await Generation.objects.aget(pk=turn.generation.id)
    assert generation.status == Generation.Status.FAILED
    assert generation.error_code == "worker_stalled"


async def test_cancel_of_a_queued_generation_is_immediate(user: User) -> None:
    await sync_to_async(register_pool)()  # a pool with no worker: nothing will run
    turn = await send(user)
    generation = await sync_to_async(services.generation_cancel)(generation=turn.generation)
    assert generation.status == Generation.Status.CANCELLED
    message = await Message.objects.aget(pk=turn.assistant_message.pk)
    assert message.status == Message.Status.CANCELLED
    assert await sync_to_async(events_named)(generation.id) == ["meta", "done"]
    pool_queue = queue.queue_key(settings.DEFAULT_MODEL, turn.generation.tier)
    assert await async_redis().zcard(pool_queue) == 0


async def test_cancel_of_a_running_generation_closes_the_worker_request(
    user: User, fake_workers: Any
) -> None:
    fake = fake_workers(tokens=500, token_delay=0.02)
    await sync_to_async(register_pool)(fake)
    turn = await send(user)
    async with running_schedulers():

        async def streaming() -> bool:
            return "delta" in await sync_to_async(events_named)(turn.generation.id)

        await wait_for(streaming)
        await sync_to_async(services.generation_cancel)(generation=turn.generation)
        # Left alone it would run on for 10 s and end complete, which the status tells apart.
        await wait_for(lambda: finished(turn.generation.id))

        async def worker_aborted() -> bool:
            return fake.aborted == 1 and fake.running == 0

        await wait_for(worker_aborted)

    generation = await Generation.objects.select_related("message").aget(pk=turn.generation.id)
    assert generation.status == Generation.Status.CANCELLED
    assert generation.message.status == Message.Status.CANCELLED
    assert generation.message.content.startswith("tok0 ")
    assert generation.output_tokens is not None and generation.output_tokens > 0


async def test_a_second_cancel_does_not_cut_the_final_write_short(
    user: User, fake_workers: Any, monkeypatch: Any, caplog: Any
) -> None:
    # The pub/sub message and the job's cancel flag (housekeeping) may both cancel a run: the
    # second one arriving while the first's final write is under way.
    fake = fake_workers(tokens=500, token_delay=0.02)
    await sync_to_async(register_pool)(fake)
    turn = await send(user)
    finishing = threading.Event()
    go_on = threading.Event()
    real_finish = services.generation_finish

    def slow_finish(**kwargs: Any) -> Any:
        finishing.set()
        go_on.wait(timeout=budget(60))  # until the second cancel has reached the run
        return real_finish(**kwargs)

    monkeypatch.setattr(services, "generation_finish", slow_finish)
    async with running_schedulers() as (replica,):

        async def streaming() -> bool:
            return "delta" in await sync_to_async(events_named)(turn.generation.id)

        await wait_for(streaming)
        redis = async_redis()
        try:
            gid = str(turn.generation.id)
            run = replica.running[gid]
            await redis.publish(queue.cancel_channel(), gid)
            assert await asyncio.to_thread(finishing.wait, budget(60))
            await redis.publish(queue.cancel_channel(), gid)

            async def cancelled_twice() -> bool:
                return run.cancelling() >= 2

            await wait_for(cancelled_twice, what="the second cancel delivered to the run")
        finally:
            go_on.set()
            await redis.aclose()
        await wait_for(lambda: finished(turn.generation.id))

    generation = await Generation.objects.aget(pk=turn.generation.id)
    assert generation.status == Generation.Status.CANCELLED
    assert "left unfinished" not in caplog.text


async def test_generation_waiting_too_long_is_rejected(user: User, settings: Any) -> None:
    settings.SCHEDULER_MAX_QUEUE_SECONDS = 1
    await sync_to_async(register_pool)()  # no worker at all
    turn = await send(user)
    async with running_schedulers():
        await wait_for(lambda: finished(turn.generation.id))
    assert await generation_status(turn.generation.id) == Generation.Status.REJECTED
    events = await sync_to_async(stream_events)(turn.generation.id)
    names = [n for n, _ in events]
    assert "queue" in names  # the client was told its place in line while it waited
    queue_event = next(d for n, d in events if n == "queue")
    assert queue_event == {"position": 1, "high_demand": True}
    assert names[-2:] == ["error", "done"]
    assert events[-2][1]["code"] == "queue_timeout"


async def test_next_turn_goes_to_the_worker_that_served_the_last(
    user: User, fake_workers: Any
) -> None:
    fakes = [fake_workers(tokens=3), fake_workers(tokens=3), fake_workers(tokens=3)]
    await sync_to_async(register_pool)(*fakes)
    first = await send(user, "first question")
    async with running_schedulers():
        await wait_for(lambda: finished(first.generation.id))
        second = await send(user, "second question", first.conversation)
        await wait_for(lambda: finished(second.generation.id))
        third = await send(user, "third question", first.conversation)
        await wait_for(lambda: finished(third.generation.id))
    workers = [
        (await Generation.objects.aget(pk=t.generation.id)).worker_id
        for t in (first, second, third)
    ]
    assert workers[0] is not None
    assert workers == [workers[0]] * 3
    # The second turn's prompt extends the first: the worker's cached prefix stays valid.
    served = next(f for f in fakes if len(f.requests) == 3)
    first_prompt, second_prompt = served.requests[0]["messages"], served.requests[1]["messages"]
    assert second_prompt[: len(first_prompt)] == first_prompt


async def test_two_replicas_serve_every_generation_exactly_once(
    user: User, fake_workers: Any
) -> None:
    fakes = [fake_workers(tokens=3, token_delay=0.002) for _ in range(2)]
    await sync_to_async(register_pool)(*fakes)
    # A plan roomy enough for 24 answers at once, on the free tier's priority.
    await sync_to_async(subscribe)(user, tier="free")
    turns = [await send(user, f"question {i}") for i in range(24)]
    async with running_schedulers(count=2):

        async def all_finished() -> bool:
            return all([await finished(t.generation.id) for t in turns])

        await wait_for(all_finished)
    served = fakes[0].served() + fakes[1].served()
    assert sorted(served) == sorted(str(t.generation.id) for t in turns)
    assert set(served.values()) == {1}
    statuses = {await generation_status(t.generation.id) for t in turns}
    assert statuses == {Generation.Status.COMPLETE}


async def test_worker_down_is_marked_and_comes_back(fake_workers: Any) -> None:
    fake = fake_workers()
    await sync_to_async(register_pool)(fake)
    async with running_schedulers():
        fake.healthy = False

        async def state_is(state: str) -> bool:
            return (await Worker.objects.aget(url=fake.url)).state == state

        await wait_for(lambda: state_is(Worker.State.DOWN))
        fake.healthy = True
        await wait_for(lambda: state_is(Worker.State.HEALTHY))


def test_stale_generation_of_a_dead_replica_is_swept(user: User) -> None:
    register_pool()
    turn = send_turn(user)
    redis = sync_redis()
    gid = str(turn.generation.id)
    # A replica claimed it, started streaming, then died without a word.
    redis.zrem(queue.queue_key(turn.generation.pool.name, turn.generation.tier), gid)
    redis.hset(queue.job_key(gid), "owner", "dead-replica")
    queue.append_event(redis, gid, "delta", {"text": "partial "})
    long_ago = turn.generation.enqueued_at.replace(year=2000)
    Generation.objects.filter(pk=gid).update(status=Generation.Status.RUNNING, enqueued_at=long_ago)

    assert services.generation_sweep_stale(live_replicas={"live-replica"}) == 1
    generation = Generation.objects.select_related("message").get(pk=gid)
    assert generation.status == Generation.Status.FAILED
    assert generation.error_code == "scheduler_lost"
    assert generation.message.status == Message.Status.FAILED
    assert generation.message.content == "partial "
    assert events_named(gid)[-2:] == ["error", "done"]
    # A generation owned by a live replica is left alone.
    other = send_turn(user, conversation=turn.conversation)
    redis.hset(queue.job_key(str(other.generation.id)), "owner", "live-replica")
    Generation.objects.filter(pk=other.generation.id).update(enqueued_at=long_ago)
    assert services.generation_sweep_stale(live_replicas={"live-replica"}) == 0


def test_sweeper_task_sees_live_replicas_by_their_heartbeat(user: User) -> None:
    from inference.tasks import sweep_stale_generations

    register_pool()
    turn = send_turn(user)
    gid = str(turn.generation.id)
    redis = sync_redis()
    redis.zrem(queue.queue_key(turn.generation.pool.name, turn.generation.tier), gid)
    redis.hset(queue.job_key(gid), "owner", "replica-a")
    long_ago = turn.generation.enqueued_at.replace(year=2000)
    Generation.objects.filter(pk=gid).update(status=Generation.Status.RUNNING, enqueued_at=long_ago)
    redis.set(queue.key("replica", "replica-a"), "1", ex=10)

    assert services.live_scheduler_replicas() == {"replica-a"}
    assert sweep_stale_generations() == 0  # its replica still beats
    redis.delete(queue.key("replica", "replica-a"))
    assert sweep_stale_generations() == 1
    assert Generation.objects.get(pk=gid).status == Generation.Status.FAILED


async def test_final_write_survives_a_database_hiccup(
    user: User, fake_workers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fake_workers(tokens=4)
    await sync_to_async(register_pool)(fake)
    turn = await send(user)
    real_finish = services.generation_finish
    calls = {"n": 0}

    def flaky_finish(**kwargs: Any) -> bool:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OperationalError("the database is restarting")
        return real_finish(**kwargs)

    monkeypatch.setattr(services, "generation_finish", flaky_finish)
    monkeypatch.setattr(scheduler_run, "FINISH_RETRY_DELAYS", (0.05, 0.05))
    async with running_schedulers():
        await wait_for(lambda: finished(turn.generation.id))
    generation = await Generation.objects.select_related("message").aget(pk=turn.generation.id)
    assert calls["n"] == 2
    assert generation.status == Generation.Status.COMPLETE
    assert generation.message.content == "tok0 tok1 tok2 tok3 "


async def test_a_generation_that_cannot_be_finished_is_handed_to_the_sweeper(
    user: User, fake_workers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fake_workers(tokens=4)
    await sync_to_async(register_pool)(fake)
    turn = await send(user)

    def broken_finish(**kwargs: Any) -> bool:
        raise OperationalError("the database is gone")

    monkeypatch.setattr(services, "generation_finish", broken_finish)
    monkeypatch.setattr(scheduler_run, "FINISH_RETRY_DELAYS", (0.05,))
    gid = str(turn.generation.id)
    async with running_schedulers() as replicas:

        async def disowned() -> bool:
            job = await async_redis().hgetall(queue.job_key(gid))
            started = "first_token_ms" in job
            return started and "owner" not in job and gid not in replicas[0].running

        await wait_for(disowned)
    monkeypatch.undo()
    # Its replica is alive, but no longer owns it: the sweeper fails it with its streamed text.
    long_ago = turn.generation.enqueued_at.replace(year=2000)
    await Generation.objects.filter(pk=gid).aupdate(enqueued_at=long_ago)
    swept = await sync_to_async(services.generation_sweep_stale)(live_replicas={"test-0"})
    assert swept == 1
    generation = await Generation.objects.select_related("message").aget(pk=gid)
    assert generation.status == Generation.Status.FAILED
    assert generation.message.content == "tok0 tok1 tok2 tok3 "


async def test_a_cancel_sent_while_no_scheduler_listened_is_still_honoured(
    user: User, fake_workers: Any
) -> None:
    fake = fake_workers(tokens=500, token_delay=0.02)
    await sync_to_async(register_pool)(fake)
    turn = await send(user)
    gid = str(turn.generation.id)
    async with running_schedulers():

        async def streaming() -> bool:
            return "delta" in await sync_to_async(events_named)(gid)

        await wait_for(streaming)
        # The flag alone, as if the pub/sub message had been lost.
        await async_redis().hset(queue.job_key(gid), "cancel", "1")
        # Left alone it would run on for 10 s and end complete, which the status tells apart.
        await wait_for(lambda: finished(gid))
    assert await generation_status(gid) == Generation.Status.CANCELLED
