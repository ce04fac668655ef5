"""An emulated vLLM engine: vLLM V1's scheduling and prefix cache, with time from a profile.

No model runs. What vLLM decides is modelled as vLLM decides it; what a GPU computes is
replaced by the time a latency profile (`profiles.py`) says it takes:

- **Continuous batching with chunked prefill.** Each step, the running requests are scheduled
  first (a decoding one for its one token, a prefilling one for its next chunk), then waiting
  ones are admitted, while the step's token budget (`max_batched_tokens`) and the running
  limit (`max_num_seqs`) allow. As in V1, a request is simply scheduled for the tokens it has
  not computed yet: its prompt (in chunks), then one token a step. A step lasts
  `step_ms + decode_ms_per_stream * decoding + prefill_ms_per_token * prefill tokens`.
- **The prefix cache.** The KV cache is `num_blocks` blocks of `block_size` tokens. A full block
  is known by a hash chained over the blocks before it; a request admitted reuses the run of
  its leading full blocks that is cached (never its last token, which must be computed), so a
  cache hit cuts prefill. A block no request uses stays cached until its room is needed, the
  least recently used first (vLLM's free queue). `usage.prompt_tokens_details.cached_tokens`
  and the `prefix_cache_queries` / `prefix_cache_hits` counters say what was reused.
- **Priority with pre-emption** (`--scheduling-policy priority`): waiting requests in order of
  (priority, arrival); when the cache is full, the running request latest in that order is
  pre-empted (its blocks freed, computed again later, its answer resumed, not restarted).
- **KV cache events**: each block stored or evicted, and a reset, is reported in the step's
  batch, as vLLM's publisher does (`events.py` sends them).

Differences from vLLM, kept small on purpose: a block filled at the same time by two requests
is shared at once (vLLM keeps a duplicate until one is freed); the answer is a fixed number of
tokens (`max_tokens`, or the request's planned length), never an early end of sequence.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .profiles import Profile

# Event tuples, in the order they happened within a step:
# ("stored", [hashes], parent hash or None, token ids), ("removed", [hashes]), ("cleared",).
Event = tuple[Any, ...]


class CacheFull(Exception):
    """The request can never fit: its tokens need more blocks than the whole cache."""


@dataclass
class Request:
    """One request in the engine; `emit(tokens, finished)` hears of its tokens."""

    id: str
    prompt: list[int]
    output: list[int]  # the answer's token ids, decided at arrival
    priority: int
    arrival: int
    emit: Callable[[list[int], bool], None]
    computed: int = 0  # tokens whose KV is computed
    generated: int = 0  # answer tokens sampled so far
    cached_tokens: int = -1  # the prefix hit at its first admission (-1: not admitted yet)
    hashes: list[int] = field(default_factory=list)  # its full blocks' hashes, in order
    blocks: int = 0  # blocks it holds, hashed or not
    held: list[int] = field(default_factory=list)  # the hashed blocks it holds a reference to
    finished: bool = False
    preemptions: int = 0
    # Monotonic times: added, first scheduled, first token (0.0: not yet).
    added_at: float = 0.0
    scheduled_at: float = 0.0
    first_token_at: float = 0.0

    @property
    def seq_len(self) -> int:
        return len(self.prompt) + self.generated

    def token(self, position: int) -> int:
        return (
            self.prompt[position]
            if position < len(self.prompt)
            else self.output[position - len(self.prompt)]
        )

    def order(self) -> tuple[int, int]:
        return (self.priority, self.arrival)


class BlockPool:
    """The KV cache's blocks: hashed ones shared by reference, idle ones kept until evicted."""

    def __init__(self, num_blocks: int, block_size: int, events: list[Event]) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.events = events
        self.refs: dict[int, int] = {}  # hashed blocks in use, and their users
        self.idle: OrderedDict[int, None] = OrderedDict()  # cached, unused: LRU first
        self.anonymous = 0  # blocks in use that hold no full hashed block (yet)
        # Every cached block's parent and tokens: what the cache truly holds, for a
        # benchmark to compare a router's index with (`Worker.kv_cache`).
        self.lineage: dict[int, tuple[int | None, tuple[int, ...]]] = {}

    @property
    def used(self) -> int:
        return self.anonymous + len(self.refs)

    @property
    def available(self) -> int:
        """Blocks a request may take: free ones and idle cached ones (evicted if taken)."""
        return self.num_blocks - self.used

    def cached(self, block_hash: int) -> bool:
        return block_hash in self.refs or block_hash in self.idle

    def take_cached(self, block_hash: int) -> None:
        if block_hash in self.idle:
            del self.idle[block_hash]
            self.refs[block_hash] = 1
        else:
            self.refs[block_hash] += 1

    def allocate(self, count: int) -> bool:
        """`count` anonymous blocks, evicting idle cached ones as needed; False if there is
        not room for them all (nothing taken)."""
        if count > self.available:
            return False
        free = self.num_blocks - self.used - len(self.idle)
        evict = max(0, count - free)
        if evict:
            gone = [self.idle.popitem(last=False)[0] for _ in range(evict)]
            for block_hash in gone:
                del self.lineage[block_hash]
            self.events.append(("removed", gone))
        self.anonymous += count
        return True

    def fill(self, block_hash: int, parent: int | None, tokens: list[int]) -> None:
        """An anonymous block of a request is now full: it becomes `block_hash`, or, if that
        is cached already, the request shares the cached one and its own block is freed."""
        self.anonymous -= 1
        if self.cached(block_hash):
            self.take_cached(block_hash)
            return
        self.refs[block_hash] = 1
        self.lineage[block_hash] = (parent, tuple(tokens))
        self.events.append(("stored", [block_hash], parent, tokens))

    def release(self, hashes: Sequence[int], anonymous: int) -> None:
        """A request gives back its blocks; its last blocks are evicted first (vLLM frees a
        request's blocks in reverse, so the tail of a sequence goes before its head)."""
        self.anonymous -= anonymous
        for block_hash in reversed(hashes):
            left = self.refs[block_hash] - 1
            if left:
                self.refs[block_hash] = left
            else:
                del self.refs[block_hash]
                self.idle[block_hash] = None

    def reset(self) -> bool:
        """Forget every idle cached block (`/reset_prefix_cache`); False while blocks are in
        use (vLLM refuses then too)."""
        if self.refs or self.anonymous:
            return False
        self.idle.clear()
        self.lineage.clear()
        self.events.append(("cleared",))
        return True


@dataclass
class Counters:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    preemptions: int = 0
    finished: dict[str, int] = field(default_factory=dict)
    steps: int = 0
    busy_seconds: float = 0.0


class Engine:
    """One emulated worker's engine; `run()` steps it while it has work."""

    def __init__(
        self,
        profile: Profile,
        *,
        time_scale: float = 1.0,
        seed: int | None = None,
        on_events: Callable[[list[Event]], None] | None = None,
    ) -> None:
        self.profile = profile
        self.time_scale = time_scale
        # vLLM seeds its block hashes per process: so do we (the scheduler must not assume them).
        self.salt = random.Random(seed).getrandbits(62)
        self.on_events = on_events
        self.events: list[Event] = []
        self.pool = BlockPool(profile.num_blocks, profile.block_size, self.events)
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.counters = Counters()
        self._arrivals = itertools.count()
        self._work = asyncio.Event()

    # Requests in and out

    def add(
        self,
        request_id: str,
        prompt: list[int],
        output: list[int],
        emit: Callable[[list[int], bool], None],
        *,
        priority: int = 0,
    ) -> Request:
        total = len(prompt) + len(output)
        if -(-total // self.profile.block_size) > self.profile.num_blocks:
            raise CacheFull(
                f"{total} tokens do not fit a cache of {self.profile.num_blocks} blocks"
            )
        request = Request(request_id, prompt, output, priority, next(self._arrivals), emit)
        request.added_at = time.monotonic()
        self.waiting.append(request)
        self._work.set()
        return request

    def abort(self, request: Request) -> None:
        """The client left: the request is dropped, its blocks freed (vLLM's abort)."""
        if request.finished:
            return
        request.finished = True
        if request in self.waiting:
            self.waiting.remove(request)
        if request in self.running:
            self.running.remove(request)
            self._free(request)
        self.counters.finished["abort"] = self.counters.finished.get("abort", 0) + 1
        self._publish()

    def reset_prefix_cache(self) -> bool:
        done = self.pool.reset()
        self._publish()
        return done

    @property
    def kv_usage(self) -> float:
        return self.pool.used / self.profile.num_blocks

    # The loop

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not (self.waiting or self.running):
                self._work.clear()
                await self._work.wait()
            started = loop.time()
            work = self.schedule()
            self._publish()
            if not work:
                # Nothing fits (a pre-empted request waits for room that only frees when
                # others finish, and none runs): wait for a change.
                self._work.clear()
                await self._work.wait()
                continue
            seconds = self.step_seconds(work) * self.time_scale
            # Steps end at planned times, not after planned sleeps: no drift under load.
            await asyncio.sleep(max(0.0, started + seconds - loop.time()))
            self.counters.steps += 1
            self.counters.busy_seconds += seconds
            self.finish_step(work)
            self._publish()

    def step_seconds(self, work: Sequence[tuple[Request, int]]) -> float:
        decoding = sum(1 for request, tokens in work if tokens == 1 and request.generated)
        prefill = sum(tokens for request, tokens in work if not (tokens == 1 and request.generated))
        profile = self.profile
        milliseconds = (
            profile.step_ms
            + profile.decode_ms_per_stream * decoding
            + profile.prefill_ms_per_token * prefill
        )
        return milliseconds / 1000.0

    def schedule(self) -> list[tuple[Request, int]]:
        """This step's work: (request, tokens to compute), running requests first."""
        budget = self.profile.max_batched_tokens
        work: list[tuple[Request, int]] = []
        for request in list(self.running):
            if budget <= 0:
                break
            if request not in self.running:
                continue  # pre-empted below for an earlier one
            tokens = min(request.seq_len - request.computed, budget)
            while not self._grow(request, tokens):
                victim = max(self.running, key=Request.order)
                self._preempt(victim)
                if victim is request:
                    tokens = 0
                    break
            if tokens:
                work.append((request, tokens))
                budget -= tokens
        self.waiting.sort(key=Request.order)
        while self.waiting and budget > 0 and len(self.running) < self.profile.max_num_seqs:
            request = self.waiting[0]
            self._lookup(request)
            tokens = min(request.seq_len - request.computed, budget)
            if not self._grow(request, tokens):
                self._unlookup(request)
                victims = [r for r in self.running if r.order() > request.order()]
                if not victims:
                    break
                self._preempt(max(victims, key=Request.order))
                continue
            self.waiting.pop(0)
            self.running.append(request)
            work.append((request, tokens))
            budget -= tokens
        return work

    def finish_step(self, work: Sequence[tuple[Request, int]]) -> None:
        for request, tokens in work:
            if request.finished or request not in self.running:
                continue  # aborted meanwhile
            before = request.computed
            request.computed += tokens
            self._hash_full_blocks(request, before)
            if request.computed < request.seq_len:
                continue  # a chunk of its prompt: no token yet
            request.generated += 1
            if request.generated == 1:
                request.first_token_at = time.monotonic()
            self.counters.generation_tokens += 1
            done = request.generated >= len(request.output)
            if done:
                request.finished = True
                self.running.remove(request)
                self._free(request)
                self.counters.finished["length"] = self.counters.finished.get("length", 0) + 1
            request.emit([request.output[request.generated - 1]], done)

    # Blocks

    def _block_hash(self, parent: int | None, tokens: Sequence[int]) -> int:
        return hash((self.salt, parent, tuple(tokens))) & 0x7FFF_FFFF_FFFF_FFFF

    def _block_tokens(self, request: Request, number: int) -> list[int]:
        size = self.profile.block_size
        return [request.token(i) for i in range(number * size, (number + 1) * size)]

    def _hashes_upto(self, request: Request, blocks: int) -> list[int]:
        while len(request.hashes) < blocks:
            number = len(request.hashes)
            parent = request.hashes[-1] if request.hashes else None
            request.hashes.append(self._block_hash(parent, self._block_tokens(request, number)))
        return request.hashes[:blocks]

    def _lookup(self, request: Request) -> None:
        """Admit from the cache the request's leading full blocks it holds (all but its last
        token may come from there)."""
        size = self.profile.block_size
        first = request.cached_tokens < 0
        hit = 0
        for block_hash in self._hashes_upto(request, (request.seq_len - 1) // size):
            if not self.pool.cached(block_hash):
                break
            self.pool.take_cached(block_hash)
            request.held.append(block_hash)
            hit += 1
        request.blocks = hit
        request.computed = hit * size
        if first:
            request.cached_tokens = request.computed
            request.scheduled_at = time.monotonic()
            self.counters.prompt_tokens += len(request.prompt)
        self.counters.prefix_queries += request.seq_len
        self.counters.prefix_hits += request.computed

    def _unlookup(self, request: Request) -> None:
        """Not admitted after all: give back the cached blocks `_lookup` took."""
        self.pool.release(request.held, 0)
        self.counters.prefix_queries -= request.seq_len
        self.counters.prefix_hits -= request.computed
        request.held, request.blocks, request.computed = [], 0, 0

    def _grow(self, request: Request, tokens: int) -> bool:
        size = self.profile.block_size
        needed = -(-(request.computed + tokens) // size) - request.blocks
        if needed <= 0:
            return True
        if not self.pool.allocate(needed):
            return False
        request.blocks += needed
        return True

    def _hash_full_blocks(self, request: Request, before: int) -> None:
        size = self.profile.block_size
        full_before, full_now = before // size, request.computed // size
        if full_now <= full_before:
            return
        hashes = self._hashes_upto(request, full_now)
        for number in range(max(full_before, len(request.held)), full_now):
            parent = hashes[number - 1] if number else None
            self.pool.fill(hashes[number], parent, self._block_tokens(request, number))
            request.held.append(hashes[number])

    def _free(self, request: Request) -> None:
        self.pool.release(request.held, request.blocks - len(request.held))
        request.held, request.blocks = [], 0

    def _preempt(self, request: Request) -> None:
        """Recompute later: its blocks go back (its cached ones likely stay for it)."""
        self.running.remove(request)
        self._free(request)
        request.computed = 0
        request.preemptions += 1
        self.counters.preemptions += 1
        self.waiting.append(request)

    def _publish(self) -> None:
        if self.events:
            batch = list(self.events)
            self.events.clear()
            if self.on_events is not None:
                self.on_events(batch)
