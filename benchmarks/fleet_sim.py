"""Fleet simulator: placement policies on 8 to 1,024 simulated vLLM workers, one trace each.

Each simulated worker is a model of a vLLM worker calibrated from a real one (`--calibrate
URL` measures it: a first token alone after about 190 and 1,100 uncached prompt tokens, and answers
decoded alone and 16 at once; without it, the figures measured so on this machine's vLLM CPU
worker serving SmolLM2-135M): a step takes `step_ms` plus `step_ms_per_stream` per answer
decoding and `prefill_ms_per_token` per prompt token read in it (at most `chunk_tokens` a step,
so prefills are chunked as vLLM does); its KV cache holds `num_blocks` blocks of `block_size`
tokens, reused by chained block hash and forgotten least recently used
(`inference.scheduler.prefix.MemoryIndex`, the live index's model; the blocks of running
answers are not set apart). Paid answers are scheduled before free ones (vLLM's priority
order).

The trace: conversations arrive (Poisson) at `--load` times what the fleet serves with 16
conversations per worker at once (`WorkerModel.comfortable`), each of
`--turns` turns with think times, one of the shared system prompts (`--prompts-per-worker`
per worker, so a bigger fleet serves more kinds of assistant), a tier (`--paid` of them paid),
and some answers cancelled by their users after a few tokens (`--cancel`).

The policies, each deciding from what a router can know (the load it has sent, and an index of
the prompts it sent, never the workers' true caches):

- random, round_robin, least_loaded (fewest answers in flight), consistent_hash (by
  conversation, on a ring of 100 points per worker);
- sglang: SGLang router's cache_aware as its documentation describes it: if the busiest
  worker carries more than 64 answers and 1.5 times the least busy one, the least busy;
  else the longest prefix match if it covers at least 0.3 of the prompt, else the worker
  with the smallest tree;
- llmd: llm-d's weighted scorer, prefix 3 : queue 2 : KV cache 2, each scored 0-1;
- ours: the live scheduler's `PredictedTTFTPolicy`, on candidates built as the live
  `Capacity` builds them (an estimated index of what was sent, the prompt tokens placed and not
  yet read, the answers in flight).

Plus the oracle's hit rate: one cache of unlimited size holding every block sent before.
Per policy and fleet size: prefix hit rate (cached prompt tokens over prompt tokens), TTFT
p50/p99 per tier, imbalance (the busiest worker's answers over the mean), goodput (answers
with a first token within `--ttft-target` per second) and the time one decision takes.

    .venv/bin/python benchmarks/fleet_sim.py --workers 8,64,256,1024

No database or Redis; it prints a table and writes it to benchmarks/results/fleet_sim-*.txt.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import itertools
import math
import os
import random
import sys
import time
from bisect import bisect
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
os.environ.setdefault("SECRET_KEY", "fleet-simulator")
os.environ.setdefault("PLUGINS_ENCRYPTION_KEY", "fleet-simulator")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402

from benchmarks.common import percentile, render, write_result  # noqa: E402
from inference.scheduler.placement import (  # noqa: E402
    Candidate,
    PlacementRequest,
    PredictedTTFTPolicy,
    Speed,
    decayed_rate,
    raised_rate,
)
from inference.scheduler.prefix import MemoryIndex, block_hashes  # noqa: E402

POLICIES = ("random", "round_robin", "least_loaded", "consistent_hash", "sglang", "llmd", "ours")


@dataclass(frozen=True)
class WorkerModel:
    """A vLLM worker's speed and cache, as calibrated."""

    # `--calibrate` on this machine's vLLM CPU worker (SmolLM2-135M, one core), twice:
    # 49.6 / 40.1 ms a step, 2.5 / 2.9 ms per stream, 1.90 / 1.90 ms per prompt token. (Then
    # `step_ms` was a whole step of one answer; `calibrate` now leaves its one stream out.)
    step_ms: float = 45.0
    step_ms_per_stream: float = 2.7
    prefill_ms_per_token: float = 1.9
    chunk_tokens: int = 2048
    block_size: int = 128
    num_blocks: int = 96
    max_streams: int = 64
    comfortable: int = 16  # conversations at once that a worker serves at full load

    def answer_ms(self, output_tokens: int, streams: int) -> float:
        return output_tokens * (self.step_ms + self.step_ms_per_stream * streams)


# The trace


@dataclass
class Turn:
    conversation: int
    index: int
    tier: str
    tokens: list[int]  # the whole prompt
    output_tokens: int
    answer: list[int]
    arrival_ms: float = 0.0
    # Filled by the simulation.
    worker: int = -1
    cached: int = 0
    to_read: int = 0
    produced: int = 0
    first_token_ms: float | None = None


@dataclass
class Conversation:
    index: int
    tier: str
    system: list[int]
    questions: list[list[int]]
    answers: list[list[int]]
    thinks: list[float]
    cancel_after: list[int | None]
    start_ms: float


def make_trace(args: argparse.Namespace, workers: int, model: WorkerModel) -> list[Conversation]:
    rng = random.Random(args.seed)
    prompts = max(1, round(args.prompts_per_worker * workers))
    systems = [
        [1_000_000 + p * 10_000 + i for i in range(args.system_tokens)] for p in range(prompts)
    ]
    # What one worker serves: about `max_streams` answers at once over an answer's time.
    turn_ms = model.answer_ms(args.answer_tokens, model.comfortable) + args.think_ms
    conversations_per_s = args.load * workers * model.comfortable / (args.turns * turn_ms / 1000)
    trace, at = [], 0.0
    for index in range(int(conversations_per_s * args.seconds)):
        at += rng.expovariate(conversations_per_s) * 1000
        tier = "paid" if rng.random() < args.paid else "free"
        trace.append(
            Conversation(
                index=index,
                tier=tier,
                system=systems[rng.randrange(prompts)],
                questions=[
                    [rng.randrange(50_000) for _ in range(rng.randint(20, 80))]
                    for _ in range(args.turns)
                ],
                answers=[
                    [rng.randrange(50_000) for _ in range(args.answer_tokens)]
                    for _ in range(args.turns)
                ],
                thinks=[rng.expovariate(1 / args.think_ms) for _ in range(args.turns)],
                cancel_after=[
                    rng.randint(1, args.answer_tokens // 2) if rng.random() < args.cancel else None
                    for _ in range(args.turns)
                ],
                start_ms=at,
            )
        )
    return trace


def turn_of(conversation: Conversation, index: int, arrival_ms: float) -> Turn:
    tokens = list(conversation.system)
    for question, answer in zip(
        conversation.questions[:index], conversation.answers[:index], strict=True
    ):
        tokens += question + answer
    tokens += conversation.questions[index]
    cut = conversation.cancel_after[index]
    answer = conversation.answers[index][: cut or None]
    return Turn(
        conversation.index, index, conversation.tier, tokens, len(answer), answer, arrival_ms
    )


# Workers


@dataclass
class Worker:
    id: int
    model: WorkerModel
    cache: MemoryIndex
    waiting: deque[Turn] = field(default_factory=deque)
    paid_waiting: deque[Turn] = field(default_factory=deque)
    running: list[Turn] = field(default_factory=list)
    busy: bool = False
    served: int = 0

    def admit(self, now: float) -> None:
        while len(self.running) < self.model.max_streams and (self.paid_waiting or self.waiting):
            turn = (self.paid_waiting or self.waiting).popleft()
            hashes = block_hashes(turn.tokens, self.model.block_size)
            (blocks,) = self.cache.matched_blocks([self.id], hashes)
            turn.cached = blocks * self.model.block_size
            turn.to_read = len(turn.tokens) - turn.cached
            self.cache.record(self.id, hashes, capacity=self.model.num_blocks, now_ms=int(now))
            self.running.append(turn)

    def step(self, now: float) -> tuple[float, list[Turn], list[Turn]]:
        """One step from `now`: its length, the turns that got a first token and those that
        finished."""
        budget = self.model.chunk_tokens
        read = 0
        decoding = 0
        first, finished = [], []
        for turn in self.running:
            if turn.to_read > 0:
                chunk = min(turn.to_read, budget)
                turn.to_read -= chunk
                budget -= chunk
                read += chunk
                if turn.to_read == 0:
                    turn.produced = 1
                    first.append(turn)
            else:
                decoding += 1
                turn.produced += 1
        length = (
            self.model.step_ms
            + self.model.step_ms_per_stream * decoding
            + self.model.prefill_ms_per_token * read
        )
        for turn in self.running:
            if turn.to_read == 0 and turn.produced >= turn.output_tokens:
                finished.append(turn)
        for turn in finished:
            self.running.remove(turn)
            self.served += 1
            sequence = block_hashes(turn.tokens + turn.answer, self.model.block_size)
            self.cache.record(
                self.id, sequence, capacity=self.model.num_blocks, now_ms=int(now + length)
            )
        return length, first, finished


# What a router knows, and the policies


@dataclass
class RouterState:
    workers: int
    model: WorkerModel
    index: MemoryIndex = field(default_factory=MemoryIndex)  # what was sent where
    in_flight: list[int] = field(default_factory=list)
    backlog: list[int] = field(default_factory=list)  # placed prompt tokens not yet read
    reading: list[int] = field(default_factory=list)  # the turns they belong to
    rates: list[tuple[float, float]] = field(default_factory=list)  # placements/s, as of ms
    rate_rank: list[float] = field(default_factory=list)
    # The sum of every worker's rate * e^(at / time constant), so the pool's mean at any time
    # is kept in O(1) (the rates decay alike).
    rate_sum: float = 0.0
    # Kept as they change, for the shortlist: the load order, and the index's sizes.
    busy: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    now_ms: float = 0.0
    turn: int = 0
    ring: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.in_flight = [0] * self.workers
        self.backlog = [0] * self.workers
        self.reading = [0] * self.workers
        self.rates = [(0.0, 0.0)] * self.workers
        self.rate_rank = [-math.inf] * self.workers
        self.busy = [0.0] * self.workers
        self.sizes = [0] * self.workers
        self.ring = sorted((_hash(f"{w}-{v}"), w) for w in range(self.workers) for v in range(100))

    def changed(self, worker: int) -> None:
        """Its leases, backlog or index changed."""
        self.busy[worker] = self.in_flight[worker] * 1_000_000 + self.backlog[worker]
        self.sizes[worker] = self.index.size(worker)

    def rate(self, worker: int) -> float:
        """The worker's placements per second lately, as the live scheduler keeps it."""
        rate, at = self.rates[worker]
        return decayed_rate(rate, self.now_ms - at, settings.SCHEDULER_PLACEMENT_RATE_SECONDS)

    def placed(self, worker: int) -> None:
        seconds = settings.SCHEDULER_PLACEMENT_RATE_SECONDS
        previous, at = self.rates[worker]
        rate = raised_rate(previous, self.now_ms - at, seconds)
        self.rate_sum += rate * math.exp(self.now_ms / (seconds * 1000))
        self.rate_sum -= previous * math.exp(at / (seconds * 1000))
        self.rates[worker] = (rate, self.now_ms)
        # The rates decay alike: this orders the workers as their rates do, at any time.
        self.rate_rank[worker] = math.log(rate) + self.now_ms / (seconds * 1000)

    def mean_rate(self) -> float:
        seconds = settings.SCHEDULER_PLACEMENT_RATE_SECONDS
        return self.rate_sum * math.exp(-self.now_ms / (seconds * 1000)) / self.workers


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


Policy = Callable[[RouterState, Turn, list[str], random.Random], int]


def least(values: Sequence[float]) -> int:
    return min(range(len(values)), key=values.__getitem__)


def pick_random(state: RouterState, turn: Turn, hashes: list[str], rng: random.Random) -> int:
    return rng.randrange(state.workers)


def pick_round_robin(state: RouterState, turn: Turn, hashes: list[str], rng: Any) -> int:
    state.turn += 1
    return state.turn % state.workers


def pick_least_loaded(state: RouterState, turn: Turn, hashes: list[str], rng: Any) -> int:
    return least(state.in_flight)


def pick_consistent_hash(state: RouterState, turn: Turn, hashes: list[str], rng: Any) -> int:
    point = _hash(f"conversation-{turn.conversation}")
    return state.ring[bisect(state.ring, (point, -1)) % len(state.ring)][1]


def pick_sglang(state: RouterState, turn: Turn, hashes: list[str], rng: Any) -> int:
    loads = state.in_flight
    busiest, quietest = max(loads), min(loads)
    if busiest - quietest > 64 and busiest > 1.5 * quietest:
        return least(loads)
    matched = state.index.longest(hashes)
    if matched:
        worker, blocks = max(matched.items(), key=lambda item: (item[1], -loads[item[0]]))
        if blocks * state.model.block_size >= 0.3 * len(turn.tokens):
            return worker
    return least([state.index.size(w) for w in range(state.workers)])


def pick_llmd(state: RouterState, turn: Turn, hashes: list[str], rng: Any) -> int:
    matched = state.index.longest(hashes)
    loads = state.in_flight
    busiest, quietest = max(loads), min(loads)
    spread = max(busiest - quietest, 1)
    capacity = state.model.num_blocks * state.model.block_size

    def score(worker: int) -> float:
        prefix = matched.get(worker, 0) / max(len(hashes), 1)
        queue = (busiest - loads[worker]) / spread
        kv = 1 - min(1.0, state.backlog[worker] / capacity)
        return 3 * prefix + 2 * queue + 2 * kv

    return max(range(state.workers), key=score)


def ours(policy: PredictedTTFTPolicy, shortlist: int) -> Policy:
    """The live policy, handed the workers holding part of the prompt and the `shortlist` least
    busy others (the rest would predict no sooner a first token than those); for a prompt
    nobody holds or a conversation's first turn, also the `shortlist` with the smallest
    caches, least lately placed on (where the policy sends such a prompt, or spills such a
    turn)."""

    def pick(state: RouterState, turn: Turn, hashes: list[str], rng: Any) -> int:
        matched = state.index.longest(hashes)
        size = state.model.block_size
        workers: Sequence[int] = range(state.workers)
        if state.workers > 2 * shortlist + len(matched):
            least_busy = heapq.nsmallest(shortlist, zip(state.busy, workers, strict=True))
            chosen = {*matched, *(w for _, w in least_busy)}
            if not matched or turn.index == 0:
                roomy = zip(state.sizes, state.rate_rank, workers, strict=True)
                chosen.update(w for _, _, w in heapq.nsmallest(shortlist, roomy))
            workers = sorted(chosen)
        candidates = [
            Candidate(
                id=w,
                leases=state.in_flight[w],
                cached_tokens=matched.get(w, 0) * size,
                prefill_backlog=state.backlog[w],
                prefill_requests=state.reading[w],
                placement_rate=state.rate(w),
                held_blocks=state.index.size(w),
            )
            for w in workers
        ]
        request = PlacementRequest(
            pool="sim",
            prompt_tokens=len(turn.tokens),
            opening=turn.index == 0,
            pool_placement_rate=state.mean_rate(),
        )
        return policy.order(candidates, request)[0].id

    return pick


# The simulation


@dataclass
class Outcome:
    policy: str
    workers: int
    turns: list[Turn]
    served: list[int]
    decisions_ms: list[float]
    seconds: float

    @property
    def served_turns(self) -> list[Turn]:
        return [t for t in self.turns if t.first_token_ms is not None]

    def hit_rate(self) -> float:
        prompt = sum(len(t.tokens) for t in self.served_turns)
        return sum(t.cached for t in self.served_turns) / prompt if prompt else 0.0

    def ttft(self, tier: str, q: float) -> float:
        values = [
            t.first_token_ms - t.arrival_ms
            for t in self.turns
            if t.tier == tier and t.first_token_ms is not None
        ]
        return percentile(values, q) if values else float("nan")

    def goodput(self, target_ms: float) -> float:
        good = sum(
            1
            for t in self.turns
            if t.first_token_ms is not None and t.first_token_ms - t.arrival_ms <= target_ms
        )
        return good / self.seconds

    def imbalance(self) -> float:
        mean = sum(self.served) / len(self.served)
        return max(self.served) / mean if mean else 0.0


def simulate(
    name: str, pick: Policy, trace: list[Conversation], workers: int, model: WorkerModel, args: Any
) -> Outcome:
    rng = random.Random(args.seed + 1)
    fleet = [Worker(w, model, MemoryIndex()) for w in range(workers)]
    state = RouterState(workers, model)
    events: list[tuple[float, int, str, Any]] = []
    order = itertools.count()
    for conversation in trace:
        heapq.heappush(events, (conversation.start_ms, next(order), "arrive", (conversation, 0)))
    turns: list[Turn] = []
    decisions: list[float] = []
    placed: dict[int, int] = {}  # id(turn) -> its uncached tokens as the router estimated
    horizon = args.seconds * 1000 * 3  # let the last arrivals finish

    while events:
        now, _, kind, payload = heapq.heappop(events)
        if now > horizon:
            break
        if kind == "arrive":
            conversation, index = payload
            turn = turn_of(conversation, index, now)
            hashes = block_hashes(turn.tokens, model.block_size)
            state.now_ms = now
            started = time.perf_counter()
            worker_id = pick(state, turn, hashes, rng)
            (estimate,) = state.index.matched_blocks([worker_id], hashes)
            decisions.append((time.perf_counter() - started) * 1000)
            state.index.record(worker_id, hashes, capacity=model.num_blocks, now_ms=int(now))
            placed[id(turn)] = len(turn.tokens) - estimate * model.block_size
            state.in_flight[worker_id] += 1
            state.backlog[worker_id] += placed[id(turn)]
            state.reading[worker_id] += 1 if placed[id(turn)] > 0 else 0
            state.placed(worker_id)
            state.changed(worker_id)
            turn.worker = worker_id
            turns.append(turn)
            worker = fleet[worker_id]
            (worker.paid_waiting if turn.tier == "paid" else worker.waiting).append(turn)
            if not worker.busy:
                worker.busy = True
                heapq.heappush(events, (now, next(order), "step", worker))
        elif kind == "step":
            worker = payload
            worker.admit(now)
            if not worker.running:
                worker.busy = False
                continue
            length, first, finished = worker.step(now)
            end = now + length
            for turn in first:
                turn.first_token_ms = end
                state.backlog[worker.id] -= placed[id(turn)]
                state.reading[worker.id] -= 1 if placed[id(turn)] > 0 else 0
                state.changed(worker.id)
            for turn in finished:
                state.in_flight[worker.id] -= 1
                conversation = trace[turn.conversation]
                sequence = block_hashes(turn.tokens + turn.answer, model.block_size)
                state.index.record(worker.id, sequence, capacity=model.num_blocks, now_ms=int(end))
                state.changed(worker.id)
                if turn.index + 1 < args.turns:
                    heapq.heappush(
                        events,
                        (
                            end + conversation.thinks[turn.index],
                            next(order),
                            "arrive",
                            (conversation, turn.index + 1),
                        ),
                    )
            heapq.heappush(events, (end, next(order), "step", worker))
    return Outcome(name, workers, turns, [w.served for w in fleet], decisions, args.seconds)


def oracle_hit_rate(turns: list[Turn], block_size: int) -> float:
    """One unlimited cache (one worker's index that never forgets), in the order the turns
    arrived."""
    oracle = MemoryIndex()
    hits = prompt = 0
    for turn in sorted(turns, key=lambda t: t.arrival_ms):
        (held,) = oracle.matched_blocks([0], block_hashes(turn.tokens, block_size))
        hits += held * block_size
        prompt += len(turn.tokens)
        sequence = block_hashes(turn.tokens + turn.answer, block_size)
        oracle.record(0, sequence, capacity=0, now_ms=int(turn.arrival_ms))
    return hits / prompt if prompt else 0.0


def policy_for(name: str, model: WorkerModel) -> Policy:
    if name == "ours":
        speed = Speed(
            base_ms=model.step_ms,
            ms_per_token=model.prefill_ms_per_token,
            ms_per_stream=model.step_ms_per_stream,
        )
        return ours(PredictedTTFTPolicy(default_speed=speed), shortlist=16)
    policies: dict[str, Policy] = {
        "random": pick_random,
        "round_robin": pick_round_robin,
        "least_loaded": pick_least_loaded,
        "consistent_hash": pick_consistent_hash,
        "sglang": pick_sglang,
        "llmd": pick_llmd,
    }
    return policies[name]


def table(outcomes: list[Outcome], oracles: dict[int, float], target_ms: float) -> str:
    rows = [
        [
            str(o.workers),
            o.policy,
            f"{o.hit_rate():.3f}",
            f"{oracles[id(o)]:.3f}",
            f"{o.ttft('paid', 50):,.0f}",
            f"{o.ttft('paid', 99):,.0f}",
            f"{o.ttft('free', 50):,.0f}",
            f"{o.ttft('free', 99):,.0f}",
            f"{o.imbalance():.2f}",
            f"{o.goodput(target_ms):.1f}",
            f"{percentile(o.decisions_ms, 50):.3f}",
            f"{percentile(o.decisions_ms, 99):.3f}",
        ]
        for o in outcomes
    ]
    headers = ["workers", "policy", "prefix hit", "oracle", "paid TTFT p50", "p99"]
    headers += ["free TTFT p50", "p99", "imbalance", f"goodput/s (<{target_ms:.0f} ms)"]
    return render([*headers, "decision p50 ms", "p99 ms"], rows)


def calibrate(url: str, block_size: int, num_blocks: int, streams: int = 16) -> WorkerModel:
    """The model of the worker at `url`, measured: first tokens alone after short and long
    uncached prompts (prefill), and answers alone and `streams` at once (decode). A step of
    one answer is `step_ms + step_ms_per_stream`: the fixed part is what is left of it."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]

    def read(words: int) -> tuple[float, int]:
        """(time to a one-token answer, prompt tokens) for a fresh prompt of `words`."""
        text = f"{random.random()} " + " ".join(f"w{random.randrange(10**6)}" for _ in range(words))
        body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 1}
        started = time.perf_counter()
        answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300).json()
        return time.perf_counter() - started, int(answer["usage"]["prompt_tokens"])

    def stream(words: int, max_tokens: int) -> tuple[float, float]:
        """(TTFT, the median gap between its chunks) of one answer to a fresh prompt: the
        median, so that the steps in which the worker also read another answer's prompt (on a
        CPU worker, many times a decode step) do not count as decoding."""
        text = f"{random.random()} " + " ".join(f"w{random.randrange(10**6)}" for _ in range(words))
        body = {
            "model": model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens,
            "min_tokens": max_tokens,
            "stream": True,
        }
        started = time.perf_counter()
        times = []
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    times.append(time.perf_counter())
        gaps = sorted(b - a for a, b in itertools.pairwise(times))
        return times[0] - started, gaps[len(gaps) // 2] if gaps else 0.0

    stream(16, 4)  # warm
    short = min(read(20) for _ in range(3))  # about 190 tokens
    long = min(read(150) for _ in range(3))  # about 1,100 tokens
    per_token = max(0.0, (long[0] - short[0]) / (long[1] - short[1])) * 1000
    step_alone = stream(16, 48)[1] * 1000
    with ThreadPoolExecutor(streams) as pool:
        runs = list(pool.map(lambda _: stream(16, 48), range(streams)))
    step_many = sum(gap for _, gap in runs) / len(runs) * 1000
    per_stream = max(0.0, (step_many - step_alone) / max(streams - 1, 1))
    return WorkerModel(
        step_ms=max(0.0, step_alone - per_stream),
        step_ms_per_stream=per_stream,
        prefill_ms_per_token=per_token,
        block_size=block_size,
        num_blocks=num_blocks,
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="8,64,256,1024")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--seconds", type=float, default=60.0, help="arrivals for this long")
    parser.add_argument("--load", type=float, default=0.8, help="share of the fleet's capacity")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--prompts-per-worker", type=float, default=2.0)
    parser.add_argument("--system-tokens", type=int, default=530)
    parser.add_argument("--answer-tokens", type=int, default=32)
    parser.add_argument("--think-ms", type=float, default=1000.0)
    parser.add_argument("--paid", type=float, default=0.2)
    parser.add_argument("--cancel", type=float, default=0.05)
    parser.add_argument("--ttft-target", type=float, default=1000.0, help="ms, for goodput")
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--num-blocks", type=int, default=WorkerModel.num_blocks)
    parser.add_argument("--calibrate", metavar="URL", help="measure this vLLM worker first")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    model = WorkerModel(num_blocks=args.num_blocks)
    if args.calibrate:
        model = calibrate(args.calibrate, model.block_size, args.num_blocks)
        print(f"calibrated: {model}", flush=True)
    outcomes: list[Outcome] = []
    oracles: dict[int, float] = {}  # by id(outcome): each replays its own served turns
    for workers in (int(n) for n in args.workers.split(",")):
        trace = make_trace(args, workers, model)
        for name in args.policies.split(","):
            outcome = simulate(name, policy_for(name, model), trace, workers, model, args)
            outcomes.append(outcome)
            oracles[id(outcome)] = oracle_hit_rate(outcome.served_turns, model.block_size)
            print(
                f"{workers} workers, {name}: hit {outcome.hit_rate():.3f}, "
                f"{len(outcome.turns)} turns",
                flush=True,
            )
    facts = (
        f"fleet simulator: {args.seconds:.0f} s of arrivals at {args.load} of capacity, "
        f"{args.turns} turns, {args.prompts_per_worker} shared system prompts of "
        f"{args.system_tokens} tokens per worker, {args.answer_tokens}-token answers, think "
        f"{args.think_ms:.0f} ms, {args.paid:.0%} paid, {args.cancel:.0%} cancelled, seed "
        f"{args.seed}\nworker model: {model}"
    )
    report = f"{facts}\n\n{table(outcomes, oracles, args.ttft_target)}"
    print(report)
    out = write_result(args.results, "fleet_sim", report)
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
