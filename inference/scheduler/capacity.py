"""Capacity: which workers can take one more generation, and the leases that say so.

A replica keeps a `WorkerView` per worker (its row, its load as last measured). Room on a
worker is a lease in `lease:<worker>` (a sorted set scored by expiry), taken by one Lua step
so that replicas never overfill a worker, and renewed while the generation runs; the leases
of a replica that dies lapse by themselves.

Admission is the schedulers' own accounting of what they have sent, checked at the moment a
generation is placed: at most the worker's `max_concurrency` leases, and at most the tokens
its KV cache holds (`vllm:cache_config_info`; times `SCHEDULER_KV_OVERCOMMIT`), counting each
lease as its prompt plus its `max_tokens`. Each tier may fill its share of that room
(`SCHEDULER_TIER_SHARE`): free answers stop short and leave headroom that only paid answers
take, and pro answers may go past it, for vLLM's priority scheduling to serve first. Within
that vLLM's continuous batching and its priority order do the rest; no reading of vLLM's
queue, which is a second old, holds work back.

Placement asks the configured policy (`placement.py`) with the facts read here: the loads,
the prompt tokens each worker's KV cache already holds (`prefix.py`), the prompt tokens placed
on it that it has not read yet (`prefill:<worker>`, kept with the lease), each worker's speed as
fitted from its own first tokens, the conversation's sticky worker and the pool's round-robin
turn.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, NamedTuple

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections

from chatsite.catalog import CATALOG
from chatsite.redis import sync_redis

from .. import queue, services
from ..client import WorkerLoad
from ..models import ModelPool, Worker
from ..tokens import pool_tokenizer_folder
from . import prefix
from .placement import (
    Candidate,
    PlacementPolicy,
    PlacementRequest,
    TTFTFit,
    configured_policy,
    decayed_rate,
)

logger = logging.getLogger(__name__)

# Take a lease on a worker only while it has room: fewer leases than its concurrency, and
# (with a token budget, ARGV[6] > 0) room in its KV cache for this one's tokens; an idle
# worker takes any one. Expired leases (a dead replica's) are dropped first, so capacity heals
# by itself. A lease taken raises the worker's rate of placements (`placement.decayed_rate`).
# KEYS: the leases, their tokens, the prompt tokens they have yet to read, the rate. ARGV:
# now, concurrency, expiry, generation id, its tokens, the budget, its prompt tokens to read,
# the rate's time constant in ms.
ACQUIRE_LEASE = """
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if #expired > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
  redis.call('HDEL', KEYS[2], unpack(expired))
  redis.call('HDEL', KEYS[3], unpack(expired))
end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
local budget = tonumber(ARGV[6])
if budget > 0 then
  local held = 0
  for _, tokens in ipairs(redis.call('HVALS', KEYS[2])) do
    held = held + tonumber(tokens)
  end
  if held > 0 and held + tonumber(ARGV[5]) > budget then
    return 0
  end
end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4])
redis.call('HSET', KEYS[2], ARGV[4], ARGV[5])
if tonumber(ARGV[7]) > 0 then
  redis.call('HSET', KEYS[3], ARGV[4], ARGV[7])
end
local tau = tonumber(ARGV[8])
local now = tonumber(ARGV[1])
local last = redis.call('HMGET', KEYS[4], 'rate', 'at')
local rate = tonumber(last[1]) or 0
local at = tonumber(last[2]) or now
rate = rate * math.exp(-math.max(0, now - at) / tau) + 1000 / tau
redis.call('HSET', KEYS[4], 'rate', tostring(rate), 'at', ARGV[1])
redis.call('PEXPIRE', KEYS[4], math.floor(tau * 20))
return 1
"""

# Give a lease back (KEYS: the leases, their tokens, their prompt tokens to read; ARGV: the
# generation id, the wake channel) and wake the replicas, in one round trip: a script, since
# redis-py's cluster pipelines refuse PUBLISH.
RELEASE_LEASE = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('PUBLISH', ARGV[2], 'released')
return 1
"""


@dataclass
class WorkerView:
    """What a replica knows of a worker: its row, and its load as last measured."""

    id: int
    name: str
    pool: str
    url: str
    served_model: str
    state: str
    max_concurrency: int
    # The folder of its model's tokenizer and chat template (its pool's).
    tokenizer_folder: str = ""
    # Its pool's sampling for the fields a request leaves out (`sampling.request_sampling`).
    sampling_defaults: dict[str, Any] = field(default_factory=dict)
    load: WorkerLoad | None = None
    leases: int = 0
    # Prompt tokens placed on it that it has not read yet (every replica's placements), and
    # the requests they belong to.
    backlog: int = 0
    backlog_requests: int = 0
    # Requests placed on it lately, per second (every replica's; `placement.decayed_rate`).
    placement_rate: float = 0.0
    # The blocks its KV cache holds, by the prefix index.
    held_blocks: int = 0
    # Where it publishes vLLM's KV cache events, if it does (`kv_events.py`).
    kv_events_endpoint: str = ""
    kv_events_replay_endpoint: str = ""

    @property
    def block_size(self) -> int:
        return self.load.block_size if self.load is not None else 0

    @property
    def capacity_blocks(self) -> int:
        return self.load.num_gpu_blocks if self.load is not None else 0

    def has_room(self, tier: str | None = None) -> bool:
        """Room for one more lease of `tier` (of the tier with the largest share if None), as
        far as this replica counted; the lease's Lua step decides, with every replica's
        leases and the KV budget."""
        return self.state == Worker.State.HEALTHY and self.leases < self.lease_limit(tier)

    def lease_limit(self, tier: str | None = None) -> int:
        """The leases on it past which `tier`'s answers wait; an idle worker takes one."""
        return max(1, int(self.max_concurrency * tier_share(tier) + 0.5))

    def token_budget(self, tier: str | None = None) -> int:
        """The tokens its leases may hold at once when `tier`'s answer comes; 0 where the
        worker does not report its KV cache (then only its lease limit bounds it)."""
        capacity = self.load.kv_capacity_tokens if self.load is not None else 0
        return int(capacity * settings.SCHEDULER_KV_OVERCOMMIT * tier_share(tier))


def tier_share(tier: str | None) -> float:
    """The share of a worker's room `tier`'s answers may fill (`SCHEDULER_TIER_SHARE`); with
    no tier, the largest share, i.e. the room any answer could still take."""
    shares: dict[str, float] = settings.SCHEDULER_TIER_SHARE
    if tier is None:
        return max([1.0, *shares.values()])
    return shares.get(tier, 1.0)


@dataclass
class Placement:
    """A worker chosen for a request, with what placement knew of the request there."""

    view: WorkerView
    prompt: prefix.Prompt | None
    prompt_tokens: int
    cached_tokens: int = 0

    @property
    def uncached_tokens(self) -> int:
        return max(0, self.prompt_tokens - self.cached_tokens)


@dataclass(frozen=True)
class Admitted:
    """What a worker had before it to read when a generation was admitted there: with the
    time to its first token, one measurement of the worker's speed."""

    worker_id: int
    tokens: int  # its backlog and this prompt's uncached tokens
    streams: int  # the leases on it before this one


class Capacity:
    """This replica's workers, the leases it holds, and the placement of a generation."""

    def __init__(self, redis: Any, policy: PlacementPolicy) -> None:
        self.redis = redis
        self.policy = policy
        self.index = prefix.RedisIndex(redis)
        self.workers: dict[int, WorkerView] = {}
        # The pools with workers (placement), and every active pool (the queue limit and the
        # queue positions: a pool without workers still has a line that must not wait for
        # ever). Both as of the last health check (`Fleet`), so the loops read no database.
        self.pools: list[str] = []
        self.active_pools: list[str] = []
        # Each active pool's active fallback pool, where it has one.
        self.fallbacks: dict[str, Fallback] = {}
        self.leases: dict[str, int] = {}  # generation id -> worker id
        # When `renew` last pushed the leases back (ms); a lease is taken for a whole lease
        # time, so a third of one between renewals leaves each two thirds to spare.
        self._renewed_ms = 0
        # Each worker's speed, fitted from the first tokens this replica saw there.
        self.fits: dict[int, TTFTFit] = {}
        # The workers whose KV cache events reach this replica: the index holds what their
        # caches hold, and placement records no estimate of its own there.
        self.exact: set[int] = set()

    async def mark_down(self, view: WorkerView, error: str) -> None:
        view.state = Worker.State.DOWN
        known = self.workers.get(view.id)
        if known is not None:
            known.state = Worker.State.DOWN
        await sync_to_async(services.worker_set_state)(
            worker_id=view.id, state=Worker.State.DOWN, error=error
        )
        await self.forget_cache(view.id)
        logger.warning("worker %s is down: %s", view.name, error)

    async def forget_cache(self, worker_id: int) -> None:
        """The worker's KV cache is gone (it went down or restarted): so is its index."""
        await self.index.clear(worker_id)

    async def candidates(self, pool: str, *, exclude: set[int] | None = None) -> list[WorkerView]:
        """The pool's healthy workers that can take one more generation now."""
        views = [
            v
            for v in self.workers.values()
            if v.pool == pool and v.state == Worker.State.HEALTHY and v.id not in (exclude or ())
        ]
        if not views:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            now = queue.now_ms()
            for view in views:
                pipe.zcount(queue.lease_key(view.id), now, "+inf")
                pipe.hvals(queue.prefill_key(view.id))
                pipe.zcard(prefix.index_key(view.id))
                pipe.hmget(queue.placed_key(view.id), "rate", "at")
            measured = await pipe.execute()
        readings = zip(views, *(measured[i::4] for i in range(4)), strict=True)
        for view, count, backlog, held, (rate, at) in readings:
            view.leases = int(count)
            view.backlog = sum(int(tokens) for tokens in backlog)
            view.backlog_requests = len(backlog)
            view.held_blocks = int(held)
            view.placement_rate = (
                decayed_rate(
                    float(rate), now - float(at), settings.SCHEDULER_PLACEMENT_RATE_SECONDS
                )
                if rate is not None and at is not None
                else 0.0
            )
        return [v for v in views if v.has_room()]

    async def place(self, job: queue.Job, views: list[WorkerView]) -> list[Placement]:
        """`views` in the order the policy prefers for `job`."""
        placements = await self._placements(job, views)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.get(queue.affinity_key(job.conversation_id))
            pipe.incr(queue.key("rr", job.pool))
            sticky, turn = await pipe.execute()
        # The pool's rate of placements: every healthy worker's, with room now or not.
        pool_views = [
            v
            for v in self.workers.values()
            if v.pool == job.pool and v.state == Worker.State.HEALTHY
        ] or views
        request = PlacementRequest(
            pool=job.pool,
            conversation_id=job.conversation_id,
            sticky_worker_id=_worker_id(sticky),
            turn=int(turn),
            prompt_tokens=placements[0].prompt_tokens if placements else 0,
            opening=not any(m.get("role") == "assistant" for m in job.messages),
            pool_placement_rate=(
                sum(v.placement_rate for v in pool_views) / len(pool_views) if pool_views else 0.0
            ),
        )
        by_id = {p.view.id: p for p in placements}
        candidates = [self._candidate(p) for p in placements]
        return [by_id[c.id] for c in self.policy.order(candidates, request)]

    async def _placements(self, job: queue.Job, views: list[WorkerView]) -> list[Placement]:
        """Each view with the part of `job`'s prompt its KV cache holds, by the index."""
        if not views:
            return []
        # A pool's workers serve one model: one tokenizer and one template.
        prompt = prefix.prompt_of(views[0].tokenizer_folder, job.messages, job.tools)
        if prompt is None:
            return [Placement(view, None, job.prompt_tokens) for view in views]
        placements = [Placement(view, prompt, len(prompt.token_ids)) for view in views]
        by_block_size: dict[int, list[Placement]] = {}
        for placement in placements:
            by_block_size.setdefault(placement.view.block_size, []).append(placement)
        for block_size, group in by_block_size.items():
            hashes = prompt.hashes(block_size)
            matched = await self.index.matched_blocks([p.view.id for p in group], hashes)
            for placement, blocks in zip(group, matched, strict=True):
                placement.cached_tokens = blocks * block_size
        return placements

    def _candidate(self, placement: Placement) -> Candidate:
        view = placement.view
        load = view.load or WorkerLoad()
        fit = self.fits.get(view.id)
        return Candidate(
            id=view.id,
            leases=view.leases,
            running=load.running,
            waiting=load.waiting,
            kv_cache_percent=load.kv_cache_percent,
            cached_tokens=placement.cached_tokens,
            prefill_backlog=view.backlog,
            prefill_requests=view.backlog_requests,
            placement_rate=view.placement_rate,
            held_blocks=view.held_blocks,
            speed=fit.speed() if fit is not None else None,
        )

    async def acquire(
        self, placement: Placement, generation_id: str, *, tokens: int = 0, tier: str = ""
    ) -> Admitted | None:
        """A lease on the placement's worker for a generation of `tier` whose prompt and
        answer take `tokens`; None if the tier's share of the worker is full (with no tier,
        the whole worker). The index learns that the worker now holds the prompt."""
        view = placement.view
        admitted = Admitted(
            worker_id=view.id,
            tokens=view.backlog + placement.uncached_tokens,
            streams=view.leases,
        )
        now = queue.now_ms()
        ok = await self.redis.eval(
            ACQUIRE_LEASE,
            4,
            queue.lease_key(view.id),
            queue.lease_tokens_key(view.id),
            queue.prefill_key(view.id),
            queue.placed_key(view.id),
            str(now),
            str(view.lease_limit(tier)),
            str(now + queue.LEASE_SECONDS * 1000),
            generation_id,
            str(max(0, tokens)),
            str(view.token_budget(tier)),
            str(placement.uncached_tokens),
            str(settings.SCHEDULER_PLACEMENT_RATE_SECONDS * 1000),
        )
        if not ok:
            return None
        self.leases[generation_id] = view.id
        view.leases += 1
        view.backlog += placement.uncached_tokens
        view.backlog_requests += 1 if placement.uncached_tokens > 0 else 0
        if placement.prompt is not None and view.id not in self.exact:
            await self.index.record(
                view.id,
                placement.prompt.hashes(view.block_size),
                capacity=view.capacity_blocks,
                now_ms=now,
            )
        return admitted

    async def first_token(self, generation_id: str, admitted: Admitted, ttft_ms: float) -> None:
        """The worker has read the prompt: off its backlog (the lease's release takes it off
        too, should this fail), and one more measurement of it."""
        self.fits.setdefault(admitted.worker_id, TTFTFit()).observe(
            tokens=admitted.tokens, streams=admitted.streams, ttft_ms=ttft_ms
        )
        try:
            await self.redis.hdel(queue.prefill_key(admitted.worker_id), generation_id)
        except Exception:
            logger.warning("could not take %s off its worker's backlog", generation_id)

    async def remember_answer(
        self,
        view: WorkerView,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        text: str,
        *,
        sequence_tokens: int,
        prompt: prefix.Prompt | None = None,
    ) -> None:
        """The index learns the blocks an answer filled on `view` (the next turn's prefix).
        `prompt`, the one placement rendered for `messages` with `view`'s tokenizer, spares
        rendering and tokenizing them again: only the answer's text is."""
        if not text or view.block_size <= 0 or view.id in self.exact:
            return
        folder = view.tokenizer_folder
        tokenize = (
            partial(prefix.answer_after, folder, prompt, text)
            if prompt is not None
            else partial(prefix.answer_of, folder, messages, tools, text)
        )
        answer = await asyncio.to_thread(tokenize, sequence_tokens=sequence_tokens)
        if answer is None:
            return
        try:
            await self.index.record(
                view.id,
                answer.hashes(view.block_size),
                capacity=view.capacity_blocks,
                now_ms=queue.now_ms(),
            )
        except Exception:  # an estimate missed; the answer itself is safe
            logger.warning("could not record an answer's blocks on %s", view.name, exc_info=True)

    async def release(self, generation_id: str) -> None:
        worker_id = self.leases.pop(generation_id, None)
        if worker_id is None:
            return
        try:
            # Room on a worker: the other replicas look for work now, not at their next
            # poll (this one is woken by its own run's end).
            await self.redis.eval(
                RELEASE_LEASE,
                3,
                queue.lease_key(worker_id),
                queue.lease_tokens_key(worker_id),
                queue.prefill_key(worker_id),
                generation_id,
                queue.wake_channel(),
            )
        except Exception:  # Redis is away: the lease, no longer renewed, lapses by itself
            logger.warning("could not release the lease of %s", generation_id)

    def forget_lease(self, generation_id: str) -> None:
        """Stop renewing a lease without removing it: it now belongs to the replica that
        adopted the generation (or lapses by itself)."""
        self.leases.pop(generation_id, None)

    async def renew(self) -> None:
        """Push back the expiry of every lease this replica holds, once a third of a lease
        time (housekeeping asks every second: a round trip a second for nothing)."""
        now = queue.now_ms()
        if not self.leases or now - self._renewed_ms < queue.LEASE_SECONDS * 1000 / 3:
            return
        expiry = now + queue.LEASE_SECONDS * 1000
        async with self.redis.pipeline(transaction=False) as pipe:
            for generation_id, worker_id in self.leases.items():
                pipe.zadd(queue.lease_key(worker_id), {generation_id: expiry}, xx=True)
            await pipe.execute()
        self._renewed_ms = now


def background_order(
    *, pool: str, worker_ids: Sequence[int], conversation_id: Any = None
) -> list[int]:
    """`worker_ids` (healthy workers of `pool`) in the order the configured policy prefers
    for a background completion, by the loads the schedulers last measured and stored."""
    if not worker_ids:
        return []
    policy = configured_policy()
    redis = sync_redis()
    try:
        now = queue.now_ms()
        pipe = redis.pipeline(transaction=False)
        for worker_id in worker_ids:
            pipe.hgetall(queue.metrics_key(worker_id))
            pipe.zcount(queue.lease_key(worker_id), now, "+inf")
        if conversation_id:
            pipe.get(queue.affinity_key(conversation_id))
        pipe.incr(queue.key("rr", pool))
        measured = pipe.execute()
    finally:
        redis.close()
    turn = measured.pop()
    sticky = measured.pop() if conversation_id else None
    candidates = [
        Candidate(
            id=worker_id,
            leases=int(leases),
            running=float(load.get("running", 0)),
            waiting=float(load.get("waiting", 0)),
            kv_cache_percent=float(load.get("kv_cache_percent", 0)),
        )
        for worker_id, load, leases in zip(worker_ids, measured[0::2], measured[1::2], strict=True)
    ]
    request = PlacementRequest(
        pool=pool,
        conversation_id=str(conversation_id) if conversation_id else None,
        sticky_worker_id=_worker_id(sticky),
        turn=int(turn),
    )
    return [c.id for c in policy.order(candidates, request)]


def _worker_id(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


class Fallback(NamedTuple):
    """A pool's fallback: its name, and the prompt and answer tokens it takes at most."""

    name: str
    context_window: int


@dataclass
class Fleet:
    """The workers of the active pools, the active pools' names and their active fallbacks,
    as the database has them."""

    workers: list[WorkerView]
    active_pools: list[str]
    fallbacks: dict[str, Fallback]


def fleet_rows() -> Fleet:
    """The fleet for a health check: from the process's catalog (`chatsite.catalog`; a pool
    or worker saved anywhere, a worker's state changed, makes every process read it again),
    so a replica's health loop reads Postgres only after a change, not every second. Fresh
    views each call: the caller fills in their load."""
    kept = CATALOG.get(("fleet",), _fleet_now)
    return replace(kept, workers=[replace(view) for view in kept.workers])


def _fleet_now() -> Fleet:
    """One read of the fleet (two statements)."""
    close_old_connections()
    pools = ModelPool.objects.filter(is_active=True).values_list(
        "name", "fallback__name", "fallback__is_active", "fallback__context_window"
    )
    return Fleet(
        workers=worker_rows(),
        active_pools=[name for name, *_ in pools],
        fallbacks={
            name: Fallback(fallback, window)
            for name, fallback, active, window in pools
            if fallback and active
        },
    )


def worker_rows() -> list[WorkerView]:
    """A view of every worker of the active pools, as the database has them."""
    return [
        WorkerView(
            id=w.id,
            name=w.name,
            pool=w.pool.name,
            url=w.url.rstrip("/"),
            served_model=w.pool.served_model,
            state=w.state,
            max_concurrency=w.max_concurrency,
            tokenizer_folder=pool_tokenizer_folder(w.pool),
            sampling_defaults=w.pool.sampling_defaults,
            kv_events_endpoint=w.kv_events_endpoint,
            kv_events_replay_endpoint=w.kv_events_replay_endpoint,
        )
        for w in Worker.objects.filter(pool__is_active=True).select_related("pool")
    ]
