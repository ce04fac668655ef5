"""KV cache events over ZeroMQ, in vLLM's own wire format (`vllm.distributed.kv_events`).

One PUB message per engine step that changed the cache: three frames, the topic, an 8-byte
big-endian sequence number and the batch in msgpack (`KVEventBatch`, array-like: its time and
its events; each event a map tagged with its class name: `BlockStored` with the block hashes,
the parent's hash, the tokens and the block size, `BlockRemoved`, `AllBlocksCleared`). A
ROUTER socket replays the batches still buffered from a sequence number on, then the end
marker (sequence -1), as vLLM's `ZmqEventPublisher` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from .engine import Event

END_SEQ = (-1).to_bytes(8, "big", signed=True)
BUFFER_STEPS = 10_000  # vLLM's default replay buffer


class BlockStored(msgspec.Struct, tag=True, omit_defaults=True):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class BlockRemoved(msgspec.Struct, tag=True, omit_defaults=True):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(msgspec.Struct, tag=True, omit_defaults=True):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


_encoder = msgspec.msgpack.Encoder()


def encode(events: Sequence[Event], block_size: int, *, ts: float | None = None) -> bytes:
    """The engine's events of one step as vLLM encodes a batch."""
    out: list[BlockStored | BlockRemoved | AllBlocksCleared] = []
    for event in events:
        if event[0] == "stored":
            _, hashes, parent, tokens = event
            out.append(BlockStored(hashes, parent, tokens, block_size, None, "GPU", None))
        elif event[0] == "removed":
            out.append(BlockRemoved(event[1], "GPU"))
        else:
            out.append(AllBlocksCleared())
    return _encoder.encode(KVEventBatch(ts=time.time() if ts is None else ts, events=out))


class EventPublisher:
    """Publishes one worker's batches on `tcp://host:port`, replays on `replay_port`."""

    def __init__(self, host: str, port: int, replay_port: int, block_size: int) -> None:
        self.block_size = block_size
        self.context = zmq.asyncio.Context.instance()
        self.pub = self.context.socket(zmq.PUB)
        self.pub.bind(f"tcp://{host}:{port}")
        self.replay = self.context.socket(zmq.ROUTER)
        self.replay.bind(f"tcp://{host}:{replay_port}")
        self.topic = b""
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=BUFFER_STEPS)
        self.numbers = itertools.count()
        self._replayer: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._replayer = asyncio.ensure_future(self._serve_replays())

    def publish(self, events: Sequence[Event]) -> None:
        seq = next(self.numbers)
        payload = encode(events, self.block_size)
        self.buffer.append((seq, payload))
        # PUB never blocks: a slow or absent subscriber loses it and asks for a replay.
        with contextlib.suppress(zmq.Again):
            self.pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload), zmq.NOBLOCK)

    async def _serve_replays(self) -> None:
        while True:
            frames: list[Any] = await self.replay.recv_multipart()
            client, start = frames[0], int.from_bytes(frames[-1], "big")
            for seq, payload in list(self.buffer):
                if seq >= start:
                    await self.replay.send_multipart(
                        (client, b"", self.topic, seq.to_bytes(8, "big"), payload)
                    )
            await self.replay.send_multipart((client, b"", b"", END_SEQ, b""))

    def close(self) -> None:
        if self._replayer is not None:
            self._replayer.cancel()
        self.pub.close(linger=0)
        self.replay.close(linger=0)
