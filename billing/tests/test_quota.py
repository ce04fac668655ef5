"""The Lua scripts directly, on a clock the tests move: every scope, all or nothing."""

from __future__ import annotations

import threading
import uuid

from billing import quota
from chatsite.testing import budget

T0 = 1_900_000_000_000  # ms; any instant works, the scripts only see what they are given
USER = 7
POOL = 3


def limits(**overrides: int | None) -> quota.Limits:
    values: dict[str, int | None] = {
        "requests_per_minute": 1000,
        "tokens_per_minute": 1_000_000,
        "max_concurrent": 1000,
        "message_cap": None,
        "message_cap_window_ms": 3_600_000,
    }
    values.update(overrides)
    return quota.Limits(**values)  # type: ignore[arg-type]


def reserve(
    at: int, *, tokens: int = 10, rid: str | None = None, **overrides: int | None
) -> quota.Outcome:
    return quota.reserve(
        user_id=USER,
        pool_id=POOL,
        reservation_id=rid or str(uuid.uuid4()),
        prompt_tokens=tokens // 2,
        tokens=tokens,
        limits=limits(**overrides),
        now=at,
    )


def settle(
    rid: str, at: int, *, charged: int, tpm: int = 1_000_000, refund: bool = False
) -> int | None:
    return quota.settle(
        user_id=USER,
        pool_id=POOL,
        reservation_id=rid,
        tokens_per_minute=tpm,
        charged_tokens=charged,
        refund_message=refund,
        now=at,
    )


def scopes(outcome: quota.Outcome) -> set[str]:
    return {refusal.scope for refusal in outcome.refusals}


def test_requests_per_minute_refuses_the_next_request_until_the_bucket_refills() -> None:
    for _ in range(3):
        assert reserve(T0, requests_per_minute=3).admitted

    refused = reserve(T0, requests_per_minute=3)

    assert not refused.admitted
    assert scopes(refused) == {"requests"}
    assert refused.refusals[0].retry_ms == 20_000  # one request every 60 s / 3
    assert not reserve(T0 + 19_999, requests_per_minute=3).admitted
    assert reserve(T0 + 20_000, requests_per_minute=3).admitted


def test_tokens_per_minute_refuses_what_does_not_fit_and_says_when_it_will() -> None:
    assert reserve(T0, tokens=900, tokens_per_minute=1000).admitted

    refused = reserve(T0, tokens=200, tokens_per_minute=1000)

    assert scopes(refused) == {"tokens"}
    # 100 tokens are missing; the bucket refills 1000 per minute: 6 s.
    assert refused.refusals[0].retry_ms == 6_000
    assert reserve(T0 + 6_000, tokens=200, tokens_per_minute=1000).admitted


def test_admitted_answer_reports_both_buckets_for_the_headers() -> None:
    outcome = reserve(T0, tokens=250, requests_per_minute=10, tokens_per_minute=1000)

    assert outcome.requests == quota.BucketState(limit=10, remaining=9, reset_ms=6_000)
    assert outcome.tokens == quota.BucketState(limit=1000, remaining=750, reset_ms=15_000)
    requests, tokens = quota.peek(
        user_id=USER, requests_per_minute=10, tokens_per_minute=1000, now=T0 + 3_000
    )
    assert (requests.remaining, requests.reset_ms) == (9, 3_000)
    assert (tokens.remaining, tokens.reset_ms) == (800, 12_000)


def test_message_cap_holds_over_a_rolling_window_and_frees_as_the_oldest_leaves() -> None:
    window = 10_000
    for offset in (0, 1_000, 2_000):
        assert reserve(T0 + offset, message_cap=3, message_cap_window_ms=window).admitted

    refused = reserve(T0 + 5_000, message_cap=3, message_cap_window_ms=window)

    assert scopes(refused) == {"messages"}
    assert refused.refusals[0].retry_ms == 5_000  # the first message leaves at T0 + 10 s
    assert not reserve(T0 + 9_999, message_cap=3, message_cap_window_ms=window).admitted
    assert reserve(T0 + 10_000, message_cap=3, message_cap_window_ms=window).admitted
    # Full again: the next room comes when the message of T0 + 1 s leaves.
    again = reserve(T0 + 10_500, message_cap=3, message_cap_window_ms=window)
    assert again.refusals[0].retry_ms == 500


def test_a_lowered_cap_waits_for_enough_messages_to_leave() -> None:
    window = 10_000
    for offset in range(5):
        assert reserve(T0 + offset * 1_000, message_cap=10, message_cap_window_ms=window).admitted

    refused = reserve(T0 + 5_000, message_cap=2, message_cap_window_ms=window)

    # Five in the window, two allowed: room once the first four have left (T0 + 3 s + 10 s).
    assert refused.refusals[0].retry_ms == 8_000


def test_concurrency_slots_are_freed_by_settling() -> None:
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    assert reserve(T0, rid=first, max_concurrent=2).admitted
    assert reserve(T0, rid=second, max_concurrent=2).admitted

    refused = reserve(T0, max_concurrent=2)
    assert scopes(refused) == {"concurrency"}

    settle(first, T0 + 1, charged=10)
    assert reserve(T0 + 2, max_concurrent=2).admitted


def test_a_slot_leaked_by_a_killed_process_frees_itself(settings: object) -> None:
    ttl_ms = quota.settings.BILLING_SLOT_TTL_SECONDS * 1000
    # Reserved, then the process died: nobody will ever settle this one.
    assert reserve(T0, max_concurrent=1).admitted
    assert scopes(reserve(T0 + ttl_ms - 1, max_concurrent=1)) == {"concurrency"}

    assert reserve(T0 + ttl_ms, max_concurrent=1).admitted
    assert quota.concurrency_in_use(user_id=USER, now=T0 + ttl_ms) == 1


def test_a_refusal_takes_nothing_from_any_scope() -> None:
    window = 60_000
    assert reserve(T0, tokens=100, message_cap=1, message_cap_window_ms=window).admitted

    # The cap refuses; the request, the tokens and a slot must not be taken either.
    refused = reserve(T0, tokens=100, message_cap=1, message_cap_window_ms=window)
    assert scopes(refused) == {"messages"}

    requests, tokens = quota.peek(
        user_id=USER, requests_per_minute=1000, tokens_per_minute=1_000_000, now=T0
    )
    assert requests.remaining == 999
    assert tokens.remaining == 1_000_000 - 100
    assert quota.concurrency_in_use(user_id=USER, now=T0) == 1


def test_every_refusing_scope_is_reported() -> None:
    assert reserve(T0, tokens=1000, requests_per_minute=1, tokens_per_minute=1000).admitted

    refused = reserve(T0, tokens=1000, requests_per_minute=1, tokens_per_minute=1000)

    assert scopes(refused) == {"requests", "tokens"}


def test_refunds_never_push_the_bucket_above_capacity() -> None:
    rid = str(uuid.uuid4())
    assert reserve(T0, rid=rid, tokens=600, tokens_per_minute=1000).admitted
    # A minute later the bucket has refilled to capacity on its own...
    later = T0 + 60_000

    # ...so giving back the 500 unused tokens must not make it hold more than 1000.
    assert settle(rid, later, charged=100, tpm=1000) == 600
    _, tokens = quota.peek(
        user_id=USER, requests_per_minute=1000, tokens_per_minute=1000, now=later
    )
    assert tokens.remaining == 1000
    assert reserve(later, tokens=1000, tokens_per_minute=1000).admitted
    assert not reserve(later, tokens=1, tokens_per_minute=1000).admitted


def test_unused_tokens_come_back_and_overruns_are_charged() -> None:
    under, over = str(uuid.uuid4()), str(uuid.uuid4())
    assert reserve(T0, rid=under, tokens=400, tokens_per_minute=1000).admitted
    assert reserve(T0, rid=over, tokens=400, tokens_per_minute=1000).admitted

    settle(under, T0, charged=100, tpm=1000)  # 300 back: 500
    _, tokens = quota.peek(user_id=USER, requests_per_minute=1000, tokens_per_minute=1000, now=T0)
    assert tokens.remaining == 500
    settle(over, T0, charged=700, tpm=1000)  # 300 more than reserved: 200
    _, tokens = quota.peek(user_id=USER, requests_per_minute=1000, tokens_per_minute=1000, now=T0)
    assert tokens.remaining == 200


def test_settling_twice_changes_nothing_the_second_time() -> None:
    rid = str(uuid.uuid4())
    assert reserve(T0, rid=rid, tokens=500, tokens_per_minute=1000).admitted

    assert settle(rid, T0, charged=0, tpm=1000) == 500
    assert settle(rid, T0, charged=0, tpm=1000) is None

    _, tokens = quota.peek(user_id=USER, requests_per_minute=1000, tokens_per_minute=1000, now=T0)
    assert tokens.remaining == 1000
    assert quota.held(user_id=USER, reservation_id=rid) is None


def test_a_refunded_message_leaves_the_cap_window() -> None:
    rid = str(uuid.uuid4())
    assert reserve(T0, rid=rid, message_cap=1, message_cap_window_ms=60_000).admitted

    settle(rid, T0 + 1, charged=0, refund=True)

    assert reserve(T0 + 2, message_cap=1, message_cap_window_ms=60_000).admitted


def test_reserving_the_same_id_twice_takes_once() -> None:
    rid = str(uuid.uuid4())
    assert reserve(T0, rid=rid, tokens=300, tokens_per_minute=1000, max_concurrent=1).admitted
    again = reserve(T0, rid=rid, tokens=300, tokens_per_minute=1000, max_concurrent=1)

    assert again.admitted
    assert again.tokens is not None and again.tokens.remaining == 700


def test_200_concurrent_reservations_against_a_cap_of_10_admit_exactly_10() -> None:
    barrier = threading.Barrier(200)
    outcomes: list[quota.Outcome | None] = [None] * 200

    def attempt(index: int) -> None:
        barrier.wait()
        outcomes[index] = reserve(T0, message_cap=10, message_cap_window_ms=3_600_000)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(200)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=budget(60))  # the failure point only
    assert not any(thread.is_alive() for thread in threads), "a reservation never returned"

    admitted = [o for o in outcomes if o is not None and o.admitted]
    refused = [o for o in outcomes if o is not None and not o.admitted]
    assert len(admitted) == 10
    assert len(refused) == 190
    assert all(scopes(o) == {"messages"} for o in refused)
    assert len(quota.cap_window(user_id=USER, pool_id=POOL, window_ms=3_600_000, now=T0)) == 10
