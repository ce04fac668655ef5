"""Placement: in which order to try a pool's workers for one request. Pure policies.

A policy is handed everything it decides on (the candidates with their load, the request with
its pool, conversation, sticky worker and round-robin turn) and returns the candidates in
order of preference; it never reads Redis, the database or the settings while it decides.
The scheduler hands it the workers with room for one more generation; background completions
(titles, summaries, Llama Guard) hand it their pool's healthy workers, so one policy chooses
a worker everywhere.

`settings.SCHEDULER_PLACEMENT` names the policy: one of the short names below or a dotted
path to a class whose instances have `order`. Anything else stops the process at start
(`InferenceConfig.ready`). Modelled on SGLang router's `LoadBalancingPolicy` (one
implementation per policy and a factory) and vLLM production-stack's `RoutingInterface`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from chatsite import dotted


@dataclass(frozen=True)
class Candidate:
    """A worker that could serve the request, with its load as last known."""

    id: int
    leases: int = 0  # generations the schedulers hold on it now
    running: float = 0.0  # vLLM's own counts, from its last /metrics
    waiting: float = 0.0
    kv_cache_percent: float = 0.0

    @property
    def busy(self) -> float:
        """What a new request would queue behind: the generations placed on it, and those
        vLLM could not fit in its batch yet."""
        return self.leases + self.waiting


@dataclass(frozen=True)
class PlacementRequest:
    """What is known of the request being placed."""

    pool: str
    conversation_id: str | None = None
    # The worker that served the conversation's last turn (its KV cache holds the prefix).
    sticky_worker_id: int | None = None
    # A counter that grows by one per placement in the pool, for policies that rotate.
    turn: int = 0


@runtime_checkable
class PlacementPolicy(Protocol):
    """Orders a pool's candidates for one request, best first."""

    def order(
        self, candidates: Sequence[Candidate], request: PlacementRequest
    ) -> list[Candidate]: ...


def by_load(candidates: Sequence[Candidate]) -> list[Candidate]:
    """Least busy first; ties go to the lowest id, so the order is stable."""
    return sorted(candidates, key=lambda c: (c.busy, c.id))


class LeastLoadedPolicy:
    """The least busy worker first."""

    def order(self, candidates: Sequence[Candidate], request: PlacementRequest) -> list[Candidate]:
        return by_load(candidates)


class AffinityPolicy:
    """The conversation's worker first (its cached prefix saves the prompt's prefill) unless
    it is busier than the least busy one by more than `slack`; otherwise by load."""

    def __init__(self, slack: float | None = None) -> None:
        self.slack = settings.SCHEDULER_AFFINITY_SLACK if slack is None else slack

    def order(self, candidates: Sequence[Candidate], request: PlacementRequest) -> list[Candidate]:
        ranked = by_load(candidates)
        sticky = next((c for c in ranked if c.id == request.sticky_worker_id), None)
        if sticky is not None and sticky.busy <= ranked[0].busy + self.slack:
            return [sticky, *(c for c in ranked if c is not sticky)]
        return ranked


class RoundRobinPolicy:
    """Each worker in turn, ignoring load and prefixes (a baseline for comparison)."""

    def order(self, candidates: Sequence[Candidate], request: PlacementRequest) -> list[Candidate]:
        ring = sorted(candidates, key=lambda c: c.id)
        if not ring:
            return []
        start = request.turn % len(ring)
        return ring[start:] + ring[:start]


# The short names the README documents.
ALIASES = {
    "affinity": f"{__name__}.AffinityPolicy",
    "least_loaded": f"{__name__}.LeastLoadedPolicy",
    "round_robin": f"{__name__}.RoundRobinPolicy",
}


def load_policy(value: str) -> PlacementPolicy:
    """The policy `value` names (a short name or a dotted path); ImproperlyConfigured if
    it names none."""
    if value not in ALIASES and "." not in value:
        raise ImproperlyConfigured(
            f"SCHEDULER_PLACEMENT: unknown placement policy {value!r}; use one of "
            f"{', '.join(ALIASES)} or the dotted path to a policy class."
        )
    policy: PlacementPolicy = dotted.build(
        "SCHEDULER_PLACEMENT", ALIASES.get(value, value), PlacementPolicy
    )
    return policy


def configured_policy() -> PlacementPolicy:
    """The policy `settings.SCHEDULER_PLACEMENT` names, built now."""
    return load_policy(settings.SCHEDULER_PLACEMENT)
