"""The real race: one multi-turn trace through the routers people use and through this service.

The same trace (seeded) is played against each side in turn, over the same real vLLM workers:

- `vllm-router:<policy>` (round_robin, cache_aware, consistent_hash, ...) and
  `sglang-router:<policy>` (cache_aware, round_robin, ...), started here from their own
  environment (`--routers-venv`, made with `make routers-venv`: both install from PyPI);
- `v1:<placement>`: this service's `/v1/chat/completions` (a real edge and scheduler process,
  started here with `SCHEDULER_PLACEMENT=<placement>`);
- `conversations:<placement>`: the conversation API as the web page uses it (the conversation
  created with its system prompt, then per turn `POST .../messages` and its Server-Sent Events).
- `v1:<placement>+events`, `conversations:<placement>+events`: the same, with the scheduler
  following the workers' KV cache events (`--kv-events`, the workers started with
  `run_worker --kv-events-port`) instead of estimating what their caches hold.

The trace: `--conversations` conversations arriving at `--rate` per second (Poisson), each of
`--turns` turns with a think time (exponential, mean `--think` s) between an answer and the
next question, each starting with one of `--prompts` shared system prompts of about
`--system-tokens` tokens; answers of `--max-tokens`. A client sends the whole history each
turn (the conversation API keeps it on the server). Each side's system prompts begin with a
fresh random tag, so no side finds the blocks of one before it; the workers' caches are also
reset where they allow it (`POST /reset_prefix_cache`).

Per side: vLLM's own prefix-cache hit rate over the side (the change of its
`prefix_cache_hits` / `prefix_cache_queries` counters, summed over the workers), TTFT p50/p99
(request sent to first text), output tokens/s over the side's wall time, requests per worker,
errors, and the CPU seconds its routing processes (a peer router; the service's edge and
scheduler) and this machine's Postgres and Redis used while it played (the workers share
those cores). `--stages` adds where each service answer's first-token time went; `--burn F`
keeps F of a core busy beside the workers during every side, to see how much such load
slows them; `--nice N` runs every side's routing processes at niceness N.

The oracle's hit rate (one cache of unlimited size holding every block sent before, in the
workers' own block size, replaying the side's own prompts and answers) is the limit any
placement can reach.

On an emulated fleet (`--emulated N`, `benchmarks/emulator`), also: `--load 0.5,0.9,1.2`
plays the trace at those shares of the fleet's capacity for it (`capacity`) instead of at
`--rate`; each service side's index is compared at its end with what the workers' caches truly
hold (`benchmarks/emulator/truth.py`); and `fleet_sim.py` is run on the same trace and profile,
its prediction printed beside each live side its policy stands for. `--paid S` gives that share
of the conversations to pro users and the rest to free ones, real or emulated workers alike.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/chatsite_race_bench \\
    REDIS_URL=redis://127.0.0.1:6379/8 SECRET_KEY=x \\
    .venv/bin/python benchmarks/router_race.py --workers http://127.0.0.1:8201,http://127.0.0.1:8202

The workers are started beforehand (`manage.py run_worker --port P --cpus N`, one core each;
`--extra --num-gpu-blocks-override 96` gives each the 12,288 tokens of KV cache the issue's
figures were taken with). It prints one table and writes it to
benchmarks/results/router_race-<UTC date-time>.txt.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import secrets
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import (  # noqa: E402
    django_start,
    edge_command,
    free_port,
    percentile,
    prepare_stores,
    render,
    service_env,
    write_result,
)
from benchmarks.emulator.launch import (  # noqa: E402
    Fleet,
    add_arguments,
    describe,
    emulated_profile,
    process_cpu_seconds,
    start_for,
)
from benchmarks.emulator.truth import Agreement, agreement  # noqa: E402
from benchmarks.latency import STAGES, now_ms, server_marks, stages  # noqa: E402
from benchmarks.openai_api import bench_key, prepare, start, stop, wait_up  # noqa: E402
from benchmarks.overhead import cpu_seconds, pids_named, sse_events  # noqa: E402
from benchmarks.scheduler_affinity import POLICY_LINES, QUESTIONS, SYSTEM_HEAD  # noqa: E402
from benchmarks.stack import process_group  # noqa: E402

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/chatsite_race_bench"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/8"
DEFAULT_SIDES = (
    "vllm-router:round_robin,vllm-router:cache_aware,vllm-router:consistent_hash,"
    "sglang-router:cache_aware,v1:round_robin,v1:predicted_ttft,conversations:predicted_ttft"
)
# What makes the shared system prompts differ from each other from their first block on.
# After an emulated fleet goes idle, the index is compared with its caches until two readings
# this far apart agree (its last KV events may still be on their way to a scheduler that a busy
# machine keeps waiting), at most this often.
EVENTS_SETTLE_S = 1.0
EVENTS_SETTLE_TRIES = 15
DOMAINS = ["bicycle cooperative", "public library", "swimming pool", "community garden"]


# The trace


@dataclass(frozen=True)
class Conversation:
    index: int
    start_s: float
    system: int  # which shared system prompt
    questions: list[str]
    thinks: list[float]
    tier: str = "pro"  # its user's plan (`--paid`)


def make_trace(args: argparse.Namespace) -> list[Conversation]:
    rng = random.Random(args.seed)
    at = 0.0
    trace = []
    for index in range(args.conversations):
        at += rng.expovariate(args.rate)
        questions = [rng.choice(QUESTIONS) for _ in range(args.turns)]
        questions[0] = f"Hello, I am member {index + 1}. {questions[0]}"
        thinks = [rng.expovariate(1 / args.think) if args.think > 0 else 0.0 for _ in questions]
        trace.append(Conversation(index, at, rng.randrange(args.prompts), questions, thinks))
    if args.paid:
        # Drawn apart, so that the rest of a seed's trace stays as it was without tiers.
        tiers = random.Random(args.seed + 1)
        for at_index, conversation in enumerate(trace):
            paid = tiers.random() < args.paid
            trace[at_index] = replace(conversation, tier="pro" if paid else "free")
    return trace


def system_prompts(args: argparse.Namespace, tag: str) -> list[str]:
    """`--prompts` system prompts of about `--system-tokens` tokens, led by this side's tag."""
    from django.conf import settings

    from inference.tokens import count_tokens, load_tokenizer

    tokenizer = load_tokenizer(str(settings.MODEL_DIR))
    texts = []
    for number in range(args.prompts):
        domain = DOMAINS[number % len(DOMAINS)]
        parts = [f"[{tag}-{number}] You are the assistant of the {domain}.", SYSTEM_HEAD]
        index = number  # each prompt lists the rules from its own starting point
        while count_tokens(tokenizer, " ".join(parts)) < args.system_tokens:
            parts.append(f"Rule {index + 1}: {POLICY_LINES[index % len(POLICY_LINES)]}")
            index += 1
        texts.append(" ".join(parts))
    return texts


# A side's client


@dataclass
class Answer:
    conversation: int
    turn: int
    sent_at: float = 0.0  # since the side began
    ttft: float | None = None
    tokens: int = 0
    # The prompt's tokens and those the worker found cached, as the answer's usage says.
    prompt_tokens: int = 0
    cached_tokens: int = 0
    text: str = ""
    error: str | None = None
    tier: str = "pro"
    # Where a service answer's first-token time went (`--stages`; latency.py's stages).
    stages: dict[str, float] = field(default_factory=dict)


@dataclass
class Side:
    name: str
    kind: str  # "router", "v1" or "conversations"
    base_url: str = ""
    model: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    # `--paid`: a free conversation's headers (the service: a free user's key), and the
    # priority a peer router passes on to vLLM per tier, as the service sends it.
    free_headers: dict[str, str] = field(default_factory=dict)
    priorities: dict[str, int] = field(default_factory=dict)
    # The service's Redis, for tracing its answers' stages (`--stages`); None: not traced.
    redis: Any = None


async def trace_stages(side: Side, answer: Answer, generation_id: str, sent: float) -> None:
    """The stages of a service answer whose first text has just arrived (sent: epoch ms)."""
    if side.redis is not None and generation_id:
        first = now_ms()
        answer.stages = stages(sent, first, await server_marks(side.redis, generation_id))


async def openai_turn(
    client: httpx.AsyncClient,
    side: Side,
    messages: list[dict[str, str]],
    answer: Answer,
    args: Any,
    tier: str,
) -> None:
    body: dict[str, Any] = {
        "model": side.model,
        "messages": messages,
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if tier in side.priorities:
        body["priority"] = side.priorities[tier]
    headers = side.free_headers if tier == "free" else {}
    started = time.perf_counter()
    sent = now_ms()
    chunks = 0
    async with client.stream(
        "POST", f"{side.base_url}/v1/chat/completions", json=body, headers=headers
    ) as response:
        if response.status_code != 200:
            answer.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
            return
        async for _event, data in sse_events(response):
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            for choice in chunk.get("choices") or []:
                text = (choice.get("delta") or {}).get("content") or ""
                if text:
                    chunks += 1
                    answer.text += text
                    if answer.ttft is None:
                        answer.ttft = time.perf_counter() - started
                        request_id = response.headers.get("x-request-id", "")
                        await trace_stages(side, answer, request_id.removeprefix("chatcmpl-"), sent)
            if usage := chunk.get("usage"):
                answer.tokens = int(usage.get("completion_tokens") or 0)
                answer.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                details = usage.get("prompt_tokens_details") or {}
                answer.cached_tokens = int(details.get("cached_tokens") or 0)
    answer.tokens = answer.tokens or chunks


async def conversation_turn(
    client: httpx.AsyncClient,
    side: Side,
    conversation_id: str,
    question: str,
    answer: Answer,
    headers: dict[str, str],
) -> None:
    started = time.perf_counter()
    sent_ms = now_ms()
    sent = await client.post(
        f"{side.base_url}/api/v1/conversations/{conversation_id}/messages",
        json={"content": question},
        headers=headers,
    )
    if sent.status_code >= 300:
        answer.error = f"HTTP {sent.status_code}: {sent.text[:200]}"
        return
    generation = sent.json()["generation"]
    stream_url = generation["stream_url"]
    async with client.stream("GET", f"{side.base_url}{stream_url}", headers=headers) as response:
        async for event, data in sse_events(response):
            if event == "delta":
                answer.text += json.loads(data).get("text", "")
                if answer.ttft is None:
                    answer.ttft = time.perf_counter() - started
                    await trace_stages(side, answer, generation["id"], sent_ms)
            elif event == "error":
                answer.error = f"error event: {data}"[:200]
            elif event == "done":
                done = json.loads(data)
                answer.tokens = int(done.get("output_tokens") or 0)
                answer.prompt_tokens = int(done.get("prompt_tokens") or 0)
                answer.cached_tokens = int(done.get("cached_tokens") or 0)
                break


async def converse(
    client: httpx.AsyncClient,
    side: Side,
    conversation: Conversation,
    prompts: list[str],
    args: Any,
    clock: float,
) -> list[Answer]:
    await asyncio.sleep(max(0.0, clock + conversation.start_s - time.perf_counter()))
    system = prompts[conversation.system]
    messages = [{"role": "system", "content": system}]
    conversation_id = ""
    headers = side.free_headers if conversation.tier == "free" else {}
    if side.kind == "conversations":
        created = await client.post(
            f"{side.base_url}/api/v1/conversations",
            json={"system_prompt": system},
            headers=headers,
        )
        created.raise_for_status()
        conversation_id = created.json()["id"]
    answers = []
    for turn, question in enumerate(conversation.questions):
        answer = Answer(
            conversation.index, turn, sent_at=time.perf_counter() - clock, tier=conversation.tier
        )
        answers.append(answer)
        try:
            if side.kind == "conversations":
                await conversation_turn(client, side, conversation_id, question, answer, headers)
            else:
                messages.append({"role": "user", "content": question})
                await openai_turn(client, side, messages, answer, args, conversation.tier)
                messages.append({"role": "assistant", "content": answer.text})
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            answer.error = f"{type(exc).__name__}: {exc}"[:200]
        if answer.error:
            break
        await asyncio.sleep(conversation.thinks[turn])
    return answers


# Workers


# vLLM's own account of a request's time, summed over requests (histograms' _sum), to tell
# the worker's part of the time to first token from the path's.
VLLM_SUMS = {
    "vllm:time_to_first_token_seconds_sum": "ttft",
    "vllm:request_queue_time_seconds_sum": "queue",
    "vllm:request_prefill_time_seconds_sum": "prefill",
    "vllm:num_preemptions_total": "preemptions",
}


@dataclass
class Counters:
    queries: float
    hits: float
    requests: float
    sums: dict[str, float] = field(default_factory=dict)


async def counters(http: httpx.AsyncClient, urls: Sequence[str]) -> list[Counters]:
    from inference.client import parse_metrics

    found = []
    for url in urls:
        text = (await http.get(f"{url}/metrics")).text
        load = parse_metrics(text)
        sums = dict.fromkeys(VLLM_SUMS.values(), 0.0)
        requests = 0.0
        for line in text.splitlines():
            name = line.split("{", 1)[0]
            if name == "vllm:request_success_total":
                requests += float(line.rsplit(" ", 1)[1])
            elif name in VLLM_SUMS:
                sums[VLLM_SUMS[name]] += float(line.rsplit(" ", 1)[1])
        found.append(Counters(load.prefix_cache_queries, load.prefix_cache_hits, requests, sums))
    return found


async def idle(http: httpx.AsyncClient, urls: Sequence[str]) -> None:
    """Wait for the workers to have nothing running or waiting."""
    from inference.client import parse_metrics

    async with asyncio.timeout(180):
        while True:
            loads = [parse_metrics((await http.get(f"{u}/metrics")).text) for u in urls]
            if all(load.running + load.waiting == 0 for load in loads):
                break
            await asyncio.sleep(0.5)


async def settle(http: httpx.AsyncClient, urls: Sequence[str]) -> None:
    """Wait for the workers to go idle, then empty their prefix caches where they allow it."""
    await idle(http, urls)
    for url in urls:
        with contextlib.suppress(httpx.HTTPError):
            await http.post(f"{url}/reset_prefix_cache", timeout=10)


async def forget_index(worker_ids: Sequence[int]) -> None:
    """Empty the scheduler's index of the workers, as their caches were emptied: each side
    starts from nothing (an index estimated from what was sent would otherwise keep the last
    side's blocks, which no request of this side can use)."""
    from chatsite.redis import async_redis
    from inference.scheduler.prefix import index_key

    redis = async_redis()
    try:
        await redis.delete(*(index_key(w) for w in worker_ids))
    finally:
        await redis.aclose()


async def index_against_caches(
    http: httpx.AsyncClient, urls: Sequence[str], worker_ids: Sequence[int]
) -> Agreement:
    """Once the workers are idle, the scheduler's index against the emulated workers' true
    caches, read until two readings `EVENTS_SETTLE_S` apart agree (the last KV events may
    still be on their way to the index)."""
    from chatsite.redis import async_redis

    await idle(http, urls)
    redis = async_redis()
    try:
        found = await agreement(http, urls, worker_ids, redis)
        for _ in range(EVENTS_SETTLE_TRIES):
            await asyncio.sleep(EVENTS_SETTLE_S)
            again = await agreement(http, urls, worker_ids, redis)
            if again == found:
                break
            found = again
        return found
    finally:
        await redis.aclose()


def oracle_hit_rate(
    trace: list[Conversation], results: list[Answer], system_texts: list[str], args: Any
) -> float:
    """The share of prompt tokens one cache of unlimited size would have held: every full
    block of every prompt sent and answer produced before, in the workers' block size."""
    by_conversation: dict[int, list[Answer]] = {}
    for answer in results:
        by_conversation.setdefault(answer.conversation, []).append(answer)
    turns = []
    # Replayed in the order the side sent them.
    for sent in sorted(results, key=lambda a: a.sent_at):
        answers = sorted(by_conversation[sent.conversation], key=lambda a: a.turn)
        texts = [a.text for a in answers[: sent.turn + 1]]
        turns.append((trace[sent.conversation], sent.turn, texts))
    hits, queries = oracle_replay(turns, system_texts, args.block_size)
    return hits / queries if queries else 0.0


def oracle_replay(
    turns: Sequence[tuple[Conversation, int, Sequence[str]]],
    system_texts: Sequence[str],
    block_size: int,
) -> tuple[int, int]:
    """Prompt tokens found in one unlimited cache, and prompt tokens, over `turns` in order:
    each a conversation, the turn, and the answers' texts up to and including the turn's own
    (which is cached after the turn, as the worker keeps it)."""
    from django.conf import settings

    from inference import prompts as rendering
    from inference.scheduler.prefix import MemoryIndex, block_hashes

    folder = str(settings.MODEL_DIR)
    oracle = MemoryIndex()  # one worker, never forgetting (capacity 0)
    hits = queries = 0
    for conversation, turn, texts in turns:
        messages = [{"role": "system", "content": system_texts[conversation.system]}]
        for number in range(turn):
            messages.append({"role": "user", "content": conversation.questions[number]})
            messages.append({"role": "assistant", "content": texts[number]})
        messages.append({"role": "user", "content": conversation.questions[turn]})
        ids = rendering.token_ids(folder, messages)
        hashes = block_hashes(ids, block_size)
        (cached,) = oracle.matched_blocks([0], hashes)
        hits += cached * block_size
        queries += len(ids)
        oracle.record(0, hashes, capacity=0, now_ms=0)
        answer_ids = rendering.token_ids(
            folder,
            [*messages, {"role": "assistant", "content": texts[turn]}],
            add_generation_prompt=False,
        )
        oracle.record(0, block_hashes(answer_ids, block_size), capacity=0, now_ms=0)
    return hits, queries


def capacity(args: Any, workers: int) -> tuple[float, float]:
    """The emulated fleet's capacity for this trace, in answers per second (its durations
    scaled), and the prompt tokens a turn reads uncached that it assumes: each worker at
    full batch (`Profile.answers_per_s`), every turn reading only what one unlimited cache
    would not hold (the oracle's placement; answers of `--max-tokens` tokens)."""
    trace = make_trace(args)
    turns = sorted(
        ((c, t) for c in trace for t in range(args.turns)), key=lambda ct: (ct[0].start_s, ct[1])
    )
    answer = " ".join(["the"] * args.max_tokens)  # one token a word, as the emulator answers
    hits, queries = oracle_replay(
        [(c, t, [answer] * (t + 1)) for c, t in turns],
        system_prompts(args, "capacity"),
        args.block_size,
    )
    uncached = (queries - hits) / len(turns)
    per_worker = emulated_profile(args).answers_per_s(args.max_tokens, uncached)
    return workers * per_worker / args.time_scale, uncached


# What the fleet simulator predicts

# The live sides fleet_sim.py's policies stand for.
SIMULATED = {"sglang-router:cache_aware": "sglang", "predicted_ttft": "ours"}


def simulated_policy(side: str) -> str | None:
    """The fleet simulator's policy for a live side, if it has one."""
    if side in SIMULATED:
        return SIMULATED[side]
    kind, _, policy = side.partition(":")
    return SIMULATED.get(policy.partition("+")[0]) if kind in ("v1", "conversations") else None


def predict(
    trace: list[Conversation], system_texts: Sequence[str], args: Any, workers: int
) -> dict[str, Any]:
    """`benchmarks/fleet_sim.py` on this trace and the emulated fleet's profile, per policy a
    live side plays: its outcome. Each turn's prompt is the one the side sends, rendered and
    tokenized as the workers do, with answers of `--max-tokens` one-token words; the
    simulator models the workers alone (no edge, queue or router process in the way)."""
    from django.conf import settings

    from benchmarks import fleet_sim
    from inference import prompts as rendering

    folder = str(settings.MODEL_DIR)
    answer = " ".join(["the"] * args.max_tokens)
    conversations = []
    for conversation in trace:
        messages = [{"role": "system", "content": system_texts[conversation.system]}]
        questions, answers, said = [], [], 0
        for question in conversation.questions:
            messages.append({"role": "user", "content": question})
            prompt = rendering.token_ids(folder, messages)
            messages.append({"role": "assistant", "content": answer})
            whole = rendering.token_ids(folder, messages, add_generation_prompt=False)
            # The simulator's turn is the tokens said before it, then its question's: the
            # template keeps a conversation's earlier turns as they were (its prefix).
            questions.append(prompt[said:])
            answers.append(whole[len(prompt) : len(prompt) + args.max_tokens])
            said = len(prompt) + len(answers[-1])
        conversations.append(
            fleet_sim.Conversation(
                index=conversation.index,
                # The simulator's workers take "paid" turns first, as vLLM's priority does.
                tier="paid" if conversation.tier == "pro" else "free",
                system=[],
                questions=questions,
                answers=answers,
                thinks=[1000 * think for think in conversation.thinks],
                cancel_after=[None] * len(questions),
                start_ms=1000 * conversation.start_s,
            )
        )
    profile, scale = emulated_profile(args), args.time_scale
    model = fleet_sim.WorkerModel(
        step_ms=profile.step_ms * scale,
        step_ms_per_stream=profile.decode_ms_per_stream * scale,
        prefill_ms_per_token=profile.prefill_ms_per_token * scale,
        chunk_tokens=profile.max_batched_tokens,
        block_size=profile.block_size,
        num_blocks=profile.num_blocks,
        max_streams=profile.max_num_seqs,
    )
    # No horizon: every conversation plays to its end.
    options = argparse.Namespace(seed=args.seed, turns=args.turns, seconds=float("inf"))
    return {
        name: fleet_sim.simulate(
            name, fleet_sim.policy_for(name, model), conversations, workers, model, options
        )
        for name in sorted(set(SIMULATED.values()))
    }


def prediction_table(outcomes: list[Outcome], predicted: dict[str, Any]) -> str:
    """Each live side beside what the simulator predicted for its policy."""
    rows = []
    for outcome in outcomes:
        name = simulated_policy(outcome.side)
        if name is None:
            continue
        sim = predicted[name]
        live_hit, sim_hit = outcome.usage_hit_rate(), sim.hit_rate()
        simulated = [
            t.first_token_ms - t.arrival_ms for t in sim.turns if t.first_token_ms is not None
        ]
        live_p50, sim_p50 = outcome.ttft_ms(50), percentile(simulated, 50)
        rows.append(
            [
                outcome.side,
                name,
                f"{live_hit:.3f} / {sim_hit:.3f}",
                f"{sim_hit - live_hit:+.3f}",
                f"{live_p50:,.0f} / {sim_p50:,.0f}",
                f"{sim_p50 / live_p50:.2f}" if live_p50 else "-",
                f"{outcome.ttft_ms(99):,.0f} / {percentile(simulated, 99):,.0f}",
            ]
        )
    return render(
        [
            "side",
            "fleet_sim policy",
            "hit live / predicted",
            "hit error",
            "TTFT p50 ms live / predicted",
            "p50 predicted / live",
            "TTFT p99 ms live / predicted",
        ],
        rows,
    )


# CPU


@dataclass
class CpuUse:
    """CPU seconds spent while a side played its trace: by its routing processes (a peer
    router; the service's edge and scheduler) and by this machine's Postgres and Redis."""

    routing: float = 0.0
    stores: float = 0.0


def cpu_reading(processes: Sequence[Any]) -> CpuUse:
    routing = [pid for process in processes for pid in process_group(process.pid)]
    stores = [*pids_named("postgres"), *pids_named("redis-server")]
    return CpuUse(sum(map(cpu_seconds, routing)), sum(map(cpu_seconds, stores)))


def burner(fraction: float, log: Path) -> Any:
    """A process that keeps `fraction` of one core busy (in 10 ms slices), beside the workers:
    load of the kind the service's own processes put on the cores they share."""
    busy, idle = 0.01 * fraction, 0.01 * (1 - fraction)
    code = (
        "import time\n"
        "while True:\n"
        "    t = time.perf_counter()\n"
        f"    while time.perf_counter() - t < {busy}: pass\n"
        f"    time.sleep({idle})\n"
    )
    return start([sys.executable, "-c", code], log, dict(os.environ))


# Sides


def router_command(name: str, policy: str, urls: list[str], port: int, venv: Path) -> list[str]:
    if name == "vllm-router":
        return [
            str(venv / "bin" / "vllm-router"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--policy",
            policy,
            "--worker-urls",
            *urls,
        ]
    if name == "sglang-router":
        return [
            str(venv / "bin" / "python"),
            "-m",
            "sglang_router.launch_router",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--policy",
            policy,
            "--worker-urls",
            *urls,
        ]
    raise SystemExit(f"unknown router {name!r}")


@dataclass
class Outcome:
    side: str
    kind: str  # the side's: "router", "v1" or "conversations"
    answers: list[Answer]
    wall: float
    hit_rate: float
    per_worker: list[int]
    fitted: list[str] = field(default_factory=list)
    prompts: list[str] = field(default_factory=list)
    oracle: float = 0.0
    inside_vllm: dict[str, float] = field(default_factory=dict)
    cpu: CpuUse = field(default_factory=CpuUse)
    emulator_cpu: float | None = None  # CPU s of the emulated fleet's process meanwhile
    # The scheduler's index against the emulated workers' true caches, at the side's end.
    index: Agreement | None = None
    # What fleet_sim.py predicted for this trace on the emulated fleet, per policy.
    predicted: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> list[Answer]:
        return [a for a in self.answers if a.error is None and a.ttft is not None]

    def ttft_ms(self, q: float, tier: str | None = None) -> float:
        values = [a.ttft for a in self.ok if a.ttft is not None and tier in (None, a.tier)]
        return 1000 * percentile(values, q) if values else float("nan")

    def usage_hit_rate(self) -> float:
        """Cached over prompt tokens as each answer's usage reported them: counted once per
        request (vLLM's counters count a request again each time it waits for room)."""
        prompt = sum(a.prompt_tokens for a in self.ok)
        return sum(a.cached_tokens for a in self.ok) / prompt if prompt else 0.0

    def tokens_per_s(self) -> float:
        return sum(a.tokens for a in self.ok) / self.wall if self.wall else 0.0

    def goodput(self, target_s: float) -> float:
        """Answers whose first token came within `target_s`, per second of the side."""
        good = sum(1 for a in self.ok if a.ttft is not None and a.ttft <= target_s)
        return good / self.wall if self.wall else 0.0

    def traced(self) -> list[Answer]:
        return [a for a in self.ok if a.stages]


def stages_table(outcomes: list[Outcome]) -> str:
    """Per service side: each stage's p50 / p90 over its traced answers, in ms. An answer is
    traced only if its job was still there when its first text arrived (a short answer may be
    over by then): `traced` says how many were, `-` stands where none was."""
    rows = [
        [
            o.side,
            f"{len(o.traced())}/{len(o.ok)}",
            *(
                " / ".join(
                    f"{percentile([a.stages[stage] for a in o.traced()], q):,.0f}" for q in (50, 90)
                )
                if o.traced()
                else "-"
                for stage in STAGES
            ),
        ]
        for o in outcomes
        if o.kind != "router"
    ]
    return render(["side", "traced", *(f"{stage} p50/p90" for stage in STAGES)], rows)


async def play(
    side: Side, trace: list[Conversation], args: Any, urls: list[str], processes: Sequence[Any]
) -> Outcome:
    from chatsite.redis import async_redis

    prompts = system_prompts(args, secrets.token_hex(4))
    if args.stages and side.kind != "router":
        side.redis = async_redis()
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), headers=side.headers) as client:
        await settle(client, urls)
        if args.emulated:
            await forget_index(args.worker_ids)
        before = await counters(client, urls)
        cpu_before = cpu_reading(processes)
        clock = time.perf_counter()
        try:
            played = await asyncio.gather(
                *(converse(client, side, c, prompts, args, clock) for c in trace)
            )
        finally:
            if side.redis is not None:
                await side.redis.aclose()
                side.redis = None
        wall = time.perf_counter() - clock
        cpu_after = cpu_reading(processes)
        index = None
        if args.emulated and side.kind != "router":
            index = await index_against_caches(client, urls, args.worker_ids)
        await settle(client, urls)
        after = await counters(client, urls)
    queries = sum(a.queries - b.queries for a, b in zip(after, before, strict=True))
    hits = sum(a.hits - b.hits for a, b in zip(after, before, strict=True))
    requests = sum(a.requests - b.requests for a, b in zip(after, before, strict=True))
    return Outcome(
        side=side.name,
        kind=side.kind,
        answers=[answer for answers in played for answer in answers],
        wall=wall,
        prompts=prompts,
        hit_rate=hits / queries if queries else 0.0,
        per_worker=[int(a.requests - b.requests) for a, b in zip(after, before, strict=True)],
        cpu=CpuUse(cpu_after.routing - cpu_before.routing, cpu_after.stores - cpu_before.stores),
        index=index,
        # Means per request, in ms (preemptions: the count).
        inside_vllm={
            name: sum(a.sums[name] - b.sums[name] for a, b in zip(after, before, strict=True))
            * (1 if name == "preemptions" else 1000 / max(requests, 1))
            for name in VLLM_SUMS.values()
        },
    )


def fitted_speeds() -> list[str]:
    """What the scheduler fitted of each worker's speed (`TTFTFit`), as it stored it."""
    from inference.models import Worker
    from inference.selectors import worker_live_load

    found = []
    for worker in Worker.objects.order_by("id"):
        load = worker_live_load(worker_id=worker.id)
        if "ttft_base_ms" in load:
            found.append(
                f"{worker.name}: {load['ttft_base_ms']:.0f} ms + "
                f"{load['ttft_ms_per_token']:.3f} ms/token + "
                f"{load['ttft_ms_per_stream']:.1f} ms/stream"
            )
    return found


def follow_kv_events(endpoints: list[str]) -> None:
    """Name (or clear) the workers' KV event endpoints, in `--workers` order, for a side's
    scheduler to follow; the replay socket is on the next port."""
    from inference.models import Worker

    workers = list(Worker.objects.order_by("id"))
    for index, worker in enumerate(workers):
        endpoint = endpoints[index] if index < len(endpoints) else ""
        host, _, port = endpoint.rpartition(":")
        worker.kv_events_endpoint = endpoint
        worker.kv_events_replay_endpoint = f"{host}:{int(port) + 1}" if endpoint else ""
        worker.save(update_fields=["kv_events_endpoint", "kv_events_replay_endpoint"])


def run_side(name: str, args: Any, urls: list[str], trace: list[Conversation], key: str) -> Outcome:
    from django.conf import settings

    kind, _, policy = name.partition(":")
    policy, _, events = policy.partition("+")
    follow_kv_events(args.kv_events if events == "events" else [])
    logs = Path(tempfile.mkdtemp(prefix="router-race-"))
    port = free_port()
    processes = []
    nice = ["nice", "-n", str(args.nice)] if args.nice else []
    try:
        if kind in ("vllm-router", "sglang-router"):
            command = [*nice, *router_command(kind, policy, urls, port, args.routers_venv)]
            processes.append(start(command, logs / f"{kind}.log", service_env()))
            side = Side(name, "router", f"http://127.0.0.1:{port}", args.served_model)
            if args.paid:
                side.priorities = dict(settings.INFERENCE_TIER_PRIORITY)
            wait_up(f"{side.base_url}/v1/models", processes[0], logs / f"{kind}.log")
        elif kind in ("v1", "conversations"):
            env = {**service_env(), "SCHEDULER_PLACEMENT": policy}
            processes.append(start([*nice, *edge_command(port)], logs / "edge.log", env))
            processes.append(
                start(
                    [
                        *nice,
                        sys.executable,
                        "manage.py",
                        "run_scheduler",
                        "--replica-id",
                        f"race-{policy}",
                    ],
                    logs / "scheduler.log",
                    env,
                )
            )
            side = Side(
                name,
                kind,
                f"http://127.0.0.1:{port}",
                settings.DEFAULT_MODEL,
                {"Authorization": f"Bearer {key}"},
                {"Authorization": f"Bearer {args.free_key}"} if args.paid else {},
            )
            wait_up(f"{side.base_url}/v1/models", processes[0], logs / "edge.log")
        else:
            raise SystemExit(f"unknown side {name!r}")
        routing = list(processes)
        if args.burn:
            processes.append(burner(args.burn, logs / "burn.log"))
        outcome = asyncio.run(play(side, trace, args, urls, routing))
        if kind in ("v1", "conversations"):
            outcome.fitted = fitted_speeds()
    finally:
        for process in processes:
            stop(process)
    print(
        f"{name}: hit {outcome.hit_rate:.3f}, TTFT p50 {outcome.ttft_ms(50):.0f} ms, "
        f"{len(outcome.ok)}/{len(outcome.answers)} ok (logs in {logs})",
        flush=True,
    )
    return outcome


def table(outcomes: list[Outcome], target_s: float) -> str:
    rows = [
        [
            o.side,
            f"{o.hit_rate:.3f}",
            f"{o.usage_hit_rate():.3f}",
            f"{o.oracle:.3f}",
            f"{o.usage_hit_rate() / o.oracle:.2f}" if o.oracle else "-",
            f"{o.ttft_ms(50):,.0f}",
            f"{o.ttft_ms(99):,.0f}",
            f"{o.tokens_per_s():.1f}",
            f"{o.goodput(target_s):.2f}",
            f"{sum(a.prompt_tokens for a in o.ok) / max(len(o.ok), 1):.0f}",
            " / ".join(str(n) for n in o.per_worker),
            str(len(o.answers) - len(o.ok)),
            " / ".join(f"{o.inside_vllm.get(k, 0):,.0f}" for k in ("ttft", "queue", "prefill")),
            f"{o.inside_vllm.get('preemptions', 0):.0f}",
            f"{o.cpu.routing:.1f} / {o.cpu.stores:.1f}"
            + ("" if o.emulator_cpu is None else f" / {o.emulator_cpu:.1f}"),
        ]
        for o in outcomes
    ]
    headers = ["side", "prefix hit (vLLM)", "(usage)", "oracle", "of oracle"]
    headers += ["TTFT p50 ms", "TTFT p99 ms"]
    return render(
        [
            *headers,
            "out tok/s",
            "goodput/s",
            "prompt tokens",
            "requests per worker",
            "errors",
            "vLLM mean TTFT / queue / prefill ms",
            "preemptions",
            "CPU s routing / stores (/ emulator)",
        ],
        rows,
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="", help="comma-separated worker URLs")
    add_arguments(parser)
    parser.add_argument(
        "--ttft-target", type=float, default=1.0, help="goodput counts first tokens within, s"
    )
    parser.add_argument("--sides", default=DEFAULT_SIDES)
    parser.add_argument("--conversations", type=int, default=40)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=4, help="shared system prompts")
    parser.add_argument("--system-tokens", type=int, default=530)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--think", type=float, default=1.0, help="mean think time, s")
    parser.add_argument("--rate", type=float, default=2.0, help="new conversations per s")
    parser.add_argument(
        "--load",
        default="",
        help="with --emulated: play the trace at each of these shares of the fleet's capacity "
        "(e.g. 0.5,0.9,1.2; `capacity` says how it is reckoned) instead of at --rate",
    )
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument(
        "--paid",
        type=float,
        default=0.0,
        help="this share of the conversations by pro users, the rest by free ones (0: every "
        "conversation by one pro user); the routers send vLLM each tier's priority",
    )
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="run every side's routing processes (a peer router; the service's edge and "
        "scheduler) at this niceness, e.g. -10 to put them ahead of workers that share their "
        "cores, as on a router host of their own",
    )
    parser.add_argument(
        "--kv-events",
        default="",
        help="the workers' KV event endpoints (run_worker --kv-events-port), in --workers "
        "order, e.g. tcp://127.0.0.1:5561,tcp://127.0.0.1:5563: a side named v1:<policy>+events "
        "has its scheduler follow them instead of estimating the caches",
    )
    parser.add_argument(
        "--burn",
        type=float,
        default=0.0,
        help="keep this share of one core busy during every side (0-1): how much the workers "
        "slow down under load of the kind the service's processes add",
    )
    parser.add_argument(
        "--stages",
        action="store_true",
        help="trace where each service answer's first-token time went (latency.py's stages: "
        "the job's timestamps and stream ids, read from the service's Redis at the first text)",
    )
    parser.add_argument("--routers-venv", type=Path, default=ROOT / ".venv-routers")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.load and not args.emulated:
        raise SystemExit("--load needs --emulated: the capacity is reckoned from its profile")
    fleet = start_for(args)
    if fleet is not None:
        args.kv_events = ",".join(fleet.kv_events)
    try:
        return race(args, fleet)
    finally:
        if fleet is not None:
            fleet.stop()


def race(args: argparse.Namespace, fleet: Fleet | None) -> int:
    urls = [u.strip().rstrip("/") for u in args.workers.split(",") if u.strip()]
    if not urls:
        raise SystemExit("Name the workers (--workers URL,URL) or start some (--emulated N).")
    args.kv_events = [e.strip() for e in args.kv_events.split(",") if e.strip()]
    if "+events" in args.sides and len(args.kv_events) != len(urls):
        raise SystemExit("a +events side needs --kv-events with one endpoint per worker")
    django_start(database_url=DEFAULT_DATABASE_URL, redis_url=DEFAULT_REDIS_URL)
    prepare_stores()
    from django.conf import settings
    from django.db import connections

    from chatsite.catalog import catalog_changed
    from inference.client import parse_metrics
    from inference.models import ModelPool, Worker

    args.served_model = httpx.get(f"{urls[0]}/v1/models", timeout=10).json()["data"][0]["id"]
    args.block_size = parse_metrics(httpx.get(f"{urls[0]}/metrics", timeout=10).text).block_size
    key = prepare(urls, args.served_model)
    args.free_key = bench_key(tier="free") if args.paid else ""
    args.worker_ids = [Worker.objects.get(url=url).id for url in urls]
    # The conversation API has no max_tokens of its own: the pool's cap sets its answers'.
    ModelPool.objects.filter(name=settings.DEFAULT_MODEL).update(max_output_tokens=args.max_tokens)
    catalog_changed()
    connections.close_all()

    levels: list[float | None] = [None]
    planned = ""
    if args.load:
        levels = [float(level) for level in args.load.split(",")]
        answers_per_s, uncached = capacity(args, len(urls))
        planned = (
            f"\nloads: x capacity, {answers_per_s:.1f} answers/s for this trace on this fleet "
            f"(each worker at a full batch of {emulated_profile(args).max_num_seqs}, every turn "
            f"reading only the {uncached:.0f} prompt tokens one unlimited cache would not hold)"
        )
    played = []
    for level in levels:
        if level is not None:
            args.rate = level * answers_per_s / args.turns
        played.append((level, args.rate, play_sides(args, urls, key, fleet)))
    loads = [parse_metrics(httpx.get(f"{u}/metrics", timeout=10).text) for u in urls]
    target = args.ttft_target * (args.time_scale if fleet is not None else 1.0)
    rates = (
        f"{args.rate} new conversations/s"
        if not args.load
        else "new conversations/s per load below"
    )
    facts = (
        f"router race: {args.conversations} conversations x {args.turns} turns, "
        f"{args.prompts} shared system prompts of ~{args.system_tokens} tokens, "
        f"max_tokens {args.max_tokens}, think {args.think} s, {rates}, "
        f"seed {args.seed}"
        + (f", routing processes at niceness {args.nice}" if args.nice else "")
        + (f", {args.burn:.2f} of a core kept busy beside the workers" if args.burn else "")
        + "\nworkers: "
        + ", ".join(
            f"{u} (block {load.block_size}, {load.num_gpu_blocks} blocks)"
            for u, load in zip(urls, loads, strict=True)
        )
        + "\noracle: the hit rate of one unlimited cache holding every block sent before, "
        "replaying the side's own prompts and answers"
        + (
            f"\n{describe(args)}; their KV events followed by the +events sides"
            if fleet is not None
            else ""
        )
        + planned
        + f"\ngoodput: answers with a first token within {args.ttft_target:g} s"
        + (
            f" (x{args.time_scale:g}: {args.ttft_target * args.time_scale:g} s)"
            if fleet and args.time_scale != 1
            else ""
        )
        + ", per second of the side"
    )
    report = facts
    for level, rate, outcomes in played:
        if level is not None:
            report += (
                f"\n\n== load {level:g}x capacity: {rate:.2f} new conversations/s "
                f"({rate * args.turns:.1f} answers/s)"
            )
        report += "\n\n" + level_report(outcomes, args, target)
    print(report)
    out = write_result(args.results, "router_race", report)
    print(f"\nwritten to {out}")
    return 0


def tiers_table(outcomes: list[Outcome]) -> str:
    """`--paid`: each side's first-token times per tier, and its errors per tier."""
    rows = [
        [
            o.side,
            *(
                f"{o.ttft_ms(50, tier):,.0f} / {o.ttft_ms(99, tier):,.0f} "
                f"({sum(a.tier == tier for a in o.ok)} ok, "
                f"{sum(a.tier == tier and a.error is not None for a in o.answers)} errors)"
                for tier in ("pro", "free")
            ),
        ]
        for o in outcomes
    ]
    return render(["side", "pro TTFT p50 / p99 ms", "free TTFT p50 / p99 ms"], rows)


def play_sides(
    args: argparse.Namespace, urls: list[str], key: str, fleet: Fleet | None
) -> list[Outcome]:
    """Every side plays the trace `args` make, in turn."""
    trace = make_trace(args)
    outcomes = []
    for name in args.sides.split(","):
        before = process_cpu_seconds(urls[0]) if fleet is not None else 0.0
        outcome = run_side(name.strip(), args, urls, trace, key)
        if fleet is not None:
            outcome.emulator_cpu = process_cpu_seconds(urls[0]) - before
        outcomes.append(outcome)
    for outcome in outcomes:
        outcome.oracle = oracle_hit_rate(trace, outcome.ok, outcome.prompts, args)
    if fleet is not None and any(simulated_policy(o.side) for o in outcomes):
        predicted = predict(trace, outcomes[0].prompts, args, len(urls))
        for outcome in outcomes:
            outcome.predicted = predicted
    return outcomes


def level_report(outcomes: list[Outcome], args: argparse.Namespace, target: float) -> str:
    """The table of one load, with what the scheduler fitted and knew, and `--stages`."""
    speeds = [f"{o.side}: {'; '.join(o.fitted)}" for o in outcomes if o.fitted]
    indexes = [f"{o.side}: {o.index.describe()}" for o in outcomes if o.index is not None]
    report = table(outcomes, target)
    if args.paid:
        report += (
            f"\n\nper tier ({args.paid:.0%} of the conversations by pro users; the routers pass "
            "on the priority the service gives each tier):\n" + tiers_table(outcomes)
        )
    if speeds:
        report += "\n\nworkers' speed as the scheduler fitted it:\n" + "\n".join(speeds)
    if indexes:
        report += (
            "\n\nthe scheduler's index against the emulated workers' true caches at each side's "
            "end (agreement: blocks both name over blocks either names; blocks whose ancestor "
            "was evicted, which no request reaches, left out):\n" + "\n".join(indexes)
        )
    predicted = next((o.predicted for o in outcomes if o.predicted), None)
    if predicted:
        report += (
            "\n\nwhat benchmarks/fleet_sim.py predicted for the same trace on the same "
            "profile, its policy standing for each side (hit: cached over prompt tokens, "
            "as the answers' usage says):\n" + prediction_table(outcomes, predicted)
        )
    if args.stages:
        report += (
            "\n\nwhere the service's first-token time went (ms; latency.py's stages; "
            "for the conversation API, `to client` includes the POST's answer and the stream's "
            f"opening where the first text came before them):\n{stages_table(outcomes)}"
        )
    return report


if __name__ == "__main__":
    raise SystemExit(main())
