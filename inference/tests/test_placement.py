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
    RoundRobinPolicy,
    configured_policy,
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
