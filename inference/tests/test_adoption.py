"""A scheduler replica that dies: its answers are adopted by a live one and restarted.

The replica killed here is a real process (`manage.py run_scheduler`, SIGKILL); the one that
adopts runs in the test's event loop. The workers are stand-ins that stream slowly, so the
answers are mid-way when the process dies (the test is about our side of the fault).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.models import User

from accounts.tests.factories import UserFactory
from chatsite.redis import sync_redis
from chatsite.testing import budget, wait_until
from inference import queue
from inference.models import Generation
from inference.scheduler import adoption
from inference.scheduler.adoption import Liveness

from . import fixtures
from .fixtures import (
    finished,
    register_pool,
    running_schedulers,
    send,
    send_turn,
    stream_events,
    wait_for,
    wait_for_sessions_to_end,
)

pytestmark = pytest.mark.django_db(transaction=True)

VICTIM = "victim"
VICTIM_DB_APPLICATION = "chatsite-test-victim-scheduler"
TTL_SECONDS = 2.0


@pytest.fixture
def victim_scheduler(tmp_path: Path) -> Iterator[Any]:
    """Starts a scheduler process as replica `victim`; stops what is left of it after the
    test, before the database is flushed (the fixture is torn down first)."""
    started: list[subprocess.Popen[bytes]] = []
    log = tmp_path / "victim.log"

    def start() -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "DATABASE_URL": fixtures.test_database_url(VICTIM_DB_APPLICATION),
            "REDIS_URL": settings.REDIS_URL,
            "DEBUG": "0",
            "SCHEDULER_HEALTH_INTERVAL_MS": "250",
            "SCHEDULER_REPLICA_TTL_SECONDS": str(TTL_SECONDS),
            # Its answers pause on the worker until it is killed: no stall time ends them.
            "SCHEDULER_STALL_SECONDS": "3600",
        }
        process = subprocess.Popen(  # noqa: S603 (our own command line)
            [sys.executable, "manage.py", "run_scheduler", "--replica-id", VICTIM],
            cwd=settings.BASE_DIR,
            env=env,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        started.append(process)
        redis = sync_redis()

        def beating() -> bool:
            if process.poll() is not None:
                pytest.fail(f"the scheduler exited:\n{log.read_text()[-3000:]}")
            return bool(redis.exists(queue.replica_key(VICTIM)))

        try:
            wait_until(beating, within=120, every=0.1, what="the victim scheduler beating")
        except AssertionError as exc:
            pytest.fail(f"{exc}:\n{log.read_text()[-3000:]}")
        return process

    yield start
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    print(f"victim log ({log}):", *log.read_text().splitlines()[-40:], sep="\n")
    if started:
        wait_for_sessions_to_end(VICTIM_DB_APPLICATION)


def _claim_as(replica: str, pool: str, tier: str = "free") -> str:
    redis = sync_redis()
    keys = queue.claim_keys(pool, [tier], replica)
    claimed = redis.eval(queue.CLAIM, len(keys), *keys, replica, "0")
    assert claimed
    return str(claimed[0])


def _steady(liveness: Liveness) -> Liveness:
    """As if its beats had been steady for a full TTL."""
    liveness._steady_since = time.monotonic() - liveness.ttl
    return liveness


def _dead(redis: Any, replica: str) -> None:
    redis.delete(queue.replica_key(replica))
    redis.zadd(queue.replicas_key(), {replica: queue.now_ms() - 60_000})


async def test_a_dead_replicas_answer_goes_back_to_the_head_of_its_queue(
    user: User, settings: Any
) -> None:
    pool = await sync_to_async(register_pool)()
    first = await send(user)
    later = await send(user)
    redis = sync_redis()
    gid = await sync_to_async(_claim_as)("gone", pool.name)
    assert gid == str(first.generation.id)
    redis.hset(queue.job_key(gid), "attempt", "1")
    _dead(redis, "gone")

    liveness = _steady(Liveness(redis=queue.async_redis(), replica_id="adopter"))
    try:
        assert await liveness.adopt([]) == [gid]
    finally:
        await liveness.redis.aclose()

    job = redis.hgetall(queue.job_key(gid))
    assert "owner" not in job and job["adopted_from"] == "gone" and job["attempt"] == "1"
    line = redis.zrange(queue.queue_key(pool.name, "free"), 0, -1)
    assert line == [gid, str(later.generation.id)]  # ahead of the one sent after it
    assert not redis.exists(queue.owned_key("gone"), queue.owned_key("adopter"))
    assert redis.zscore(queue.replicas_key(), "gone") is None


async def test_a_replica_that_beats_keeps_its_answers(
    user: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = await sync_to_async(register_pool)()
    await send(user)
    redis = sync_redis()
    gid = await sync_to_async(_claim_as)("slow", pool.name)
    # Its beat is old in the sorted set, but its heartbeat key is still there.
    redis.zadd(queue.replicas_key(), {"slow": queue.now_ms() - 60_000})
    redis.set(queue.replica_key("slow"), "1", ex=10)

    liveness = _steady(Liveness(redis=queue.async_redis(), replica_id="adopter"))
    try:
        assert await liveness.adopt([]) == []
        # Nor does a replica that has not yet beaten steadily for a full TTL judge anyone:
        # steady since the moment its clock stands still at.
        redis.delete(queue.replica_key("slow"))
        now = time.monotonic()
        monkeypatch.setattr(adoption, "time", SimpleNamespace(monotonic=lambda: now))
        liveness._steady_since = now
        assert await liveness.adopt([]) == []
    finally:
        await liveness.redis.aclose()
    assert redis.hget(queue.job_key(gid), "owner") == "slow"


async def test_an_adopted_answer_out_of_attempts_fails_and_a_cancelled_one_is_cancelled(
    user: User, settings: Any
) -> None:
    settings.GENERATION_MAX_ATTEMPTS = 2
    pool = await sync_to_async(register_pool)()
    spent, cancelled = await send(user), await send(user)
    redis = sync_redis()
    for turn in (spent, cancelled):
        await sync_to_async(_claim_as)("gone", pool.name)
        await sync_to_async(Generation.objects.filter(pk=turn.generation.id).update)(
            status=Generation.Status.RUNNING
        )
    redis.hset(queue.job_key(str(spent.generation.id)), "attempt", "2")
    queue.append_event(redis, str(spent.generation.id), "delta", {"text": "half an ans"})
    redis.hset(queue.job_key(str(cancelled.generation.id)), mapping={"attempt": "1", "cancel": "1"})
    _dead(redis, "gone")

    liveness = _steady(Liveness(redis=queue.async_redis(), replica_id="adopter"))
    try:
        assert len(await liveness.adopt([])) == 2
    finally:
        await liveness.redis.aclose()

    failed = await Generation.objects.select_related("message").aget(pk=spent.generation.id)
    assert failed.status == Generation.Status.FAILED and failed.error_code == "scheduler_lost"
    assert failed.message.content == "half an ans"
    stopped = await Generation.objects.aget(pk=cancelled.generation.id)
    assert stopped.status == Generation.Status.CANCELLED
    assert not redis.zcard(queue.queue_key(pool.name, "free"))
    assert not redis.exists(queue.owned_key("adopter"))


async def test_answers_of_a_killed_replica_are_adopted_and_complete(
    db: Any, fake_workers: Any, settings: Any, victim_scheduler: Any
) -> None:
    settings.SCHEDULER_REPLICA_TTL_SECONDS = TTL_SECONDS
    tokens = 30
    # Each answer pauses after its third token until the victim is dead (`resume`): all are
    # mid-way when it dies, however long they took to get there.
    fake = fake_workers(tokens=tokens, token_delay=0.1, pause_trigger="A question")
    await sync_to_async(register_pool)(fake)
    process = await sync_to_async(victim_scheduler)()
    # Eight users: a free plan allows two answers at once.
    users = [await sync_to_async(UserFactory)() for _ in range(8)]
    turns = [await sync_to_async(send_turn)(who, content="A question") for who in users]
    ids = [str(turn.generation.id) for turn in turns]

    def mid_answer(gid: str) -> bool:
        names = [name for name, _ in stream_events(gid)]
        return "delta" in names

    async def all_mid_answer() -> bool:
        return all([await sync_to_async(mid_answer)(gid) for gid in ids])

    await wait_for(all_mid_answer)
    redis = sync_redis()
    assert {redis.hget(queue.job_key(gid), "owner") for gid in ids} == {VICTIM}
    os.killpg(process.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    await sync_to_async(process.wait)()
    fake.resume.set()  # the dead replica's requests end; the adopted ones do not pause

    async with running_schedulers() as (survivor,):

        async def all_restarted() -> bool:
            return all(
                [
                    "restart" in [name for name, _ in await sync_to_async(stream_events)(gid)]
                    for gid in ids
                ]
            )

        await wait_for(all_restarted)
        adopted_after = time.monotonic() - killed_at

        async def all_finished() -> bool:
            return all([await finished(gid) for gid in ids])

        await wait_for(all_finished)

    answer = "".join(f"tok{i} " for i in range(tokens))
    complete = 0
    for gid in ids:
        generation = await Generation.objects.select_related("message").aget(pk=gid)
        events = await sync_to_async(stream_events)(gid)
        restarts = [data for name, data in events if name == "restart"]
        assert restarts == [{"reason": "scheduler_lost", "attempt": 2}]
        # What a client shows: the text after the last restart, once, whole.
        after = [name for name, _ in events][
            max(i for i, (name, _) in enumerate(events) if name == "restart") :
        ]
        text_after = "".join(
            data["text"] for name, data in events[len(events) - len(after) :] if name == "delta"
        )
        if generation.status == Generation.Status.COMPLETE:
            complete += 1
            assert generation.message.content == answer == text_after
            assert generation.attempts == 2
    assert complete >= 0.95 * len(ids)
    # Every answer was adopted within the bound (the TTL here is 2 s). A time bound
    # is the claim itself; what it waits for is the TTL (Redis's own clock) and a second of
    # the survivor's loop, so 10 s leaves a slow machine several times what it needs.
    assert adopted_after < budget(10), adopted_after
    assert not redis.exists(queue.owned_key(VICTIM), queue.owned_key(survivor.replica_id))
    print(f"{complete}/{len(ids)} complete; every answer restarted {adopted_after:.1f} s after")
