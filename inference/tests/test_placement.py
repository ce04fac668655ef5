"""Placement policies as pure functions of what they are handed: no Redis, no database, no
processes. And the setting that names the policy, refused at start when it names none."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from django.apps import apps
from django.core.exceptions import ImproperlyConfigured

from inference.scheduler.placement import (
    AffinityPolicy,
    Candidate,
    LeastLoadedPolicy,
    PlacementRequest,
    PredictedTTFTPolicy,
    RoundRobinPolicy,
    Speed,
    TTFTFit,
    configured_policy,
    decayed_rate,
    load_policy,
)


class ReversedPolicy:
    """A custom policy, named by its dotted path: the highest id first."""

    def order(self, candidates: Sequence[Candidate], request: PlacementRequest) -> list[Candidate]:
        return sorted(candidates, key=lambda c: -c.id)


class NotAPolicy:
    pass


def ids(candidates: list[Candidate]) -> list[int]:
    return [c.id for c in candidates]


def request(sticky: int | None = None, turn: int = 0) -> PlacementRequest:
    return PlacementRequest(pool="m", conversation_id="c1", sticky_worker_id=sticky, turn=turn)


WORKERS = [
    Candidate(id=3, leases=2, waiting=0),
    Candidate(id=1, leases=5, waiting=1),
    Candidate(id=2, leases=2, waiting=0),
]


def test_least_loaded_orders_by_leases_and_waiting_then_id() -> None:
    # 3 and 2 both carry 2; 1 carries 6. vLLM's running count is not added to our leases.
    busy_by_vllm = Candidate(id=4, leases=1, running=50, waiting=0)
    assert ids(LeastLoadedPolicy().order([*WORKERS, busy_by_vllm], request())) == [4, 2, 3, 1]


def test_affinity_puts_the_sticky_worker_first_within_the_slack() -> None:
    policy = AffinityPolicy(slack=4)
    # Worker 1 carries 6, the least loaded 2: exactly the slack more, so it keeps the turn.
    assert ids(policy.order(WORKERS, request(sticky=1))) == [1, 2, 3]
    assert ids(policy.order(WORKERS, request(sticky=3))) == [3, 2, 1]


def test_affinity_yields_to_load_when_the_sticky_worker_is_much_busier() -> None:
    policy = AffinityPolicy(slack=3)
    assert ids(policy.order(WORKERS, request(sticky=1))) == [2, 3, 1]


def test_affinity_without_a_usable_sticky_worker_is_least_loaded() -> None:
    policy = AffinityPolicy(slack=4)
    assert ids(policy.order(WORKERS, request())) == [2, 3, 1]
    # The sticky worker is not a candidate (down, full): by load.
    assert ids(policy.order(WORKERS, request(sticky=9))) == [2, 3, 1]
    assert policy.order([], request(sticky=1)) == []


def test_affinity_reads_its_slack_when_built(settings: Any) -> None:
    settings.SCHEDULER_AFFINITY_SLACK = 0
    policy = AffinityPolicy()
    settings.SCHEDULER_AFFINITY_SLACK = 100
    assert ids(policy.order(WORKERS, request(sticky=1))) == [2, 3, 1]


def test_round_robin_rotates_with_the_turn_and_ignores_load() -> None:
    policy = RoundRobinPolicy()
    orders = [ids(policy.order(WORKERS, request(sticky=1, turn=turn))) for turn in range(4)]
    assert orders == [[1, 2, 3], [2, 3, 1], [3, 1, 2], [1, 2, 3]]
    assert policy.order([], request(turn=7)) == []


def test_short_names_and_dotted_paths_name_policies() -> None:
    assert isinstance(load_policy("affinity"), AffinityPolicy)
    assert isinstance(load_policy("least_loaded"), LeastLoadedPolicy)
    assert isinstance(load_policy("round_robin"), RoundRobinPolicy)
    custom = load_policy("inference.tests.test_placement.ReversedPolicy")
    assert isinstance(custom, ReversedPolicy)
    assert ids(custom.order(WORKERS, request())) == [3, 2, 1]


def test_the_configured_policy_follows_the_setting(settings: Any) -> None:
    settings.SCHEDULER_PLACEMENT = "inference.tests.test_placement.ReversedPolicy"
    assert isinstance(configured_policy(), ReversedPolicy)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("sticky", "unknown placement policy 'sticky'"),
        ("inference.tests.test_placement.Missing", "cannot import"),
        ("inference.tests.test_placement.NotAPolicy", "is not a class implementing"),
    ],
)
def test_an_unknown_placement_stops_the_process_at_start(
    settings: Any, value: str, why: str
) -> None:
    settings.SCHEDULER_PLACEMENT = value
    with pytest.raises(ImproperlyConfigured, match="SCHEDULER_PLACEMENT") as refused:
        apps.get_app_config("inference").ready()
    assert why in str(refused.value)
    assert repr(value) in str(refused.value)


# Predicted time to first token: 1 ms per prompt token to read, 10 ms per stream decoding.
SPEED = Speed(base_ms=50, ms_per_token=1.0, ms_per_stream=10.0)


def ttft_policy(**kwargs: Any) -> PredictedTTFTPolicy:
    options = {
        "interference": 0.0,
        "crowding": 0.0,
        "spill": 0.0,
        "hysteresis": 0.2,
        "hysteresis_ms": 50.0,
        **kwargs,
    }
    return PredictedTTFTPolicy(default_speed=SPEED, **options)


def prompt(tokens: int, sticky: int | None = None) -> PlacementRequest:
    # No conversation: a `/v1` request is placed by what the workers hold of its prompt.
    return PlacementRequest(pool="m", prompt_tokens=tokens, sticky_worker_id=sticky)


def test_predicted_ttft_prefers_the_worker_holding_the_prompt() -> None:
    holder = Candidate(id=2, leases=3, cached_tokens=512)
    idle = Candidate(id=1, leases=0)
    # 2: 50 + 88 + 30 = 168 ms; 1: 50 + 600 = 650 ms.
    assert ids(ttft_policy().order([idle, holder], prompt(600))) == [2, 1]
    assert ttft_policy().predicted_ttft_ms(holder, prompt(600)) == 168


def test_predicted_ttft_leaves_a_holder_with_a_long_backlog() -> None:
    holder = Candidate(id=2, leases=3, cached_tokens=512, prefill_backlog=2000)
    idle = Candidate(id=1, leases=0)
    assert ids(ttft_policy().order([holder, idle], prompt(600))) == [1, 2]


def test_predicted_ttft_spreads_new_prompts_by_streams() -> None:
    busy = Candidate(id=1, leases=8)
    quiet = Candidate(id=2, leases=2)
    assert ids(ttft_policy().order([busy, quiet], prompt(300))) == [2, 1]


def test_predicted_ttft_counts_the_stall_of_the_answers_decoding_there() -> None:
    # Without the stall both predict 50 + 300 + 40 = 390 ms (2) and 50 + 320 = 370 ms (1).
    crowded = Candidate(id=2, leases=4, cached_tokens=0)
    alone = Candidate(id=1, leases=0, prefill_backlog=20)
    assert ids(ttft_policy().order([crowded, alone], prompt(300))) == [1, 2]
    crowded_cheaper = Candidate(id=2, leases=4, cached_tokens=40)
    assert ids(ttft_policy().order([crowded_cheaper, alone], prompt(300))) == [2, 1]
    # Each of the 4 answers loses half of the 260 ms read: 520 ms more on 2.
    assert ids(ttft_policy(interference=0.5).order([crowded_cheaper, alone], prompt(300))) == [
        1,
        2,
    ]


def test_predicted_ttft_keeps_a_conversation_on_its_worker_within_the_hysteresis() -> None:
    last = Candidate(id=1, leases=6)  # 50 + 100 + 60 = 210 ms
    other = Candidate(id=2, leases=2)  # 50 + 100 + 20 = 170 ms: better, but by less than 84 ms
    assert ids(ttft_policy().order([last, other], prompt(100, sticky=1))) == [1, 2]
    assert ids(ttft_policy(hysteresis=0, hysteresis_ms=0).order([last, other], prompt(100, 1))) == [
        2,
        1,
    ]
    much_busier = Candidate(id=1, leases=20)  # 350 ms
    assert ids(ttft_policy().order([much_busier, other], prompt(100, sticky=1))) == [2, 1]


def test_predicted_ttft_uses_each_workers_fitted_speed() -> None:
    slow = Candidate(id=1, speed=Speed(base_ms=50, ms_per_token=4.0, ms_per_stream=10))
    fast = Candidate(id=2, leases=5)
    assert ids(ttft_policy().order([slow, fast], prompt(100))) == [2, 1]
    assert ttft_policy().order([], prompt(100)) == []


def test_the_ttft_fit_recovers_a_workers_speed() -> None:
    fit = TTFTFit(decay=1.0, min_samples=8)
    observations = [(tokens, streams) for tokens in (100, 400, 900, 1600) for streams in (0, 3, 9)]
    for tokens, streams in observations[:7]:
        fit.observe(tokens=tokens, streams=streams, ttft_ms=40 + 0.3 * tokens + 6 * streams)
    assert fit.speed() is None  # too few yet
    for tokens, streams in observations[7:]:
        fit.observe(tokens=tokens, streams=streams, ttft_ms=40 + 0.3 * tokens + 6 * streams)
    speed = fit.speed()
    assert speed is not None
    assert speed.base_ms == pytest.approx(40)
    assert speed.ms_per_token == pytest.approx(0.3)
    assert speed.ms_per_stream == pytest.approx(6)


def test_the_ttft_fit_gives_no_speed_it_cannot_tell() -> None:
    # Never more than one stream: how a stream slows it cannot be told apart from the base.
    fit = TTFTFit(decay=1.0, min_samples=4)
    for tokens in (100, 200, 300, 400, 500):
        fit.observe(tokens=tokens, streams=0, ttft_ms=10 + tokens)
    assert fit.speed() is None
    # A fit that would make a token cost less than nothing is not used.
    negative = TTFTFit(decay=1.0, min_samples=4)
    for tokens, streams in ((100, 0), (200, 1), (300, 0), (400, 2), (500, 1)):
        negative.observe(tokens=tokens, streams=streams, ttft_ms=1000 - tokens + streams)
    assert negative.speed() is None


def test_predicted_ttft_is_a_named_policy(settings: Any) -> None:
    settings.SCHEDULER_PLACEMENT = "predicted_ttft"
    assert isinstance(configured_policy(), PredictedTTFTPolicy)


def test_a_request_stays_with_the_worker_holding_most_of_its_prompt() -> None:
    # No conversation (a `/v1` request): its home is the worker holding the longest prefix.
    home = Candidate(id=2, leases=9, cached_tokens=256)  # 50 + 44 + 90 = 184 ms
    other = Candidate(id=1, leases=0, cached_tokens=128)  # 50 + 172 = 222 ms... busier home
    quiet = Candidate(id=3, leases=0, cached_tokens=200)  # 50 + 100 = 150 ms: better by 34
    assert ids(ttft_policy().order([other, home, quiet], prompt(300))) == [2, 3, 1]
    # Past the hysteresis (150 * 1.2 + 50 = 230 ms) it leaves.
    swamped = Candidate(id=2, leases=9, cached_tokens=256, prefill_backlog=100)  # 284 ms
    assert ids(ttft_policy().order([other, swamped, quiet], prompt(300))) == [3, 1, 2]


def test_the_conversations_last_worker_is_home_among_equal_holders() -> None:
    a = Candidate(id=1, leases=4, cached_tokens=512)  # 50 + 88 + 40 = 178 ms
    b = Candidate(id=2, leases=0, cached_tokens=512)  # 50 + 88 = 138 ms
    assert ids(ttft_policy().order([a, b], prompt(600, sticky=1))) == [1, 2]
    # Equal holders and no conversation: no home, the better prediction wins.
    assert ids(ttft_policy().order([a, b], prompt(600))) == [2, 1]
    # A worker holding more is home even against the conversation's last one.
    c = Candidate(id=3, leases=6, cached_tokens=576)  # 50 + 24 + 60 = 134 ms
    assert PredictedTTFTPolicy.home([a, b, c], prompt(600, sticky=1)) == c


def test_a_prompt_nobody_holds_goes_to_the_cache_keeping_least_within_the_hysteresis() -> None:
    # 1 predicts 200 ms, 2 210 ms (within 1.2 x 200 + 50), 3 400 ms (beyond).
    full = Candidate(id=1, held_blocks=90)
    roomy = Candidate(id=2, leases=1, held_blocks=10)
    empty_but_slow = Candidate(id=3, leases=20, held_blocks=0)
    assert ids(ttft_policy().order([full, roomy, empty_but_slow], prompt(150))) == [2, 1, 3]
    # Once a worker holds part of the prompt, the cache sizes no longer decide.
    holder = Candidate(id=1, held_blocks=90, cached_tokens=128)
    assert ids(ttft_policy().order([holder, roomy, empty_but_slow], prompt(150))) == [1, 2, 3]


def test_predicted_ttft_counts_the_first_tokens_read_with_it() -> None:
    # Without crowding, 1 predicts 50 + 100 + 300 + 10 = 460 ms and 2 50 + 300 + 80 = 430 ms.
    # The first tokens still waiting on a worker are read in the steps that read this prompt:
    # each waits its 300 ms longer if it goes there.
    few = Candidate(id=1, leases=1, prefill_backlog=100, prefill_requests=1)  # 460 + 300
    many = Candidate(id=2, leases=8, prefill_requests=3)  # 430 + 900
    assert ids(ttft_policy(crowding=1.0).order([few, many], prompt(300))) == [1, 2]
    assert ids(ttft_policy().order([few, many], prompt(300))) == [2, 1]


def test_a_new_prompt_goes_to_the_least_lately_used_of_equal_caches() -> None:
    # Equal caches and within the hysteresis: the worker placed on least lately, whose
    # conversations between turns will bring it least, even with more leases now.
    lately_busy = Candidate(id=1, held_blocks=8, placement_rate=2.0)
    quiet_lately = Candidate(id=2, leases=1, held_blocks=8, placement_rate=0.4)
    assert ids(ttft_policy().order([lately_busy, quiet_lately], prompt(150))) == [2, 1]
    # The smaller cache still comes first.
    smaller = Candidate(id=1, held_blocks=4, placement_rate=2.0)
    assert ids(ttft_policy().order([smaller, quiet_lately], prompt(150))) == [1, 2]


def test_the_placement_rate_settles_at_the_pace_of_placements() -> None:
    # One placement every 200 ms (5 a second), each raising the rate by 1 / 5 s.
    rate = 0.0
    for _ in range(300):
        rate = decayed_rate(rate, 200, 5.0) + 1 / 5.0
    assert rate == pytest.approx(5.0, rel=0.03)
    # A minute without one, it is all but forgotten.
    assert decayed_rate(rate, 60_000, 5.0) < 0.001


def opening(tokens: int, pool_rate: float, *, first: bool = True) -> PlacementRequest:
    return PlacementRequest(
        pool="m", prompt_tokens=tokens, opening=first, pool_placement_rate=pool_rate
    )


def test_a_first_turn_spills_from_a_home_placed_on_past_the_pools_mean() -> None:
    # 1 holds the shared system prompt and is placed on at 3/s; the pool's mean is 2/s.
    home = Candidate(id=1, cached_tokens=512, held_blocks=40, placement_rate=3.0)
    small = Candidate(id=2, held_blocks=4, placement_rate=1.0)
    smaller_but_busier = Candidate(id=3, held_blocks=4, placement_rate=2.0)
    workers = [home, small, smaller_but_busier]
    # Past 1.2 x 2/s: the smallest cache least lately placed on reads the prompt again.
    assert ids(ttft_policy(spill=1.2).order(workers, opening(600, 2.0))) == [2, 1, 3]
    # Within it, or with spilling off, or a later turn (its own history is at home): home.
    assert ids(ttft_policy(spill=1.2).order(workers, opening(600, 2.6)))[0] == 1
    assert ids(ttft_policy(spill=0).order(workers, opening(600, 2.0)))[0] == 1
    assert ids(ttft_policy(spill=1.2).order(workers, opening(600, 2.0, first=False)))[0] == 1
    # No rate known for the pool: nothing to compare with.
    assert ids(ttft_policy(spill=1.2).order(workers, opening(600, 0.0)))[0] == 1
