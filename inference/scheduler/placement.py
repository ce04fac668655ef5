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

import math
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
    # The request's prompt tokens this worker holds in its KV cache (the prefix index).
    cached_tokens: int = 0
    # Prompt tokens placed on it that it has not finished reading (no first token yet), and
    # the requests they belong to.
    prefill_backlog: int = 0
    prefill_requests: int = 0
    # Requests placed on it lately, per second (decayed; `Capacity`): with the conversations
    # they belong to, what will come back to it, which its leases now do not show.
    placement_rate: float = 0.0
    # The blocks its KV cache holds, by the index (how much it already keeps for others).
    held_blocks: int = 0
    # Its speed as measured (`TTFTFit`); None: the model's defaults.
    speed: Speed | None = None

    @property
    def busy(self) -> float:
        """What a new request would queue behind: the generations placed on it, and those
        vLLM could not fit in its batch yet."""
        return self.leases + self.waiting


def decayed_rate(rate: float, elapsed_ms: float, seconds: float) -> float:
    """A rate of placements per second as it stands `elapsed_ms` after it was last raised,
    forgetting with the time constant `seconds`; each placement raises it by 1 / `seconds`, so
    that at a steady pace it is that pace."""
    return rate * math.exp(-max(0.0, elapsed_ms) / (seconds * 1000))


def raised_rate(rate: float, elapsed_ms: float, seconds: float) -> float:
    """`rate` as one more placement leaves it, `elapsed_ms` after the last (what the lease's
    Lua step in `capacity.py` does in Redis)."""
    return decayed_rate(rate, elapsed_ms, seconds) + 1 / seconds


@dataclass(frozen=True)
class PlacementRequest:
    """What is known of the request being placed."""

    pool: str
    conversation_id: str | None = None
    # The worker that served the conversation's last turn (its KV cache holds the prefix).
    sticky_worker_id: int | None = None
    # A counter that grows by one per placement in the pool, for policies that rotate.
    turn: int = 0
    # Its prompt's length in tokens, as the worker will read it (0: unknown).
    prompt_tokens: int = 0
    # The first turn of a conversation (no answer in its prompt yet): more turns will follow
    # it to the worker it goes to.
    opening: bool = False
    # The mean of the pool's workers' `placement_rate`.
    pool_placement_rate: float = 0.0


@dataclass(frozen=True)
class Speed:
    """How long a worker takes to a first token: `base_ms`, plus `ms_per_token` for every
    prompt token it must read before this one's (its backlog and this one's uncached part),
    plus `ms_per_stream` for every answer it is decoding meanwhile."""

    base_ms: float
    ms_per_token: float
    ms_per_stream: float

    @classmethod
    def default(cls) -> Speed:
        return cls(
            base_ms=settings.SCHEDULER_TTFT_BASE_MS,
            ms_per_token=settings.SCHEDULER_TTFT_MS_PER_TOKEN,
            ms_per_stream=settings.SCHEDULER_TTFT_MS_PER_STREAM,
        )


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


class PredictedTTFTPolicy:
    """The worker that would give the request its first token soonest, counting what it
    costs the answers already decoding there.

    Per candidate: its speed times the prompt tokens it must read first (its backlog, and the
    part of this prompt its cache lacks) and the answers it is decoding; plus, for each of
    those answers, `interference` times this prompt's own reading time (they stall while it
    is read); plus, for each request there still waiting for its first token, `crowding` times
    that reading time (vLLM reads them in the same steps, so each first token waits for this
    prompt too).

    The request's home keeps it unless another worker predicts better by more than
    `hysteresis` (a share) and `hysteresis_ms`: the worker holding the longest part of its
    prompt (a `/v1` request needs no conversation to have one), or, holding as much, the
    conversation's last worker. A prediction counts only the next first token; staying home
    also keeps one copy of a shared prompt per fleet instead of one per worker, and keeps the
    conversation's history where its next turns will look for it. A prompt no worker holds
    any of goes, among the workers within the hysteresis of the best, to the one whose cache
    keeps least for others (SGLang's "smallest tree"), so that distinct prompts spread over
    the fleet's caches; among those, to the one placed on least lately (its conversations
    between turns are load its leases do not show). Ties go to the lowest id.

    A conversation's first turn leaves a home placed on more than `spill` times the pool's
    mean rate for the worker with the smallest cache, least lately placed on: the prefix it
    shares with others (a system prompt) is read once more there, and from then on two
    workers hold it, so that a popular prompt does not pile its conversations on one worker
    (0: never)."""

    def __init__(
        self,
        *,
        interference: float | None = None,
        hysteresis: float | None = None,
        hysteresis_ms: float | None = None,
        crowding: float | None = None,
        spill: float | None = None,
        default_speed: Speed | None = None,
    ) -> None:
        self.interference = (
            settings.SCHEDULER_TTFT_INTERFERENCE if interference is None else interference
        )
        self.crowding = settings.SCHEDULER_TTFT_CROWDING if crowding is None else crowding
        self.spill = settings.SCHEDULER_SPILL if spill is None else spill
        self.hysteresis = settings.SCHEDULER_HYSTERESIS if hysteresis is None else hysteresis
        self.hysteresis_ms = (
            settings.SCHEDULER_HYSTERESIS_MS if hysteresis_ms is None else hysteresis_ms
        )
        self.default_speed = default_speed or Speed.default()

    def predicted_ttft_ms(self, candidate: Candidate, request: PlacementRequest) -> float:
        return self._predict(candidate, request)[0]

    def cost(self, candidate: Candidate, request: PlacementRequest) -> float:
        ttft_ms, own_read_ms = self._predict(candidate, request)
        waiting = self.interference * candidate.leases + self.crowding * candidate.prefill_requests
        return ttft_ms + waiting * own_read_ms

    def _predict(self, candidate: Candidate, request: PlacementRequest) -> tuple[float, float]:
        """(the predicted time to first token, this prompt's own reading time) in ms."""
        speed = candidate.speed or self.default_speed
        own_read_ms = speed.ms_per_token * max(0, request.prompt_tokens - candidate.cached_tokens)
        ttft_ms = (
            speed.base_ms
            + speed.ms_per_token * candidate.prefill_backlog
            + own_read_ms
            + speed.ms_per_stream * candidate.leases
        )
        return ttft_ms, own_read_ms

    def order(self, candidates: Sequence[Candidate], request: PlacementRequest) -> list[Candidate]:
        costs = {c.id: self.cost(c, request) for c in candidates}
        ranked = sorted(candidates, key=lambda c: (costs[c.id], c.id))
        if not ranked:
            return []
        home = self.home(ranked, request)
        best = costs[ranked[0].id]
        bound = best * (1 + self.hysteresis) + self.hysteresis_ms

        def roomiest_first(among: Sequence[Candidate]) -> list[Candidate]:
            # The one that keeps least for others, so that prompts spread over the caches.
            roomiest = min(
                among, key=lambda c: (c.held_blocks, c.placement_rate, costs[c.id], c.id)
            )
            return [roomiest, *(c for c in ranked if c is not roomiest)]

        if (
            home is not None
            and request.opening
            and self.spill > 0
            and request.pool_placement_rate > 0
            and home.placement_rate > self.spill * request.pool_placement_rate
        ):
            return roomiest_first(ranked)
        if home is not None and costs[home.id] <= bound:
            return [home, *(c for c in ranked if c is not home)]
        if home is None and all(c.cached_tokens == 0 for c in ranked):
            # A prompt nobody holds: among the workers within the hysteresis.
            return roomiest_first([c for c in ranked if costs[c.id] <= bound])
        return ranked

    @staticmethod
    def home(candidates: Sequence[Candidate], request: PlacementRequest) -> Candidate | None:
        """The worker holding the most of the prompt, the conversation's last one first
        among equals; None where no worker holds more than the others."""
        most = max(c.cached_tokens for c in candidates)
        holders = [c for c in candidates if c.cached_tokens == most]
        sticky = next((c for c in holders if c.id == request.sticky_worker_id), None)
        if sticky is not None:
            return sticky
        return holders[0] if len(holders) == 1 else None


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
    "predicted_ttft": f"{__name__}.PredictedTTFTPolicy",
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


class TTFTFit:
    """A worker's `Speed`, fitted from its own first tokens: least squares of the time to a
    first token on the prompt tokens it had to read and the answers it was decoding, with
    older measurements weighing less (`decay` per new one). Until it has `min_samples`, or
    where the fit comes out negative (too little spread to tell), `speed()` is None and the
    policy uses its defaults."""

    FEATURES = 3  # 1, tokens read, streams decoding

    def __init__(self, *, decay: float = 0.98, min_samples: int = 16) -> None:
        self.decay = decay
        self.min_samples = min_samples
        self.samples = 0
        self._xtx = [[0.0] * self.FEATURES for _ in range(self.FEATURES)]
        self._xty = [0.0] * self.FEATURES

    def observe(self, *, tokens: int, streams: int, ttft_ms: float) -> None:
        x = (1.0, float(tokens), float(streams))
        for i in range(self.FEATURES):
            self._xty[i] = self._xty[i] * self.decay + x[i] * ttft_ms
            for j in range(self.FEATURES):
                self._xtx[i][j] = self._xtx[i][j] * self.decay + x[i] * x[j]
        self.samples += 1

    def speed(self) -> Speed | None:
        if self.samples < self.min_samples:
            return None
        solved = _solve(self._xtx, self._xty)
        if solved is None or min(solved) < 0:
            return None
        base_ms, ms_per_token, ms_per_stream = solved
        return Speed(base_ms=base_ms, ms_per_token=ms_per_token, ms_per_stream=ms_per_stream)


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """`x` with `a x = b` (Gauss-Jordan with partial pivoting); None if `a` is singular."""
    n = len(b)
    rows = [[*a[i], b[i]] for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(rows[r][col]))
        if abs(rows[pivot][col]) < 1e-9:
            return None
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for r in range(n):
            if r != col:
                factor = rows[r][col] / rows[col][col]
                rows[r] = [v - factor * p for v, p in zip(rows[r], rows[col], strict=True)]
    return [rows[i][n] / rows[i][i] for i in range(n)]
