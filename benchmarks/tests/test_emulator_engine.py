"""The emulated vLLM engine's decisions, step by step (no clock, no server): the prefix cache
reuses whole blocks and evicts the least recently used, chunked prefill spreads a long prompt
over steps, priority pre-empts and resumes, an abort frees what it held, and the KV events it
reports are read by the scheduler's own decoder into the index the scheduler would build."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from benchmarks.emulator.engine import CacheFull, Engine, Request
from benchmarks.emulator.events import encode
from benchmarks.emulator.profiles import PROFILES, Profile
from benchmarks.emulator.truth import Agreement, reachable_blocks
from inference.scheduler import kv_events, prefix

BS = 4
TINY = Profile(
    name="tiny",
    step_ms=10.0,
    decode_ms_per_stream=1.0,
    prefill_ms_per_token=0.5,
    max_batched_tokens=64,
    max_num_seqs=8,
    block_size=BS,
    num_blocks=32,
    source="tests",
)


class Run:
    """An engine driven one step at a time, with what each request was told."""

    def __init__(self, profile: Profile = TINY) -> None:
        self.batches: list[list[Any]] = []
        self.engine = Engine(profile, seed=1, on_events=self.batches.append)
        self.heard: dict[str, list[int]] = {}
        self.done: list[str] = []
        self.steps = 0

    def add(self, name: str, prompt: list[int], answer: int = 3, priority: int = 0) -> Request:
        self.heard[name] = []

        def emit(ids: list[int], finished: bool) -> None:
            self.heard[name] += ids
            if finished:
                self.done.append(name)

        output = [1000 + i for i in range(answer)]
        return self.engine.add(name, prompt, output, emit, priority=priority)

    def step(self) -> list[tuple[Request, int]]:
        work = self.engine.schedule()
        self.engine.finish_step(work)
        self.engine._publish()
        self.steps += 1
        return work

    def until_done(self, limit: int = 200) -> None:
        while self.engine.running or self.engine.waiting:
            assert self.steps < limit, "the engine made no progress"
            self.step()

    def events(self) -> list[Any]:
        return [event for batch in self.batches for event in batch]


def tokens(start: int, count: int) -> list[int]:
    return list(range(start, start + count))


def test_a_prompt_seen_before_reuses_its_whole_blocks_and_reads_only_the_rest() -> None:
    run = Run()
    shared = tokens(1, 3 * BS)  # three full blocks
    first = run.add("first", [*shared, 50, 51])
    run.until_done()
    second = run.add("second", [*shared, 60, 61, 62])
    work = run.step()
    assert first.cached_tokens == 0
    assert second.cached_tokens == 3 * BS
    assert work == [(second, 3)]  # only the tokens past the cached blocks are read
    counters = run.engine.counters
    assert (counters.prefix_queries, counters.prefix_hits) == (14 + 15, 12)
    run.until_done()
    assert run.heard["second"] == [1000, 1001, 1002]


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    run = Run()
    prompt = tokens(1, 2 * BS)
    run.add("a", prompt)
    run.until_done()
    again = run.add("b", prompt)
    work = run.step()
    assert again.cached_tokens == BS  # the second block is read again for the last token
    assert work == [(again, BS)]


def test_idle_blocks_are_evicted_least_recently_used_first_and_reported() -> None:
    run = Run(replace(TINY, num_blocks=6))
    a = run.add("a", tokens(100, 2 * BS), answer=1)
    run.until_done()
    b = run.add("b", tokens(200, 2 * BS), answer=1)
    run.until_done()
    a_hashes, b_hashes = list(a.hashes[:2]), list(b.hashes[:2])
    run.add("c", tokens(300, 4 * BS), answer=1)  # needs 4 blocks: 2 free, then a's 2
    run.until_done()
    removed = [h for event in run.events() if event[0] == "removed" for h in event[1]]
    assert set(a_hashes) <= set(removed)
    assert not set(b_hashes) & set(removed)
    # a's tail went before its head: a sequence's end is forgotten first.
    assert removed.index(a_hashes[1]) < removed.index(a_hashes[0])
    assert run.engine.pool.used == 0


def test_a_long_prompt_is_read_in_chunks_of_the_step_budget() -> None:
    run = Run(replace(TINY, max_batched_tokens=8, num_blocks=64))
    run.add("long", tokens(1, 20))
    budgets = [sum(n for _, n in run.step()) for _ in range(3)]
    assert budgets == [8, 8, 4]
    assert run.heard["long"] == [1000]  # its first token after the last chunk, not before


def test_a_step_lasts_its_fixed_part_plus_each_decode_and_each_prompt_token() -> None:
    run = Run()
    run.add("a", tokens(1, 10))
    first = run.engine.schedule()
    assert run.engine.step_seconds(first) == pytest.approx((10.0 + 0.5 * 10) / 1000)
    run.engine.finish_step(first)
    run.add("b", tokens(500, 6))
    second = run.engine.schedule()
    assert run.engine.step_seconds(second) == pytest.approx((10.0 + 1.0 * 1 + 0.5 * 6) / 1000)


def test_a_higher_priority_request_preempts_the_latest_lower_one_which_then_resumes() -> None:
    # Room for one request's blocks only.
    run = Run(replace(TINY, num_blocks=3))
    low = run.add("low", tokens(1, 2 * BS), answer=4, priority=5)
    run.step()
    run.step()
    assert run.heard["low"] == [1000, 1001]
    run.add("high", tokens(100, 2 * BS), answer=2, priority=0)
    run.until_done()
    assert run.done == ["high", "low"]
    assert low.preemptions == 1 and run.engine.counters.preemptions == 1
    # Resumed where it was: every token once, in order.
    assert run.heard["low"] == [1000, 1001, 1002, 1003]


def test_an_abort_frees_what_the_request_held() -> None:
    run = Run()
    request = run.add("gone", tokens(1, 3 * BS), answer=10)
    run.step()
    assert run.engine.pool.used > 0
    run.engine.abort(request)
    assert run.engine.pool.used == 0 and not run.engine.running
    assert run.engine.counters.finished == {"abort": 1}
    run.until_done()
    assert "gone" not in run.done


def test_a_request_larger_than_the_whole_cache_is_refused() -> None:
    with pytest.raises(CacheFull):
        Run(replace(TINY, num_blocks=2)).add("huge", tokens(1, 3 * BS))


def test_the_loop_takes_the_profiles_time_scaled() -> None:
    async def main() -> tuple[float, list[int]]:
        engine = Engine(replace(TINY, step_ms=20.0), time_scale=2.0)
        heard: list[int] = []
        finished = asyncio.Event()

        def emit(ids: list[int], done: bool) -> None:
            heard.extend(ids)
            if done:
                finished.set()

        task = asyncio.ensure_future(engine.run())
        loop = asyncio.get_running_loop()
        began = loop.time()
        engine.add("a", [1, 2, 3], [7, 8, 9], emit)
        await asyncio.wait_for(finished.wait(), 30)
        task.cancel()
        return loop.time() - began, heard

    elapsed, heard = asyncio.run(main())
    assert heard == [7, 8, 9]
    # Three steps of at least 20 ms, doubled: the modelled time is a floor.
    assert elapsed >= 3 * 0.040


class MemoryIndexStore:
    """The scheduler's applier, given an index in a dict instead of Redis."""

    def __init__(self) -> None:
        self.blocks: dict[int, set[str]] = {}

    async def record(self, worker_id: int, hashes: list[str], **_: Any) -> None:
        self.blocks.setdefault(worker_id, set()).update(hashes)

    async def remove(self, worker_id: int, hashes: list[str]) -> None:
        self.blocks.setdefault(worker_id, set()).difference_update(hashes)

    async def clear(self, worker_id: int) -> None:
        self.blocks[worker_id] = set()


def test_the_events_are_read_by_the_schedulers_decoder_into_its_own_block_hashes() -> None:
    run = Run(replace(TINY, num_blocks=6))
    for start in (100, 200, 300):
        run.add(str(start), tokens(start, 2 * BS + 1), answer=2)
        run.until_done()
    store = MemoryIndexStore()
    applier = kv_events.KVEventsApplier(store, 7, capacity=6)  # type: ignore[arg-type]

    async def apply_all() -> None:
        for batch in run.batches:
            await applier.apply(kv_events.decode(encode(batch, BS)))

    asyncio.run(apply_all())
    # What the engine holds, in the index's own hashes (chained over the tokens).
    expected = set()
    for block_hash in [*run.engine.pool.idle, *run.engine.pool.refs]:
        expected.add(block_hash)
    assert len(store.blocks[7]) == len(expected) > 0
    held_prompt = tokens(300, 2 * BS)
    ours = [h for h in prefix.block_hashes(held_prompt, BS)]
    assert set(ours) <= store.blocks[7]
    assert applier.orphans == 0


def lineage(run: Run) -> list[list[Any]]:
    return [[h, parent, list(t)] for h, (parent, t) in run.engine.pool.lineage.items()]


def test_the_true_cache_is_named_as_the_schedulers_index_names_blocks() -> None:
    run = Run(replace(TINY, num_blocks=6))
    run.add("a", tokens(100, 2 * BS + 1), answer=2)  # 2 blocks of prompt, a third filled
    run.until_done()
    run.add("b", tokens(200, 2 * BS), answer=1)
    run.until_done()
    cached, unreachable = reachable_blocks(lineage(run))
    # Every full block computed: the two of each prompt (the third of the first request's
    # sequence never fills), chained over the tokens as the index chains them.
    assert cached == {
        *prefix.block_hashes(tokens(100, 2 * BS), BS),
        *prefix.block_hashes(tokens(200, 2 * BS), BS),
    }
    assert unreachable == 0
    # A request of five blocks takes the two free ones and evicts three idle ones, least
    # recently used first, a sequence's tail before its head: the view follows.
    run.add("c", tokens(300, 5 * BS), answer=1)
    run.until_done()
    cached, unreachable = reachable_blocks(lineage(run))
    b_head, b_tail = prefix.block_hashes(tokens(200, 2 * BS), BS)
    assert cached == {*prefix.block_hashes(tokens(300, 5 * BS), BS), b_head}
    assert b_tail not in cached
    assert len(run.engine.pool.lineage) == len(run.engine.pool.idle) + len(run.engine.pool.refs)
    assert run.engine.reset_prefix_cache()
    assert reachable_blocks(lineage(run)) == (set(), 0)


def test_a_cached_block_whose_ancestor_was_evicted_is_counted_unreachable() -> None:
    head, tail = tokens(1, BS), tokens(50, BS)
    blocks: list[list[Any]] = [[11, None, head], [12, 11, tail], [13, 99, tokens(90, BS)]]
    cached, unreachable = reachable_blocks(blocks)
    assert cached == set(prefix.block_hashes([*head, *tail], BS))
    assert unreachable == 1
    # Without its parent, the second block is unreachable too.
    assert reachable_blocks(blocks[1:]) == (set(), 2)


def test_agreement_counts_blocks_both_name_over_blocks_either_names() -> None:
    found = Agreement()
    found.add({"a", "b", "c"}, {"b", "c", "d"}, unreachable=2)
    found.add(set(), {"e"}, unreachable=0)
    assert (found.indexed, found.cached, found.both, found.unreachable) == (3, 4, 2, 2)
    assert found.agreement == 2 / 5
    assert found.precision == 2 / 3 and found.recall == 2 / 4
    assert Agreement().agreement == 1.0
    assert "0.400 (2 of 5 blocks" in found.describe()


def test_the_published_profiles_are_consistent() -> None:
    for profile in PROFILES.values():
        assert profile.max_batched_tokens >= profile.block_size
        assert profile.num_blocks * profile.block_size > 8192  # a whole context fits
        assert profile.source
