"""What emulated workers' caches truly hold, beside what a scheduler's index says they hold.

The scheduler knows a block by a hash chained over its tokens and its ancestors'
(`inference.scheduler.prefix.chain`); the emulator, like vLLM, by hashes of its own. Each
emulated worker's `GET /kv_cache` lists its cached blocks with their parents and tokens, so
the true cache can be named as the index names it. A block whose ancestor was evicted cannot be
named so, and no request can reach it either (a prefix hit walks from the first block): such
blocks are counted apart, as `unreachable`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def reachable_blocks(blocks: Sequence[Sequence[Any]]) -> tuple[set[str], int]:
    """The index's names (hex) of the cached blocks whose every ancestor is cached, and how
    many cached blocks are not such; `blocks` as `/kv_cache` lists them: [hash, parent or
    None, token ids]."""
    from inference.scheduler.prefix import chain

    lineage = {block_hash: (parent, tokens) for block_hash, parent, tokens in blocks}
    named: dict[int, bytes | None] = {}
    for block_hash in lineage:
        path = []
        at: int | None = block_hash
        base: bytes | None = b""
        while at is not None:
            if at in named:
                base = named[at]
                break
            if at not in lineage:
                base = None
                break
            path.append(at)
            at = lineage[at][0]
        for node in reversed(path):
            base = None if base is None else chain(base, lineage[node][1])
            named[node] = base
    reachable = {name.hex() for name in named.values() if name is not None}
    return reachable, len(named) - len(reachable)


@dataclass
class Agreement:
    """An index against the true caches, blocks summed over the workers."""

    indexed: int = 0  # blocks the index holds
    cached: int = 0  # reachable blocks the caches hold
    both: int = 0
    unreachable: int = 0

    def add(self, index: set[str], truth: set[str], unreachable: int) -> None:
        self.indexed += len(index)
        self.cached += len(truth)
        self.both += len(index & truth)
        self.unreachable += unreachable

    @property
    def agreement(self) -> float:
        """Blocks on which both agree over blocks either names (1.0 when both are empty)."""
        either = self.indexed + self.cached - self.both
        return self.both / either if either else 1.0

    @property
    def precision(self) -> float:
        """The share of the index's blocks the caches hold."""
        return self.both / self.indexed if self.indexed else 1.0

    @property
    def recall(self) -> float:
        """The share of the caches' reachable blocks the index holds."""
        return self.both / self.cached if self.cached else 1.0

    def describe(self) -> str:
        return (
            f"{self.agreement:.3f} ({self.both:,} of {self.indexed + self.cached - self.both:,} "
            f"blocks; index {self.precision:.3f} true, caches {self.recall:.3f} known)"
        )


async def agreement(
    http: Any, urls: Sequence[str], worker_ids: Sequence[int], redis: Any
) -> Agreement:
    """The scheduler's index in `redis` against the emulated workers at `urls` (whose worker
    ids, in the same order, are `worker_ids`)."""
    from inference.scheduler.prefix import index_key

    found = Agreement()
    for url, worker_id in zip(urls, worker_ids, strict=True):
        cache = (await http.get(f"{url}/kv_cache", timeout=60)).json()
        truth, unreachable = reachable_blocks(cache["blocks"])
        members = await redis.zrange(index_key(worker_id), 0, -1)
        index = {m.decode() if isinstance(m, bytes) else m for m in members}
        found.add(index, truth, unreachable)
    return found
