"""Reservations per second through billing's Lua path, and the latency billing adds to a POST.

Two questions, answered in one run against real Postgres and Redis:

1. Lua path. T threads call `billing.quota.reserve` (one script: RPM and TPM buckets, a
   message-cap window, a concurrency slot, the reservation record) and then `billing.quota.settle`
   (the refund script) in a loop for a few seconds. Two layouts: every thread its own user
   (keys spread out, as on a real site) and every thread the same user (one hot set of keys).
   Reported: reservations per second, and p50/p99 of one `reserve` call.
2. Message POST. `POST /api/v1/conversations/<id>/messages` through DRF's APIClient (the edge
   in-process, the real tokenizer, Postgres and Redis), alternating between the full path and
   the same path with billing's hooks stubbed out (plan lookups, the reservation, the per-IP
   abuse counter, the x-ratelimit-* headers). Reported: p50/p99 of both and of the time spent
   inside billing's own calls on the full path. Each POST gets a fresh conversation, and its
   generation is finished (untimed) so that slots never run out.

Run it:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/chatsite_bench_billing \\
    REDIS_URL=redis://127.0.0.1:6379/11 SECRET_KEY=x \\
    .venv/bin/python benchmarks/billing_reservations.py --posts 300

It uses its own database (created and migrated if missing; the name must contain "bench") and
its own Redis database (never db 0; flushed at start), prints one table and writes it to
benchmarks/results/billing_reservations-<UTC date-time>.txt.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn
from unittest import mock

# Run as a script (`python benchmarks/<name>.py`): the project root must be importable.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import django_start, percentile, prepare_stores, render, write_result

BASE_DIR = Path(__file__).resolve().parent.parent
RESULTS_DIR = BASE_DIR / "benchmarks" / "results"
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/chatsite_bench_billing"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/11"


def fail(message: str) -> NoReturn:
    print(message, file=sys.stderr)
    sys.exit(2)


def bootstrap() -> None:
    django_start(database_url=DEFAULT_DATABASE_URL, redis_url=DEFAULT_REDIS_URL)
    from django.conf import settings

    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    # The benchmark sends from one address far faster than a person: not abuse here.
    settings.BILLING_ABUSE_RATES = {**settings.BILLING_ABUSE_RATES, "message_post": "100000/m"}


# Statistics and tables


def ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f} ms"


def machine_facts() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    return (
        f"machine: {cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}; load average at start {load}"
    )


# 1. The Lua path


@dataclass
class LuaResult:
    layout: str
    threads: int
    reservations: int
    seconds: float
    latencies_ms: list[float]

    @property
    def per_second(self) -> float:
        return self.reservations / self.seconds


def lua_phase(*, threads: int, seconds: float, same_user: bool) -> LuaResult:
    from billing import quota

    limits = quota.Limits(
        requests_per_minute=10**9,
        tokens_per_minute=10**12,
        max_concurrent=10**6,
        message_cap=10**6,
        message_cap_window_ms=3 * 3600_000,
    )
    quota.client().ping()
    counts = [0] * threads
    latencies: list[list[float]] = [[] for _ in range(threads)]
    barrier = threading.Barrier(threads + 1)
    stop = threading.Event()

    def loop(index: int) -> None:
        user_id = 1_000_000 if same_user else 1_000_000 + index
        barrier.wait()
        while not stop.is_set():
            rid = str(uuid.uuid4())
            start = time.perf_counter()
            outcome = quota.reserve(
                user_id=user_id,
                pool_id=1,
                reservation_id=rid,
                prompt_tokens=200,
                tokens=712,
                limits=limits,
                now=quota.now_ms(),
            )
            latencies[index].append((time.perf_counter() - start) * 1000)
            if not outcome.admitted:
                raise RuntimeError(f"refused: {outcome.refusals}")
            quota.settle(
                user_id=user_id,
                pool_id=1,
                reservation_id=rid,
                tokens_per_minute=limits.tokens_per_minute,
                charged_tokens=300,
                refund_message=False,
                now=quota.now_ms(),
            )
            counts[index] += 1

    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    barrier.wait()
    began = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - began
    quota.client().flushdb()
    return LuaResult(
        layout="one user" if same_user else "a user per thread",
        threads=threads,
        reservations=sum(counts),
        seconds=elapsed,
        latencies_ms=[value for values in latencies for value in values],
    )


def lua_pipelined_phase(*, seconds: float, batch: int = 200) -> LuaResult:
    """The scripts' own cost in Redis: reserves and settles sent in pipelined batches from
    one thread, so that round trips and the Python client hardly count."""
    from django.conf import settings

    from billing import quota

    redis = quota.client()
    reserve_script = quota.script(quota.RESERVE)
    settle_script = quota.script(quota.SETTLE)
    reserve_script(keys=["warm:1", "warm:2", "warm:3", "warm:4", "warm:5"], args=[0] * 13)
    settle_script(keys=["warm:1", "warm:2", "warm:3", "warm:4"], args=[0] * 5)
    done = 0
    latencies: list[float] = []
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        now = quota.now_ms()
        ids = [str(uuid.uuid4()) for _ in range(batch)]
        user_id = 2_000_000 + done // batch % 1000
        pipe = redis.pipeline(transaction=False)
        for rid in ids:
            reserve_script(
                keys=[
                    quota.rpm_key(user_id),
                    quota.tpm_key(user_id),
                    quota.cap_key(user_id, 1),
                    quota.concurrency_key(user_id),
                    quota.reservation_key(user_id, rid),
                ],
                args=[
                    now,
                    rid,
                    10**9,
                    10**12,
                    712,
                    10**6,
                    3 * 3600_000,
                    10**6,
                    settings.BILLING_SLOT_TTL_SECONDS * 1000,
                    86_400_000,
                    200,
                    1,
                    2000,
                ],
                client=pipe,
            )
        for rid in ids:
            settle_script(
                keys=[
                    quota.tpm_key(user_id),
                    quota.cap_key(user_id, 1),
                    quota.concurrency_key(user_id),
                    quota.reservation_key(user_id, rid),
                ],
                args=[now, rid, 10**12, 300, 0],
                client=pipe,
            )
        start = time.perf_counter()
        pipe.execute()
        latencies.append((time.perf_counter() - start) * 1000 / (2 * batch))
        done += batch
    elapsed = time.perf_counter() - began
    redis.flushdb()
    return LuaResult(
        layout=f"pipelined x{batch}",
        threads=1,
        reservations=done,
        seconds=elapsed,
        latencies_ms=latencies,
    )


def lua_table(results: Sequence[LuaResult]) -> str:
    rows = [
        [
            result.layout,
            str(result.threads),
            f"{result.per_second:,.0f}",
            ms(percentile(result.latencies_ms, 50)),
            ms(percentile(result.latencies_ms, 99)),
        ]
        for result in results
    ]
    table = render(["keys", "threads", "reservations/s", "reserve p50", "reserve p99"], rows)
    return (
        f"{table}\n(pipelined: the latency columns are one script's share of a batch's round "
        "trip; a reservation there is the two scripts without the reconciler's index)"
    )


# 2. A message POST with and without billing


@dataclass
class PostResult:
    with_billing: list[float] = field(default_factory=list)
    without_billing: list[float] = field(default_factory=list)
    inside: dict[str, list[float]] = field(default_factory=dict)


class Timed:
    """Wraps a function and records how long each call took (ms) under `name`."""

    def __init__(self, name: str, function: Callable[..., Any], into: dict[str, list[float]]):
        self.name, self.function, self.into = name, function, into
        self.current: list[float] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.function(*args, **kwargs)
        finally:
            self.current.append((time.perf_counter() - start) * 1000)

    def close_request(self) -> None:
        self.into.setdefault(self.name, []).append(sum(self.current))
        self.current = []


@contextmanager
def billing_stubbed(plan: Any) -> Iterator[None]:
    """The same request path with billing's hooks replaced by nothing."""
    from django.conf import settings

    with ExitStack() as stack:
        stack.enter_context(mock.patch("conversations.turns.reservation_create", lambda **_: None))
        stack.enter_context(
            mock.patch("billing.inference_hooks.generation_settle", lambda **_: None)
        )
        stack.enter_context(mock.patch("conversations.turns.plan_for_user", lambda **_: plan))
        stack.enter_context(mock.patch("conversations.turns.pool_limits", lambda **_: None))
        stack.enter_context(mock.patch("accounts.abuse.get_usage", lambda *_, **__: None))
        stack.enter_context(mock.patch.object(settings, "BILLING_RATELIMIT_HEADER_PATHS", []))
        yield


def post_phase(*, posts: int, warmup: int) -> PostResult:
    from django.contrib.auth.models import User
    from rest_framework.test import APIClient

    import accounts.abuse
    import billing.middleware
    import conversations.turns
    from accounts.services import api_key_create
    from billing.models import Plan
    from billing.services import subscription_set
    from conversations.services import conversation_create
    from inference.models import Generation, ModelPool
    from inference.services import generation_finish

    pool, _ = ModelPool.objects.get_or_create(name="smollm2-135m", defaults={"served_model": "x"})
    user = User.objects.create_user(f"bench-{uuid.uuid4().hex[:8]}")
    plan = Plan.objects.create(
        slug=f"bench-{uuid.uuid4().hex[:8]}",
        name="Bench",
        tier="plus",
        requests_per_minute=100_000,
        tokens_per_minute=100_000_000,
        max_concurrent=1000,
        max_output_tokens=512,
        message_cap=None,
    )
    subscription_set(user=user, plan=plan)
    _, raw_key = api_key_create(user=user, name="bench")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    content = "What is the capital of France, and why did it become the capital?"
    result = PostResult()
    timers = [
        Timed("reservation (Lua)", conversations.turns.reservation_create, result.inside),
        Timed("plan lookups in the turn", conversations.turns.plan_for_user, result.inside),
        Timed("x-ratelimit-* headers", billing.middleware.rate_limit_headers, result.inside),
        Timed("per-IP abuse counter", accounts.abuse.get_usage, result.inside),
    ]
    targets = [
        "conversations.turns.reservation_create",
        "conversations.turns.plan_for_user",
        "billing.middleware.rate_limit_headers",
        "accounts.abuse.get_usage",
    ]

    def one_post() -> float:
        conversation = conversation_create(owner=user, model=pool.name)
        start = time.perf_counter()
        response = client.post(
            f"/api/v1/conversations/{conversation.pk}/messages", {"content": content}, format="json"
        )
        elapsed = (time.perf_counter() - start) * 1000
        if response.status_code != 201:
            raise RuntimeError(f"POST answered {response.status_code}: {response.content!r}")
        generation_finish(
            generation_id=response.json()["generation"]["id"],
            status=Generation.Status.COMPLETE,
            text="Paris.",
            prompt_tokens=40,
            output_tokens=3,
        )
        return elapsed

    for _ in range(warmup):
        one_post()
        with billing_stubbed(plan):
            one_post()
    for index in range(posts * 2):
        if index % 2 == 0:
            with ExitStack() as stack:
                for target, timer in zip(targets, timers, strict=True):
                    stack.enter_context(mock.patch(target, timer))
                result.with_billing.append(one_post())
            for timer in timers:
                timer.close_request()
        else:
            with billing_stubbed(plan):
                result.without_billing.append(one_post())
    return result


def post_table(result: PostResult) -> str:
    rows = [
        [
            "full path (billing on)",
            str(len(result.with_billing)),
            ms(percentile(result.with_billing, 50)),
            ms(percentile(result.with_billing, 99)),
        ],
        [
            "billing stubbed out",
            str(len(result.without_billing)),
            ms(percentile(result.without_billing, 50)),
            ms(percentile(result.without_billing, 99)),
        ],
        [
            "difference",
            "",
            ms(percentile(result.with_billing, 50) - percentile(result.without_billing, 50)),
            ms(percentile(result.with_billing, 99) - percentile(result.without_billing, 99)),
        ],
    ]
    total = [sum(values) for values in zip(*result.inside.values(), strict=True)]
    for name, values in [*result.inside.items(), ("all of billing's calls", total)]:
        rows.append(
            [
                f"  inside: {name}",
                str(len(values)),
                ms(percentile(values, 50)),
                ms(percentile(values, 99)),
            ]
        )
    return render(["POST /messages", "n", "p50", "p99"], rows)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--seconds", type=float, default=3.0, help="per Lua phase")
    parser.add_argument("--posts", type=int, default=300, help="per variant")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    return parser.parse_args(argv)


def benchmark(args: argparse.Namespace) -> str:
    from django.conf import settings

    lua = [
        lua_phase(threads=threads, seconds=args.seconds, same_user=same_user)
        for same_user in (False, True)
        for threads in args.threads
    ]
    lua.append(lua_pipelined_phase(seconds=args.seconds))
    posts = post_phase(posts=args.posts, warmup=args.warmup)
    return "\n".join(
        [
            f"billing_reservations {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
            machine_facts(),
            f"redis {settings.REDIS_URL}; a reservation is reserve (1 script) + settle (1 script)",
            "",
            "1. Reservations through the Lua path (reserve + settle per reservation)",
            lua_table(lua),
            "",
            "2. Latency of a message POST (in-process edge, real Postgres and Redis)",
            post_table(posts),
            "",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    bootstrap()
    prepare_stores()
    report = benchmark(args)
    print(report)
    path = write_result(args.results_dir, "billing_reservations", report)
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
