"""vLLM's KV cache events, where a worker publishes them: the prefix index made exact.

A worker started with `--kv-events-config` publishes, over ZeroMQ, a batch of events after
each engine step: `BlockStored` (blocks now cached: vLLM's hashes of them, their parent's, and
their tokens), `BlockRemoved` (evicted) and `AllBlocksCleared`. Each batch is one PUB message
of three frames: the topic, an 8-byte big-endian sequence number and the batch in msgpack
(msgspec's encoding of `vllm.distributed.kv_events.KVEventBatch`); a ROUTER socket replays
the batches it still buffers from a sequence number on, ending with sequence -1.

`KVEventsSubscriber` follows one worker's publisher. A gap in the sequence (PUB drops what a
slow or late subscriber missed) is filled from the replay socket before the batch that showed
it; a sequence that goes back means the worker restarted, with an empty cache. Both sockets
connect only to an address the workers' address policy allows (`client.kv_events_address`).

`KVEventsApplier` turns the events into the index's own block hashes (`prefix.block_hashes`:
vLLM's hashes are seeded per process and cannot be computed here), chaining each stored
block's tokens on its parent's hash, and records or removes them. A worker whose events
arrive is marked exact: placement stops recording its own estimate of what the worker holds.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from .. import queue
from ..client import kv_events_address
from . import prefix

logger = logging.getLogger(__name__)

END_SEQ = -1
REPLAY_TIMEOUT_SECONDS = 5.0


# vLLM's event shapes, as far as the index reads them (msgspec ignores the other fields).


class BlockStored(msgspec.Struct, tag=True):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    medium: str | None = None


class BlockRemoved(msgspec.Struct, tag=True):
    block_hashes: list[bytes | int]
    medium: str | None = None


class AllBlocksCleared(msgspec.Struct, tag=True):
    pass


class KVEventBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


_decoder = msgspec.msgpack.Decoder(KVEventBatch)


def decode(payload: bytes) -> KVEventBatch:
    return _decoder.decode(payload)


class KVEventsApplier:
    """One worker's events, applied to the index. Remembers vLLM's hash of each block it
    recorded and the index's own for it, as many as the worker's cache holds (twice over)."""

    def __init__(self, index: prefix.RedisIndex, worker_id: int, *, capacity: int) -> None:
        self.index = index
        self.worker_id = worker_id
        self.capacity = capacity
        self.ours: OrderedDict[bytes | int, str] = OrderedDict()
        # Blocks stored under a parent this applier never saw: not in the index.
        self.orphans = 0

    async def apply(self, batch: KVEventBatch) -> None:
        for event in batch.events:
            if isinstance(event, BlockStored):
                await self._stored(event)
            elif isinstance(event, BlockRemoved):
                await self._removed(event)
            else:
                await self.clear()

    async def clear(self) -> None:
        self.ours.clear()
        await self.index.clear(self.worker_id)

    async def _stored(self, event: BlockStored) -> None:
        if event.medium not in (None, "GPU"):
            return  # an offloaded copy: not what a request finds in the worker's cache
        if event.parent_block_hash is None:
            parent = b""
        elif event.parent_block_hash in self.ours:
            parent = bytes.fromhex(self.ours[event.parent_block_hash])
        else:
            self.orphans += len(event.block_hashes)
            return
        size = event.block_size
        hashes = []
        for number, theirs in enumerate(event.block_hashes):
            tokens = event.token_ids[number * size : (number + 1) * size]
            if len(tokens) < size:
                break
            parent = prefix.chain(parent, tokens)
            hashes.append(parent.hex())
            self.ours[theirs] = hashes[-1]
            self.ours.move_to_end(theirs)
        while len(self.ours) > 2 * max(self.capacity, 1):
            self.ours.popitem(last=False)
        await self.index.record(
            self.worker_id, hashes, capacity=self.capacity, now_ms=queue.now_ms()
        )

    async def _removed(self, event: BlockRemoved) -> None:
        if event.medium not in (None, "GPU"):
            return
        gone = [self.ours.pop(theirs) for theirs in event.block_hashes if theirs in self.ours]
        await self.index.remove(self.worker_id, gone)


class KVEventsSubscriber:
    """Follows one worker's publisher until cancelled: every batch applied once, in order."""

    def __init__(
        self,
        applier: KVEventsApplier,
        *,
        endpoint: str,
        replay_endpoint: str = "",
        topic: str = "",
        on_batch: Callable[[int], Any] | None = None,
    ) -> None:
        self.applier = applier
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic.encode()
        self.on_batch = on_batch
        self.last_seq: int | None = None
        self.batches = 0
        self.replayed = 0
        self._context = zmq.asyncio.Context.instance()

    async def run(self) -> None:
        address = await kv_events_address(self.endpoint)
        socket = self._context.socket(zmq.SUB)
        socket.setsockopt(zmq.SUBSCRIBE, self.topic)
        socket.connect(address)
        try:
            while True:
                _, seq_bytes, payload = await socket.recv_multipart()
                await self._received(int.from_bytes(seq_bytes, "big", signed=True), payload)
        finally:
            socket.close(linger=0)

    async def _received(self, seq: int, payload: bytes) -> None:
        if self.last_seq is not None and seq <= self.last_seq:
            if seq < self.last_seq:
                # The sequence started again: the worker restarted, with an empty cache.
                logger.info("KV events of worker %s restarted", self.applier.worker_id)
                await self.applier.clear()
                self.last_seq = None
            else:
                return  # already applied (from a replay)
        first_missing = 0 if self.last_seq is None else self.last_seq + 1
        if seq > first_missing and self.replay_endpoint:
            await self._replay(first_missing, seq)
        await self._apply(seq, payload)

    async def _apply(self, seq: int, payload: bytes) -> None:
        try:
            batch = decode(payload)
        except msgspec.DecodeError:
            logger.warning("worker %s sent a KV event batch not understood", self.applier.worker_id)
        else:
            await self.applier.apply(batch)
        self.last_seq = seq
        self.batches += 1
        if self.on_batch is not None:
            self.on_batch(self.applier.worker_id)

    async def _replay(self, start: int, until: int) -> None:
        """The batches from `start` up to (not including) `until` that the publisher still
        buffers."""
        address = await kv_events_address(self.replay_endpoint)
        socket = self._context.socket(zmq.DEALER)
        socket.connect(address)
        try:
            await socket.send_multipart([b"", start.to_bytes(8, "big")])
            deadline = time.monotonic() + REPLAY_TIMEOUT_SECONDS
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not await socket.poll(int(left * 1000)):
                    logger.warning(
                        "replay of worker %s's KV events timed out", self.applier.worker_id
                    )
                    return
                _, _, seq_bytes, payload = await socket.recv_multipart()
                seq = int.from_bytes(seq_bytes, "big", signed=True)
                if seq == END_SEQ:
                    return
                if seq < until and (self.last_seq is None or seq > self.last_seq):
                    await self._apply(seq, payload)
                    self.replayed += 1
        finally:
            socket.close(linger=0)
