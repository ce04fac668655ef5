"""What each worker holds in its KV cache, estimated from what was sent to it.

vLLM caches a prompt in whole blocks of `block_size` tokens (its `vllm:cache_config_info`),
each block known by a hash chained over the blocks before it, and reuses a block only where the
whole prefix up to it is the same. The index keeps, per worker, the chained hashes of the
blocks of every prompt placed there and of every answer it produced (the next turn's prefix),
each scored by when it was last used; past the worker's `num_gpu_blocks` it forgets the least
recently used, as vLLM evicts them (an answer's later blocks before its earlier ones). A
request's cached prefix on a worker is then the run of its own block hashes, from the first,
that the worker's set holds.

The sets live in Redis, one sorted set per worker, every key under one hash tag so that one
Lua step reads them all (and a Redis Cluster keeps them in one slot); every scheduler replica
reads and writes the same index. `MemoryIndex` is the same model in a process, for the fleet
simulator and the tests that compare the two.
"""

from __future__ import annotations

import hashlib
import logging
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from .. import prompts
from ..tokens import load_tokenizer

logger = logging.getLogger(__name__)

# KEYS: the workers' block sets; ARGV: a request's block hashes, first block first. Returns,
# per worker, how many of its leading blocks the worker holds.
MATCH = """
local matched = {}
for i = 1, #KEYS do
  local n = 0
  for j = 1, #ARGV do
    if not redis.call('ZSCORE', KEYS[i], ARGV[j]) then
      break
    end
    n = j
  end
  matched[i] = n
end
return matched
"""

# KEYS[1]: a worker's block set. ARGV: its capacity in blocks (0: unknown, keep all), the
# score of this use, then the hashes, first block first. An earlier block scores higher than a
# later one of the same use, so the tail of a sequence is forgotten first.
RECORD = """
local base = tonumber(ARGV[2])
local last = #ARGV
local pairs = {}
for i = 3, last do
  pairs[#pairs + 1] = base + (last - i)
  pairs[#pairs + 1] = ARGV[i]
end
if #pairs > 0 then
  redis.call('ZADD', KEYS[1], unpack(pairs))
end
local capacity = tonumber(ARGV[1])
if capacity > 0 then
  local over = redis.call('ZCARD', KEYS[1]) - capacity
  if over > 0 then
    redis.call('ZPOPMIN', KEYS[1], over)
  end
end
return 1
"""


def index_key(worker_id: object) -> str:
    """A worker's block set; the `{...}` hash tag keeps every worker's set in one slot (its
    own, not the coordination's: the index is the plane's largest structure)."""
    return "{" + settings.INFERENCE_REDIS_PREFIX + ":prefix}:" + str(worker_id)


def block_hashes(
    token_ids: Sequence[int], block_size: int, *, known: Sequence[str] = ()
) -> list[str]:
    """The chained hashes of the full blocks of `token_ids`: each covers its block and, through
    its parent, every token before it (as vLLM's block hashes do). `known` are the hashes of
    its first blocks, computed before: the chain goes on from the last of them."""
    if block_size <= 0:
        return []
    hashes = list(known)
    parent = bytes.fromhex(known[-1]) if known else b""
    for start in range(len(known) * block_size, len(token_ids) - block_size + 1, block_size):
        parent = chain(parent, token_ids[start : start + block_size])
        hashes.append(parent.hex())
    return hashes


def chain(parent: bytes, block: Sequence[int]) -> bytes:
    """The hash of one block of tokens after the block hashed `parent` (b"" for the first)."""
    digest = hashlib.blake2b(parent, digest_size=8)
    digest.update(array("I", block).tobytes())
    return digest.digest()


def use_score(now_ms: int) -> int:
    """The score of a use at `now_ms`: room below it for the blocks of one sequence (the
    largest score must stay an exact float, under 2**53)."""
    return now_ms * 1000


@dataclass
class Prompt:
    """One request's prompt as token ids, and its block hashes per block size."""

    token_ids: list[int]
    _hashes: dict[int, list[str]] = field(default_factory=dict)
    # Hashes of its first blocks known before (those of the prompt an answer follows).
    _known: dict[int, list[str]] = field(default_factory=dict)

    def hashes(self, block_size: int) -> list[str]:
        if block_size not in self._hashes:
            known = self._known.get(block_size, ())
            self._hashes[block_size] = block_hashes(self.token_ids, block_size, known=known)
        return self._hashes[block_size]

    def then(self, token_ids: Sequence[int], *, cut: int = 0) -> Prompt:
        """This prompt followed by `token_ids` (its answer's), cut at `cut` tokens when that
        is more than 0; the hashes of this prompt's blocks are not computed again."""
        ids = [*self.token_ids, *token_ids]
        if cut > 0:
            ids = ids[:cut]
        known = {size: hashes[: len(ids) // size] for size, hashes in self._hashes.items()}
        return Prompt(ids, _known=known)


# The folders whose prompts could not be rendered, told once each (not once per request).
_unrenderable: set[str] = set()


def prompt_of(
    folder: str, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None
) -> Prompt | None:
    """The request's prompt as the worker will tokenize it; None where it cannot be rendered
    (placement then goes by load alone)."""
    try:
        return Prompt(prompts.token_ids(folder, messages, tools=tools))
    except Exception as exc:  # a template or tokenizer we cannot run must not stop placement
        if folder not in _unrenderable:
            _unrenderable.add(folder)
            logger.warning("cannot render prompts of %s for placement: %s", folder, exc)
        return None


def answer_of(
    folder: str,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None,
    text: str,
    *,
    sequence_tokens: int,
) -> Prompt | None:
    """The sequence the worker ends an answer with: its prompt and the answer's tokens, cut at
    the `sequence_tokens` it reported (prompt plus completion); None if it cannot be rendered."""
    try:
        ids = prompts.token_ids(
            folder,
            [*messages, {"role": "assistant", "content": text}],
            tools=tools,
            add_generation_prompt=False,
        )
    except Exception:  # told once by `prompt_of`, which meets the same template first
        return None
    return Prompt(ids[:sequence_tokens] if sequence_tokens > 0 else ids)


def answer_after(folder: str, prompt: Prompt, text: str, *, sequence_tokens: int) -> Prompt | None:
    """`answer_of` from the prompt placement rendered for the same request: the answer's text
    is all there is left to tokenize (a conversation's history is not rendered again)."""
    try:
        ids = load_tokenizer(folder).encode(text, add_special_tokens=False).ids
    except Exception:  # told once by `prompt_of`, which meets the same tokenizer first
        return None
    return prompt.then(ids, cut=sequence_tokens)


class RedisIndex:
    """The shared index: one Lua step to match a request against every candidate, one to
    record a use."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis

    async def matched_blocks(self, worker_ids: Sequence[int], hashes: Sequence[str]) -> list[int]:
        """Per worker of `worker_ids`, how many leading blocks of `hashes` it holds."""
        if not worker_ids or not hashes:
            return [0] * len(worker_ids)
        keys = [index_key(w) for w in worker_ids]
        matched = await self.redis.eval(MATCH, len(keys), *keys, *hashes)
        return [int(n) for n in matched]

    async def record(
        self, worker_id: int, hashes: Sequence[str], *, capacity: int, now_ms: int
    ) -> None:
        if hashes:
            await self.redis.eval(
                RECORD, 1, index_key(worker_id), str(capacity), str(use_score(now_ms)), *hashes
            )

    async def remove(self, worker_id: int, hashes: Sequence[str]) -> None:
        """Forget blocks the worker evicted (its KV events say so)."""
        if hashes:
            await self.redis.zrem(index_key(worker_id), *hashes)

    async def clear(self, worker_id: int) -> None:
        """Forget what a worker held (it restarted, or went down)."""
        await self.redis.delete(index_key(worker_id))


class MemoryIndex:
    """The same model in one process: per worker, its blocks from least to most recently
    used, and per block the workers holding it, so that matching a prompt against a fleet
    walks the prompt's blocks, not the workers (the fleet simulator's index, and a reference
    for the Redis one)."""

    def __init__(self) -> None:
        self.workers: dict[int, OrderedDict[str, int]] = {}
        self.holders: dict[str, set[int]] = {}

    def longest(self, hashes: Sequence[str]) -> dict[int, int]:
        """Every worker holding the first block, with how many leading blocks it holds."""
        if not hashes or hashes[0] not in self.holders:
            return {}
        alive = set(self.holders[hashes[0]])
        matched = dict.fromkeys(alive, 1)
        for depth, block in enumerate(hashes[1:], start=2):
            alive &= self.holders.get(block, set())
            if not alive:
                break
            for worker_id in alive:
                matched[worker_id] = depth
        return matched

    def matched_blocks(self, worker_ids: Sequence[int], hashes: Sequence[str]) -> list[int]:
        matched = self.longest(hashes)
        return [matched.get(worker_id, 0) for worker_id in worker_ids]

    def record(self, worker_id: int, hashes: Sequence[str], *, capacity: int, now_ms: int) -> None:
        """As the Redis step, for uses in time order: the last block is touched first, so
        the first ends as the most recently used."""
        held = self.workers.setdefault(worker_id, OrderedDict())
        for block in reversed(hashes):
            if block not in held:
                self.holders.setdefault(block, set()).add(worker_id)
            held[block] = now_ms
            held.move_to_end(block)
        while capacity > 0 and len(held) > capacity:
            self._forget(worker_id, held.popitem(last=False)[0])

    def size(self, worker_id: int) -> int:
        return len(self.workers.get(worker_id, ()))

    def clear(self, worker_id: int) -> None:
        for block in self.workers.pop(worker_id, {}):
            self._forget(worker_id, block)

    def _forget(self, worker_id: int, block: str) -> None:
        holders = self.holders.get(block)
        if holders is not None:
            holders.discard(worker_id)
            if not holders:
                del self.holders[block]
