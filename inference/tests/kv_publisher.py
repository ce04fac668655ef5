"""A stand-in for a vLLM worker's KV event publisher, run with the worker's Python (vLLM's
own `ZmqEventPublisher` and event classes): it publishes what it reads on stdin.

    python kv_publisher.py PUB_PORT REPLAY_PORT

Each stdin line is a JSON list of events, published as one batch; `{"drop": true, ...}` as
the line's first element puts the batch in the replay buffer without sending it (a message
PUB lost). Events: {"stored": [hashes], "parent": hash|null, "tokens": [...], "block_size": n},
{"removed": [hashes]}, {"cleared": true}. It prints "ready" once listening, "ok" per line.
"""

from __future__ import annotations

import json
import sys
import time

import msgspec
from vllm.distributed.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    ZmqEventPublisher,
)


def event(spec: dict) -> object:
    if "stored" in spec:
        return BlockStored(
            block_hashes=spec["stored"],
            parent_block_hash=spec.get("parent"),
            token_ids=spec["tokens"],
            block_size=spec["block_size"],
            lora_id=None,
            medium="GPU",
            lora_name=None,
        )
    if "removed" in spec:
        return BlockRemoved(block_hashes=spec["removed"], medium="GPU")
    return AllBlocksCleared()


def main() -> None:
    pub_port, replay_port = sys.argv[1], sys.argv[2]
    publisher = ZmqEventPublisher(
        data_parallel_rank=0,
        endpoint=f"tcp://*:{pub_port}",
        replay_endpoint=f"tcp://*:{replay_port}",
    )
    print("ready", flush=True)
    for line in sys.stdin:
        specs = json.loads(line)
        drop = bool(specs and specs[0].get("drop"))
        batch = KVEventBatch(ts=time.time(), events=[event(s) for s in specs[drop:]])
        if drop:
            # As if PUB had sent it to nobody: numbered and buffered for replay only.
            publisher._event_queue.join()
            seq = next(publisher._seq_gen)
            publisher._buffer.append((seq, msgspec.msgpack.Encoder().encode(batch)))
        else:
            publisher.publish(batch)
            publisher._event_queue.join()
        print("ok", flush=True)
    publisher.shutdown()


if __name__ == "__main__":
    main()
