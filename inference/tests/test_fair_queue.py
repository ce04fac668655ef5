"""The queue within a tier is fair between users by tokens (start-time fair queuing), and the
queue time limit still counts from enqueue: the Lua steps against the real Redis."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from chatsite.redis import sync_redis
from inference import queue

POOL = "fair-pool"
counter = itertools.count()


@pytest.fixture
def redis() -> Iterator[Any]:
    client = sync_redis()
    yield client
    client.close()


def put(redis: Any, user: int, *, tier: str = "free", cost: int = 100, at_ms: int = 0) -> str:
    generation_id = f"g{next(counter):04d}-u{user}"
    queue.enqueue(
        redis,
        queue.Job(
            generation_id=generation_id,
            pool=POOL,
            tier=tier,
            priority=queue_priority(tier),
            conversation_id="c",
            message_id="m",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=cost - 10,
            params={},
            enqueued_ms=at_ms or queue.now_ms(),
            prompt_tokens=10,
            user_id=user,
        ),
    )
    return generation_id


def queue_priority(tier: str) -> int:
    return {"pro": 0, "plus": 5, "free": 10}[tier]


def claim(redis: Any, tiers: list[str] | None = None) -> list[Any] | None:
    keys = queue.claim_keys(POOL, tiers or queue.tiers_best_first(), "replica")
    return redis.eval(queue.CLAIM, len(keys), *keys, "replica", "0")


def claim_all(redis: Any) -> list[str]:
    order = []
    while (claimed := claim(redis)) is not None:
        order.append(claimed[0])
    return order


def users(order: list[str]) -> list[str]:
    return [generation_id.split("-")[1] for generation_id in order]


def test_one_heavy_user_does_not_hold_back_the_others(redis: Any) -> None:
    for _ in range(6):
        put(redis, 1)
    put(redis, 2)
    put(redis, 3)
    # The heavy user's first request was first in line; after it, one each in turn.
    assert users(claim_all(redis)) == ["u1", "u2", "u3", "u1", "u1", "u1", "u1", "u1"]


def test_requests_of_equal_cost_from_different_users_go_in_arrival_order(redis: Any) -> None:
    sent = [put(redis, user) for user in (5, 3, 9, 1, 7)]
    assert claim_all(redis) == sent


def test_shares_are_counted_in_tokens(redis: Any) -> None:
    for _ in range(3):
        put(redis, 1, cost=1000)
    for _ in range(12):
        put(redis, 2, cost=100)
    order = users(claim_all(redis))
    # While user 1 waits for its second turn, user 2 is served its 1,000 tokens' worth.
    assert order[:12] == ["u1", *["u2"] * 10, "u1"]


def test_a_user_back_after_a_while_has_saved_no_credit(redis: Any) -> None:
    for _ in range(4):
        put(redis, 1)
    assert users([claim(redis)[0], claim(redis)[0]]) == ["u1", "u1"]  # type: ignore[index]
    # User 2 was away while user 1 was served: it starts at the queue's virtual time, so it
    # is served next, but then shares turns instead of running ahead on credit.
    for _ in range(3):
        put(redis, 2)
    assert users(claim_all(redis)) == ["u2", "u1", "u2", "u1", "u2"]


def test_an_empty_queue_starts_its_busy_period_again(redis: Any) -> None:
    for _ in range(3):
        put(redis, 1)
    claim_all(redis)
    assert not redis.exists(queue.fair_key(POOL, "free"))
    first = put(redis, 1)
    other = put(redis, 2)
    # No memory of the busy period before: the heavy user's tags start at zero again.
    assert claim_all(redis) == [first, other]


def test_a_better_tier_is_served_first_and_full_tiers_are_skipped(redis: Any) -> None:
    free = put(redis, 1, tier="free")
    pro = put(redis, 2, tier="pro")
    assert claim(redis, ["free"])[0] == free  # type: ignore[index]
    put(redis, 1, tier="free")
    assert claim(redis)[0] == pro  # type: ignore[index]


def requeue(redis: Any, claimed: list[Any]) -> None:
    """Put a claimed generation back, as the scheduler does when no worker could take it."""
    generation_id, queue_name, score, _ = claimed
    redis.eval(
        queue.REQUEUE,
        4,
        queue_name,
        queue.queued_at_key(POOL, "free"),
        queue.fair_key(POOL, "free"),
        queue.job_key(generation_id),
        score,
        "1",
        generation_id,
    )


def test_a_requeued_generation_keeps_its_place(redis: Any) -> None:
    first, second = put(redis, 1), put(redis, 2)
    claimed = claim(redis)
    assert claimed is not None and claimed[0] == first
    third = put(redis, 3)  # queued while the first was out of line
    requeue(redis, claimed)
    assert redis.hget(queue.job_key(first), "owner") is None
    assert claim_all(redis) == [first, second, third]


def test_a_requeued_generation_that_emptied_its_queue_is_not_passed_by_later_ones(
    redis: Any,
) -> None:
    """Its claim ended the busy period (the fair-queue state went with it), so those who
    queue meanwhile start again from zero: it goes back ahead of them, not behind them all."""
    for _ in range(3):
        put(redis, 1)
    claim(redis)
    claim(redis)
    last = claim(redis)  # a tag of several hundred tokens; the queue is empty now
    assert last is not None and not redis.exists(queue.fair_key(POOL, "free"))
    later = [put(redis, 2), put(redis, 3)]
    requeue(redis, last)
    assert claim_all(redis) == [last[0], *later]


def test_the_queue_time_limit_counts_from_enqueue_not_from_the_fair_tag(redis: Any) -> None:
    now = queue.now_ms()
    # User 1's later requests have large fair tags but were enqueued long ago.
    old = [put(redis, 1, cost=5000, at_ms=now - 60_000) for _ in range(3)]
    recent = put(redis, 2, at_ms=now)
    keys = queue.expire_keys(POOL, queue.tiers_best_first())
    expired = redis.eval(queue.EXPIRE_QUEUED, len(keys), *keys, str(now - 30_000))
    assert sorted(expired) == sorted(old)
    assert claim_all(redis) == [recent]


def test_an_unqueued_generation_is_neither_served_nor_expired(redis: Any) -> None:
    now = queue.now_ms()
    gone = put(redis, 1, at_ms=now - 60_000)
    assert queue.unqueue(redis, pool=POOL, tier="free", generation_id=gone)
    keys = queue.expire_keys(POOL, ["free"])
    assert redis.eval(queue.EXPIRE_QUEUED, len(keys), *keys, str(now)) == []
    assert claim_all(redis) == []
