"""Rolling summaries: prompt tokens per turn over a long conversation, and vLLM's prefix cache.

One conversation of N turns (default 100) is played twice against one real vLLM worker,
through the service's own code: `conversations.turns.turn_send` (context assembly, the job
queued in Redis), the job's prompt sent to the worker with the inference client (max_tokens
small), `inference.services.generation_finish`. The pool's context window is made small
(default 1024) so the history overflows it within the first 20-odd turns.

- without summaries: the window slides, oldest turns dropped (no summary is ever written);
- with summaries: whenever assembly drops turns that no summary covers, the summary is
  written before the next turn (`conversations.summaries.branch_summarise`, what the Celery
  task runs, called inline so every run is the same), and later prompts carry it.

Per mode: prompt tokens per turn (vLLM's count), the summariser's own prompt and output
tokens (the price of summaries), and the prefix-cache hit rate from each answer's usage
(`prompt_tokens_details.cached_tokens` / `prompt_tokens`; per request, so other traffic on a
shared worker does not blur it). Each mode's system prompt starts with a fresh random tag, so
neither finds blocks the other (or an earlier run) left in the cache.

Run it (the worker must be a vLLM started by `manage.py run_worker`, which reports cached
tokens):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/chatsite_bench \\
    REDIS_URL=redis://127.0.0.1:6379/9 SECRET_KEY=x \\
    .venv/bin/python benchmarks/summaries.py --worker http://127.0.0.1:8101 --turns 100

It uses its own database (created and migrated if missing; the name must contain "bench") and
its own Redis database (never db 0; flushed at start), prints one table and writes it to
benchmarks/results/summaries-<UTC date-time>.txt.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chatsite.redis import sync_redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import (
    django_start,
    percentile,
    prepare_stores,
    render,
    write_result,
)

BASE_DIR = Path(__file__).resolve().parent.parent
RESULTS_DIR = BASE_DIR / "benchmarks" / "results"
TOPICS = [
    "sourdough starters",
    "rye flour",
    "baking stones",
    "oven temperatures",
    "croissant lamination",
    "proofing baskets",
    "steam in the oven",
    "whole wheat",
    "salt in bread",
    "cooling racks",
]


@dataclass
class Mode:
    """One play of the conversation and what each turn cost."""

    name: str
    prompt_tokens: list[int] = field(default_factory=list)
    cached_tokens: list[int] = field(default_factory=list)
    summary_calls: int = 0
    summary_prompt_tokens: int = 0
    summary_output_tokens: int = 0
    seconds: float = 0.0


def bootstrap() -> None:
    django_start()
    from django.conf import settings

    settings.INFERENCE_WORKERS = []


async def _ask(url: str, model: str, messages: list[dict[str, Any]], max_tokens: int) -> Any:
    from inference.client import get_client

    client = get_client()
    text, usage = "", None
    try:
        async for chunk in client.stream_chat(
            base_url=url, model=model, messages=messages, max_tokens=max_tokens, priority=0
        ):
            text += chunk.text
            usage = chunk.usage or usage
    finally:
        await client.aclose()
    return text, usage or {}


def _count_summary_calls(mode: Mode) -> Any:
    """Wrap the summariser's worker call to add its usage to `mode`."""
    from conversations import small_model

    original = small_model._ask

    async def counted(worker: Any, pool: Any, messages: Any, **kw: Any) -> str:
        text, usage = await _ask(worker.url, pool.served_model, messages, kw["max_tokens"])
        mode.summary_calls += 1
        mode.summary_prompt_tokens += int(usage.get("prompt_tokens") or 0)
        mode.summary_output_tokens += int(usage.get("completion_tokens") or 0)
        return str(text)

    small_model._ask = counted
    return original


def play(args: argparse.Namespace, *, summaries: bool) -> Mode:
    from django.conf import settings
    from django.contrib.auth.models import User

    from accounts.tests.factories import UserFactory
    from billing.tests.factories import subscribe
    from conversations import small_model
    from conversations.services import conversation_create
    from conversations.summaries import branch_summarise, summary_pending_key, summary_release
    from conversations.turns import turn_send
    from inference import queue
    from inference.models import ModelPool, Worker
    from inference.services import generation_finish
    from plugins.models import PluginConfig
    from plugins.registry import get_registry

    settings.SUMMARY_MAX_TOKENS = args.summary_max_tokens
    # Tools would take the small window: this measures the conversation's own tokens.
    for slug in get_registry().plugins:
        PluginConfig.objects.update_or_create(slug=slug, defaults={"enabled": False})
    tag = secrets.token_hex(4)
    pool = ModelPool.objects.create(
        name=f"bench-{tag}",
        served_model=args.served_model,
        context_window=args.context_window,
        max_output_tokens=args.max_tokens,
    )
    Worker.objects.filter(url=args.worker).delete()
    Worker.objects.create(pool=pool, name=f"bench-{tag}", url=args.worker, state="healthy")
    user: User = UserFactory.create(username=f"bench-{tag}")
    subscribe(user, slug=f"bench-{tag}", tier="plus", max_output_tokens=args.max_tokens)
    conversation = conversation_create(
        owner=user,
        model=pool.name,
        title="Benchmark",  # no title task
        system_prompt=f"Session {tag}. You are a baker's assistant. Answer in one short sentence.",
    )
    mode = Mode("with summaries" if summaries else "without summaries")
    original = _count_summary_calls(mode)
    redis = sync_redis()
    started = time.monotonic()
    try:
        for index in range(args.turns):
            topic = TOPICS[index % len(TOPICS)]
            content = f"Question {index + 1}: what is one thing to know about {topic}?"
            turn = turn_send(user=user, conversation=conversation, content=content)
            messages = json.loads(str(redis.hget(queue.job_key(turn.generation.id), "messages")))
            text, usage = asyncio.run(
                _ask(args.worker, args.served_model, messages, args.max_tokens)
            )
            details = usage.get("prompt_tokens_details") or {}
            mode.prompt_tokens.append(int(usage.get("prompt_tokens") or 0))
            mode.cached_tokens.append(int(details.get("cached_tokens") or 0))
            generation_finish(
                generation_id=turn.generation.id,
                status="complete",
                text=text or "(no answer)",
                prompt_tokens=usage.get("prompt_tokens"),
                output_tokens=usage.get("completion_tokens"),
                cached_tokens=details.get("cached_tokens"),
            )
            # The Celery task's work, inline: only when assembly asked for a summary.
            if redis.exists(summary_pending_key(conversation.pk)):
                if summaries:
                    branch_summarise(
                        conversation_id=conversation.pk,
                        leaf_message_id=turn.assistant_message.parent_id,
                        budget_tokens=args.context_window - args.max_tokens,
                    )
                summary_release(conversation_id=conversation.pk)
            if (index + 1) % 10 == 0:
                print(f"  {mode.name}: {index + 1} turns", file=sys.stderr, flush=True)
    finally:
        small_model._ask = original
        redis.close()
    mode.seconds = time.monotonic() - started
    return mode


def table(modes: Sequence[Mode], args: argparse.Namespace) -> str:
    headers = [
        "mode",
        "prompt tok/turn mean",
        "p50",
        "max",
        "last 20 mean",
        "total prompt tok",
        "cache hit %",
        "last 20 hit %",
        "summaries",
        "summariser tok in/out",
        "seconds",
    ]
    rows = []
    for mode in modes:
        total, cached = sum(mode.prompt_tokens), sum(mode.cached_tokens)
        last, last_cached = sum(mode.prompt_tokens[-20:]), sum(mode.cached_tokens[-20:])
        rows.append(
            [
                mode.name,
                f"{total / len(mode.prompt_tokens):.0f}",
                f"{percentile(mode.prompt_tokens, 50):.0f}",
                str(max(mode.prompt_tokens)),
                f"{last / len(mode.prompt_tokens[-20:]):.0f}",
                str(total),
                f"{100 * cached / total:.1f}" if total else "-",
                f"{100 * last_cached / last:.1f}" if last else "-",
                str(mode.summary_calls),
                f"{mode.summary_prompt_tokens}/{mode.summary_output_tokens}",
                f"{mode.seconds:.0f}",
            ]
        )
    note = (
        f"{args.turns} turns, context window {args.context_window}, max_tokens {args.max_tokens}, "
        f"summary max_tokens {args.summary_max_tokens}, worker {args.worker}"
    )
    per_turn = ["turn  " + "  ".join(f"{m.name}: prompt/cached" for m in modes)]
    for index in range(0, args.turns, 10):
        cells = [f"{m.prompt_tokens[index]}/{m.cached_tokens[index]}" for m in modes]
        per_turn.append(f"{index + 1:>4}  " + "  ".join(f"{c:>24}" for c in cells))
    return "\n".join([note, "", render(headers, rows), "", *per_turn])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", required=True, help="base URL of a running vLLM worker")
    parser.add_argument("--served-model", default="smollm2-135m")
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--context-window", type=int, default=1024)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--summary-max-tokens", type=int, default=128)
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    bootstrap()
    prepare_stores()
    modes = [play(args, summaries=False), play(args, summaries=True)]
    output = table(modes, args)
    print(output)
    path = write_result(args.results_dir, "summaries", output)
    print(f"\nwritten to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
