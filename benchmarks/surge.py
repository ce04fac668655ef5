"""A surge of free and paid sends at once, past what the workers can hold: who waits, who is
served, and what the paid tier's first token costs against its unloaded value.

Per side (a setting of `SCHEDULER_TIER_SHARE`, the share of a worker each tier may fill):

1. Unloaded: `--unloaded` pro sends, one at a time, on idle workers: the paid TTFT a surge
   is measured against.
2. Pro alone: the surge's `--pro` sends, as one burst on idle workers with no free answer
   anywhere: what the paid burst costs itself, so that what the free surge adds to it can be
   told apart.
3. Surge: `--free` free sends, and `--pro-after` seconds later `--pro` pro sends, each burst
   as fast as the service takes it (eight sends at a time), through the real service code
   (`conversations.turns.turn_send`, the Redis queue, an in-process scheduler replica, the
   workers). Each worker takes `--concurrency` answers, so the surge is several times what
   the fleet holds. `--cancel` of the free answers are cancelled by their users a
   second after the surge, wherever they are by then (those already answered stay answered).

TTFT is the generation's first token time minus its enqueue time, as the scheduler records
them. Reported per tier: TTFT p50/p99, what ended how (`refused`: a new conversation the
overload policy turned away with 429 `high_demand` while the tier's queue was long), the
longest line a waiting answer was told about (its queue position), and the paid p99 over
its unloaded p99 (the issue's target: at most 2) and over the p99 of the pro burst alone.
For the cancelled answers: how many had reached a worker (the others cost the workers
nothing) and the output tokens the workers spent on them.

With `--heavy H`, the free sends come from `--light-users` users sending the same number each
and one heavy user sending H times as many, in a random order; the report then says how the
fair queue (`inference.queue`: start-time fair queuing by tokens, as VTC) shared the tier:
while every other free user still had an answer waiting, the tokens each was admitted, and the
heavy user's lead over the least served against VTC's bound (twice one request's cost).

The sides: `even` (every tier may fill the whole worker: admission as before tier shares),
`tiered` (the defaults: free 0.75, plus 1.0, pro 1.25) and `wide` (pro up to twice the
worker), alternated per `--rounds`.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/chatsite_surge_bench \\
    REDIS_URL=redis://127.0.0.1:6379/6 SECRET_KEY=x \\
    .venv/bin/python benchmarks/surge.py --workers http://127.0.0.1:8201,http://127.0.0.1:8202

The workers are started beforehand (`manage.py run_worker --port P --cpus N`). It prints one
table and writes it to benchmarks/results/surge-<UTC date-time>.txt.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import secrets
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import (  # noqa: E402
    django_start,
    percentile,
    prepare_stores,
    render,
    write_result,
)
from benchmarks.emulator.launch import add_arguments, describe, start_for  # noqa: E402
from benchmarks.scheduler_affinity import QUESTIONS, SYSTEM_HEAD  # noqa: E402

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/chatsite_surge_bench"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/6"
SIDES = {
    "even": {"pro": 1.0, "plus": 1.0, "free": 1.0},
    "tiered": {"pro": 1.25, "plus": 1.0, "free": 0.75},
    # Pro may take twice the worker: what more headroom buys the paid tier on CPU workers.
    "wide": {"pro": 2.0, "plus": 1.25, "free": 0.75},
}


@dataclass
class TierOutcome:
    ttft_ms: list[float] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    longest_line: int = 0


@dataclass
class Outcome:
    side: str
    round: int
    unloaded_ms: list[float]
    tiers: dict[str, TierOutcome]
    alone_ms: list[float] = field(default_factory=list)
    cancelled_reached: int = 0
    cancelled_waiting: int = 0
    cancelled_tokens: int = 0
    seconds: float = 0.0
    fairness: Fairness | None = None


@dataclass
class Fairness:
    """Within the free tier, one heavy user against the others, over `window_s` of the
    surge (`fairness`) in which every user had answers waiting: what each was admitted, in
    the tokens the fair queue counts (prompt and answer limit)."""

    window_s: float
    heavy_tokens: int
    others_tokens: list[int]
    largest_cost: int  # of one request admitted in the window
    heavy_sent: float  # the heavy user's share of the tier's sends
    heavy_served: float  # its share of the tokens admitted in the window

    @property
    def lead(self) -> int:
        """How far the heavy user got ahead of the least served other one, in tokens."""
        return self.heavy_tokens - min(self.others_tokens)

    @property
    def bound(self) -> int:
        """VTC's bound on the service difference of two users waiting all along: twice the
        largest cost of one request (Sheng et al., OSDI '24, theorem 4.4, for the
        start-tag queue the scheduler keeps)."""
        return 2 * self.largest_cost

    def describe(self) -> str:
        if not self.window_s:
            return "no free user had to wait once every send was queued: nothing to share"
        mean = sum(self.others_tokens) / len(self.others_tokens)
        return (
            f"the heavy user sent {self.heavy_sent:.0%} of the free sends and was admitted "
            f"{self.heavy_served:.0%} of the free tokens admitted in the {self.window_s:.1f} s "
            f"when every free user had answers waiting ({len(self.others_tokens)} others): "
            f"{self.heavy_tokens:,} tokens against the others' {min(self.others_tokens):,}-"
            f"{max(self.others_tokens):,} (mean {mean:,.0f}); its lead over the least served "
            f"{self.lead:,} tokens, VTC's bound {self.bound:,}: "
            + ("within" if self.lead <= self.bound else "OVER")
        )


def heavy_mix(
    heavy: Any, others: list[Any], total: int, times: float, rng: random.Random
) -> list[Any]:
    """Who sends each of `total` free sends: each of `others` the same number, `heavy` `times`
    as many, in a random order."""
    each = max(1, round(total / (len(others) + times)))
    senders = [user for user in others for _ in range(each)]
    senders += [heavy] * max(1, total - len(senders))
    rng.shuffle(senders)
    return senders


def row_cost(row: Any) -> int:
    """A generation's cost as the fair queue counts it: its prompt and its answer's limit."""
    return int(row.prompt_tokens or 0) + int(row.max_tokens)


def fairness(
    admitted: dict[str, list[tuple[float, int]]], *, heavy: str, heavy_sent: float, since: float
) -> Fairness:
    """`admitted`: per user, (seconds into the surge, cost) of each of its answers admitted;
    `since`: when the last of the tier's sends was queued. The window runs from then until
    the first of the other users had its last answer admitted: all along, every user had
    answers waiting (the setting of VTC's bound); before it, sends were still arriving and
    the first were admitted as they came."""
    others = [user for user in admitted if user != heavy]
    until = min(max((at for at, _ in admitted[user]), default=0.0) for user in others)
    inside = {
        user: [cost for at, cost in admitted[user] if since < at <= until] for user in admitted
    }
    total = sum(sum(costs) for costs in inside.values())
    return Fairness(
        window_s=max(0.0, until - since),
        heavy_tokens=sum(inside[heavy]),
        others_tokens=[sum(inside[user]) for user in others],
        largest_cost=max((cost for costs in inside.values() for cost in costs), default=0),
        heavy_sent=heavy_sent,
        heavy_served=sum(inside[heavy]) / total if total else 0.0,
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="", help="comma-separated vLLM worker URLs")
    add_arguments(parser)
    parser.add_argument("--sides", default="even,tiered", help=f"of {', '.join(SIDES)}")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--free", type=int, default=60)
    parser.add_argument("--pro", type=int, default=15)
    parser.add_argument("--pro-after", type=float, default=0.5, help="s after the free burst")
    parser.add_argument("--cancel", type=int, default=10, help="free answers cancelled")
    parser.add_argument(
        "--heavy",
        type=float,
        default=0.0,
        help="one free user sends this many times as many of the free sends as each of "
        "--light-users others (0: one free user sends them all); the report then says how "
        "the fair queue shared the tier among them",
    )
    parser.add_argument("--light-users", type=int, default=4)
    parser.add_argument(
        "--pressure-queued",
        type=int,
        default=None,
        help="SCHEDULER_PRESSURE_QUEUED for the run (free answers queued past which a new "
        "free conversation is refused with 429; 0: never): a larger value keeps every user's "
        "sends in the queue, where the fair queue shares the tier (default: the setting)",
    )
    parser.add_argument("--unloaded", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=8, help="answers per worker")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-queue", type=int, default=120, help="seconds an answer may wait")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args(argv)
    if not (args.workers or args.emulated):
        parser.error("name the workers (--workers URL,URL) or start some (--emulated N)")
    for side in args.sides.split(","):
        if side not in SIDES:
            parser.error(f"unknown side {side!r}")
    return args


def make_fleet(urls: list[str], model: str, args: argparse.Namespace, label: str) -> Any:
    from inference.models import ModelPool, Worker

    Worker.objects.filter(url__in=urls).delete()
    ModelPool.objects.filter(name__startswith="surge-").update(is_active=False)
    pool = ModelPool.objects.create(
        name=f"surge-{label}", served_model=model, max_output_tokens=args.max_tokens
    )
    for index, url in enumerate(urls):
        Worker.objects.create(
            pool=pool,
            name=f"{pool.name}-w{index}",
            url=url,
            state=Worker.State.HEALTHY,
            max_concurrency=args.concurrency,
        )
    return pool


def make_user(name: str, tier: str, max_tokens: int) -> Any:
    from django.contrib.auth.models import User

    from billing.models import Plan
    from billing.services import subscription_set

    user = User.objects.create_user(username=name)
    plan, _ = Plan.objects.get_or_create(
        slug=f"surge-{tier}",
        defaults={
            "name": f"Surge {tier}",
            "tier": tier,
            "monthly_price_micros": 0,
            "requests_per_minute": 100_000,
            "tokens_per_minute": 100_000_000,
            "max_concurrent": 1_000,
            "max_output_tokens": max_tokens,
            "message_cap": 1_000_000,
            "message_cap_window_seconds": 3_600,
        },
    )
    subscription_set(user=user, plan=plan)
    return user


def open_conversation(user: Any, pool: Any, system_prompt: str) -> Any:
    from conversations.services import conversation_create

    return conversation_create(owner=user, model=pool.name, system_prompt=system_prompt)


def send_in(user: Any, conversation: Any, question: str) -> str | None:
    """The send's generation id; None where the overload policy refused a new conversation
    (429 `high_demand`, while the tier's queue is long)."""
    from django.db import close_old_connections

    from chatsite.errors import ServiceError
    from conversations.turns import turn_send
    from inference.errors import ErrorCode

    try:
        return str(turn_send(user=user, conversation=conversation, content=question).generation.id)
    except ServiceError as exc:
        if exc.code != ErrorCode.HIGH_DEMAND.value:
            raise
        return None
    finally:
        close_old_connections()


def send(user: Any, pool: Any, system_prompt: str, question: str) -> str:
    gid = send_in(user, open_conversation(user, pool, system_prompt), question)
    if gid is None:
        raise SystemExit("a send on idle workers was refused for high demand")
    return gid


async def burst(sends: list[tuple[Any, str]], pool: Any, system_prompt: str) -> list[str | None]:
    """One send per (user, question), each in a new conversation of its user, as many at once
    as the service takes them (the conversations are opened beforehand); None for a refused
    send."""
    from asgiref.sync import sync_to_async

    conversations = [
        await sync_to_async(open_conversation)(user, pool, system_prompt) for user, _ in sends
    ]
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(max_workers=8) as pool_of_threads:
        sent = [
            loop.run_in_executor(pool_of_threads, send_in, user, conversation, question)
            for conversation, (user, question) in zip(conversations, sends, strict=True)
        ]
        return list(await asyncio.gather(*sent))


def accepted(sent: list[str | None]) -> list[str]:
    return [gid for gid in sent if gid is not None]


def cancel(generation_id: str) -> None:
    from inference import services
    from inference.models import Generation

    services.generation_cancel(generation=Generation.objects.get(pk=generation_id))


def rows_of(ids: list[str]) -> list[Any]:
    from inference.models import Generation

    return list(Generation.objects.filter(pk__in=ids))


def longest_line(generation_id: str) -> int:
    import json

    from chatsite.redis import sync_redis
    from inference import queue

    redis = sync_redis()
    try:
        entries: list[tuple[str, dict[str, str]]] = redis.xrange(  # type: ignore[assignment]
            queue.stream_key(generation_id)
        )
    finally:
        redis.close()
    positions = [
        json.loads(fields["data"])["position"]
        for _, fields in entries
        if fields["event"] == "queue"
    ]
    return max(positions, default=0)


def ttft_ms(row: Any) -> float | None:
    if row.first_token_at is None:
        return None
    return (row.first_token_at - row.enqueued_at).total_seconds() * 1000


async def wait_final(ids: list[str], *, within: float) -> None:
    from asgiref.sync import sync_to_async

    from inference.models import Generation

    async with asyncio.timeout(within):
        while True:
            left = await sync_to_async(
                Generation.objects.filter(pk__in=ids)
                .exclude(status__in=Generation.FINAL_STATUSES)
                .count
            )()
            if left == 0:
                return
            await asyncio.sleep(0.2)


async def run_side(
    side: str, round_: int, args: argparse.Namespace, urls: list[str], model: str
) -> Outcome:
    from asgiref.sync import sync_to_async
    from django.conf import settings
    from django.utils import timezone

    from inference.models import Generation
    from inference.scheduler import Scheduler

    settings.SCHEDULER_TIER_SHARE = SIDES[side]
    tag = secrets.token_hex(4)
    pool = await sync_to_async(make_fleet)(urls, model, args, f"{side}-{tag}")
    free_user = await sync_to_async(make_user)(f"surge-free-{tag}", "free", args.max_tokens)
    pro_user = await sync_to_async(make_user)(f"surge-pro-{tag}", "pro", args.max_tokens)
    rng = random.Random(args.seed + round_)
    free_senders = [free_user] * args.free
    others: list[Any] = []
    if args.heavy:
        others = [
            await sync_to_async(make_user)(f"surge-free{n}-{tag}", "free", args.max_tokens)
            for n in range(args.light_users)
        ]
        free_senders = heavy_mix(free_user, others, args.free, args.heavy, rng)
    # One system prompt per run and side, so no side finds another's blocks cached.
    system_prompt = f"Session {tag}. {SYSTEM_HEAD}"

    def question(index: int) -> str:
        return f"I am member {index}. {QUESTIONS[rng.randrange(len(QUESTIONS))]}"

    scheduler = Scheduler(replica_id=f"surge-{side}-{tag}")
    task = asyncio.create_task(scheduler.run())
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(60):
            while sum(v.load is not None for v in scheduler.workers.values()) < len(urls):
                if task.done():
                    await task
                    raise SystemExit("the scheduler stopped while starting")
                await asyncio.sleep(0.05)
        unloaded: list[str] = []
        for index in range(args.unloaded):
            gid = await sync_to_async(send)(pro_user, pool, system_prompt, question(index))
            await wait_final([gid], within=120)
            unloaded.append(gid)
        alone = accepted(
            await burst(
                [(pro_user, question(3000 + i)) for i in range(args.pro)], pool, system_prompt
            )
        )
        await wait_final(alone, within=args.max_queue + 600)
        started = loop.time()
        surge_began = timezone.now()
        free_sends = [(user, question(1000 + i)) for i, user in enumerate(free_senders)]
        pro_sends = [(pro_user, question(2000 + i)) for i in range(args.pro)]
        free_task = asyncio.create_task(burst(free_sends, pool, system_prompt))
        await asyncio.sleep(args.pro_after)
        pro_sent = await burst(pro_sends, pool, system_prompt)
        free_sent = await free_task
        pro, free = accepted(pro_sent), accepted(free_sent)
        await asyncio.sleep(1.0)
        cancelled = rng.sample(free, min(args.cancel, len(free)))
        for gid in cancelled:
            await sync_to_async(cancel)(gid)
        await wait_final(free + pro, within=args.max_queue + 600)
        seconds = loop.time() - started
    finally:
        scheduler.stop()
        await task
    outcome = Outcome(side=side, round=round_, unloaded_ms=[], tiers={}, seconds=seconds)
    if others:
        rows = await sync_to_async(rows_of)(free)
        outcome.fairness = fairness(
            {
                str(user.id): [
                    ((row.admitted_at - surge_began).total_seconds(), row_cost(row))
                    for row in rows
                    if row.user_id == user.id and row.admitted_at is not None
                ]
                for user in [free_user, *others]
            },
            heavy=str(free_user.id),
            heavy_sent=free_senders.count(free_user) / len(free_senders),
            since=max((row.enqueued_at - surge_began).total_seconds() for row in rows),
        )
    for ids, found in ((unloaded, outcome.unloaded_ms), (alone, outcome.alone_ms)):
        for row in await sync_to_async(rows_of)(ids):
            if (ms := ttft_ms(row)) is not None:
                found.append(ms)
    for tier, ids, sent in (("free", free, free_sent), ("pro", pro, pro_sent)):
        tier_outcome = outcome.tiers.setdefault(tier, TierOutcome())
        if refused := len(sent) - len(ids):
            tier_outcome.statuses["refused"] = refused
        for row in await sync_to_async(rows_of)(ids):
            tier_outcome.statuses[row.status] = tier_outcome.statuses.get(row.status, 0) + 1
            was_cancelled = row.status == Generation.Status.CANCELLED
            if not was_cancelled and (ms := ttft_ms(row)) is not None:
                tier_outcome.ttft_ms.append(ms)
            line = await sync_to_async(longest_line)(str(row.id))
            tier_outcome.longest_line = max(tier_outcome.longest_line, line)
            if was_cancelled:
                if row.admitted_at is None:
                    outcome.cancelled_waiting += 1
                else:
                    outcome.cancelled_reached += 1
                    outcome.cancelled_tokens += row.output_tokens or 0
    return outcome


def table(outcomes: list[Outcome]) -> str:
    headers = [
        "side",
        "round",
        "pro unloaded p50/p99",
        "pro alone p50/p99",
        "pro p50",
        "pro p99",
        "pro p99 / unloaded",
        "pro p99 / alone",
        "free p50",
        "free p99",
        "longest line",
        "pro ended",
        "free ended",
        "cancelled: waiting / reached (tokens)",
        "s",
    ]
    rows = []
    for o in outcomes:
        unloaded_p99 = percentile(o.unloaded_ms, 99)
        alone_p99 = percentile(o.alone_ms, 99)
        pro, free = o.tiers["pro"], o.tiers["free"]
        rows.append(
            [
                o.side,
                str(o.round),
                f"{percentile(o.unloaded_ms, 50):,.0f} / {unloaded_p99:,.0f}",
                f"{percentile(o.alone_ms, 50):,.0f} / {alone_p99:,.0f}",
                f"{percentile(pro.ttft_ms, 50):,.0f}",
                f"{percentile(pro.ttft_ms, 99):,.0f}",
                f"{percentile(pro.ttft_ms, 99) / unloaded_p99:.2f}",
                f"{percentile(pro.ttft_ms, 99) / alone_p99:.2f}",
                f"{percentile(free.ttft_ms, 50):,.0f}",
                f"{percentile(free.ttft_ms, 99):,.0f}",
                str(max(pro.longest_line, free.longest_line)),
                ended(pro.statuses),
                ended(free.statuses),
                f"{o.cancelled_waiting} / {o.cancelled_reached} ({o.cancelled_tokens})",
                f"{o.seconds:.0f}",
            ]
        )
    return render(headers, rows)


def ended(statuses: dict[str, int]) -> str:
    return " ".join(f"{name}={count}" for name, count in sorted(statuses.items()))


async def benchmark(args: argparse.Namespace) -> str:
    urls = [url.strip().rstrip("/") for url in args.workers.split(",") if url.strip()]
    async with httpx.AsyncClient(timeout=10) as http:
        response = await http.get(f"{urls[0]}/v1/models")
        response.raise_for_status()
        model = str(response.json()["data"][0]["id"])
    outcomes = []
    for round_ in range(1, args.rounds + 1):
        for side in args.sides.split(","):
            outcomes.append(await run_side(side, round_, args, urls, model))
            print(f"{side} round {round_} done", flush=True)
    header = (
        f"Surge: {args.free} free + {args.pro} pro sends at once on {len(urls)} worker(s) of "
        f"{args.concurrency} answers each, {args.max_tokens} tokens per answer, "
        f"{args.cancel} free cancelled after 1 s; TTFT in ms from enqueue (scheduler's record)."
        + (
            f"\nThe free sends: one heavy user {args.heavy:g} times as many as each of "
            f"{args.light_users} others, in a random order."
            if args.heavy
            else ""
        )
        + (f"\n{describe(args)}." if args.emulated else "")
        + (
            f"\nNew free conversations refused with 429 past {args.pressure_queued} queued "
            "(0: never)."
            if args.pressure_queued is not None
            else ""
        )
    )
    report = header + "\n\n" + table(outcomes)
    fair = [f"{o.side} {o.round}: {o.fairness.describe()}" for o in outcomes if o.fairness]
    if fair:
        report += "\n\nfairness within the free tier:\n" + "\n".join(fair)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    django_start(database_url=DEFAULT_DATABASE_URL, redis_url=DEFAULT_REDIS_URL)
    import logging

    from django.conf import settings

    settings.INFERENCE_WORKERS = []
    settings.SCHEDULER_MAX_QUEUE_SECONDS = args.max_queue
    if args.pressure_queued is not None:
        settings.SCHEDULER_PRESSURE_QUEUED = args.pressure_queued
    logging.getLogger("inference").setLevel(logging.WARNING)
    prepare_stores()
    fleet = start_for(args)
    try:
        text = asyncio.run(benchmark(args))
    finally:
        if fleet is not None:
            fleet.stop()
    print(text)
    path = write_result(Path(args.results), "surge", text)
    print(f"\nwritten to {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
