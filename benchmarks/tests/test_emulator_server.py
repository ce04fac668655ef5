"""Emulated vLLM workers, started as a benchmark starts them (`python -m benchmarks.emulator`),
read as the scheduler reads a worker: the OpenAI surface with cached tokens in `usage`, the
metrics `parse_metrics` reads, an abort when the client leaves, and KV events on ZeroMQ that
both the scheduler's decoder and vLLM's own classes read."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import zmq
from django.conf import settings

from benchmarks.emulator.launch import free_ports, start_fleet
from benchmarks.emulator.truth import reachable_blocks
from chatsite.testing import budget, wait_until
from inference import prompts
from inference.client import parse_metrics
from inference.scheduler import kv_events, prefix
from inference.tokens import load_tokenizer

SYSTEM = "You are a careful assistant who answers questions about the sea. " * 12


@pytest.fixture(scope="module")
def fleet() -> Iterator[list[dict[str, Any]]]:
    port, events_port = free_ports(2), free_ports(4)
    started = start_fleet(
        [
            *("--workers", "2", "--port", str(port), "--kv-events-port", str(events_port)),
            *("--profile", "h100-8b", "--num-blocks", "4096", "--seed", "3"),
        ]
    )
    try:
        assert len(started.workers) == 2
        yield started.workers
    finally:
        started.stop(timeout=budget(30))


def chat(url: str, content: str, **extra: Any) -> dict[str, Any]:
    body = {
        "model": "smollm2-135m",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}],
        "max_tokens": 12,
        **extra,
    }
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=budget(30))
    response.raise_for_status()
    data: dict[str, Any] = response.json()
    return data


def streamed(url: str, content: str) -> tuple[str, dict[str, Any]]:
    body = {
        "model": "smollm2-135m",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}],
        "max_tokens": 12,
        "stream": True,
        "stream_options": {"include_usage": True},
        "priority": 1,
    }
    text, done = "", False
    usage: dict[str, Any] = {}
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json=body, timeout=budget(30)
    ) as response:
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            chunk = json.loads(line[6:])
            for choice in chunk["choices"]:
                text += choice["delta"].get("content") or ""
            usage = chunk.get("usage") or usage
    assert done
    return text, usage


def metrics(url: str) -> Any:
    return parse_metrics(httpx.get(f"{url}/metrics", timeout=budget(10)).text)


def test_answers_stream_and_a_repeated_prefix_is_reported_cached(
    fleet: list[dict[str, Any]],
) -> None:
    url = fleet[0]["url"]
    text, usage = streamed(url, "What lives in the deep sea?")
    assert usage["completion_tokens"] == 12
    # The text is made of words that are one token each: read again, the same count.
    tokenizer = load_tokenizer(str(settings.MODEL_DIR))
    assert len(tokenizer.encode(text, add_special_tokens=False).ids) == 12
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0
    again = chat(url, "And what lives near the shore?")
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    # The shared system prompt's whole blocks of 16 come from the cache.
    assert cached > 0 and cached % 16 == 0
    assert cached < again["usage"]["prompt_tokens"]
    load = metrics(url)
    assert (load.block_size, load.num_gpu_blocks) == (16, 4096)
    assert load.prefix_cache_hits == cached
    assert load.prefix_cache_queries >= usage["prompt_tokens"] + again["usage"]["prompt_tokens"]
    # The other worker's cache is its own.
    assert (
        chat(fleet[1]["url"], "And near the shore?")["usage"]["prompt_tokens_details"][
            "cached_tokens"
        ]
        == 0
    )


def test_the_rest_of_the_surface_answers_as_vllm_does(fleet: list[dict[str, Any]]) -> None:
    url = fleet[1]["url"]
    assert httpx.get(f"{url}/health", timeout=budget(10)).status_code == 200
    models = httpx.get(f"{url}/v1/models", timeout=budget(10)).json()
    assert [m["id"] for m in models["data"]] == ["smollm2-135m"]
    completion = httpx.post(
        f"{url}/v1/completions",
        json={"model": "smollm2-135m", "prompt": "The sea is", "max_tokens": 3},
        timeout=budget(30),
    ).json()
    assert completion["object"] == "text_completion"
    assert completion["usage"]["completion_tokens"] == 3
    wrong = httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]},
        timeout=budget(10),
    )
    assert wrong.status_code == 404 and "does not exist" in wrong.json()["error"]["message"]
    bad = httpx.post(f"{url}/v1/chat/completions", content=b"{nope", timeout=budget(10))
    assert bad.status_code == 400
    too_long = httpx.post(
        f"{url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**6},
        timeout=budget(10),
    )
    assert too_long.status_code == 400 and "context length" in too_long.text
    for prompt in (["a", "b"], [1, -2], [True], [], 7):
        refused = httpx.post(
            f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 2}, timeout=budget(10)
        )
        assert refused.status_code == 400 and "token ids" in refused.text, prompt
    ids = httpx.post(
        f"{url}/v1/completions", json={"prompt": [504, 3056], "max_tokens": 2}, timeout=budget(30)
    ).json()
    assert ids["usage"]["prompt_tokens"] == 2
    assert httpx.post(f"{url}/reset_prefix_cache", timeout=budget(10)).status_code == 200


def test_the_true_cache_holds_the_prompt_as_the_scheduler_renders_and_hashes_it(
    fleet: list[dict[str, Any]],
) -> None:
    url = fleet[1]["url"]
    assert httpx.post(f"{url}/reset_prefix_cache", timeout=budget(10)).status_code == 200
    assert httpx.get(f"{url}/kv_cache", timeout=budget(10)).json()["blocks"] == []
    chat(url, "Which fish glow in the dark?")
    cache = httpx.get(f"{url}/kv_cache", timeout=budget(10)).json()
    assert cache["block_size"] == 16
    held, unreachable = reachable_blocks(cache["blocks"])
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Which fish glow in the dark?"},
    ]
    ids = prompts.token_ids(str(settings.MODEL_DIR), messages)
    assert set(prefix.block_hashes(ids, 16)) <= held
    assert unreachable == 0


def test_a_client_that_leaves_aborts_its_request(fleet: list[dict[str, Any]]) -> None:
    url = fleet[0]["url"]
    body = {
        "messages": [{"role": "user", "content": "Write a very long story."}],
        "max_tokens": 4000,  # about 40 s of steps: still running when the client leaves
        "stream": True,
    }
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json=body, timeout=budget(30)
    ) as response:
        lines = response.iter_lines()
        while "content" not in next(lines):
            pass
        assert metrics(url).running == 1
    wait_until(lambda: metrics(url).running == 0, within=30, what="the abort")
    aborted = httpx.get(f"{url}/metrics", timeout=budget(10)).text
    assert 'finished_reason="abort"} 1.0' in aborted


def test_kv_events_are_published_and_replayed_in_vllms_format(
    fleet: list[dict[str, Any]],
) -> None:
    worker = fleet[1]
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(worker["kv_events"])
    try:
        # A SUB socket joins late: ask until a batch arrives.
        def published() -> list[bytes] | None:
            chat(worker["url"], "Tell me about tides.")
            if sub.poll(200):
                frames: list[bytes] = sub.recv_multipart()
                return frames
            return None

        frames = wait_until(published, within=30, what="a KV event batch")
    finally:
        sub.close(linger=0)
    assert frames is not None
    topic, seq, payload = frames
    assert topic == b"" and len(seq) == 8
    batch = kv_events.decode(payload)
    stored = [e for e in batch.events if isinstance(e, kv_events.BlockStored)]
    assert stored and all(e.block_size == 16 and e.medium == "GPU" for e in stored)

    dealer = context.socket(zmq.DEALER)
    dealer.connect(worker["kv_events_replay"])
    try:
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        replayed = []
        while True:
            assert dealer.poll(int(budget(10) * 1000)), "no replay"
            _, _, seq_bytes, data = dealer.recv_multipart()
            if int.from_bytes(seq_bytes, "big", signed=True) == -1:
                break
            replayed.append(data)
    finally:
        dealer.close(linger=0)
    assert payload in replayed

    # vLLM's own event classes read it as they read a real worker's.
    worker_python = Path(settings.WORKER_PYTHON)
    if not worker_python.exists():
        pytest.fail("the vLLM worker venv is missing (make worker-venv)")
    read = subprocess.run(  # noqa: S603 (our own command line)
        [
            str(worker_python),
            "-c",
            "import sys, msgspec; from vllm.distributed.kv_events import KVEventBatch; "
            "b = msgspec.msgpack.decode(bytes.fromhex(sys.stdin.read()), type=KVEventBatch); "
            "print(type(b.events[0]).__name__, b.events[0].block_size)",
        ],
        input=payload.hex(),
        capture_output=True,
        text=True,
        timeout=budget(120),
    )
    assert read.returncode == 0, read.stderr
    first = msgspec.msgpack.decode(payload)[1][0]
    assert read.stdout.split() == [first["type"], "16"]
