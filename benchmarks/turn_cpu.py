"""CPU and SQL statements of a kept turn in one process: a message POST as the edge serves it,
and its answer's finish as the scheduler writes it, beside a read of the same conversation.

Issue 34's bars for the kept path are per step (a send costs the edge at most 3 ms of CPU,
four statements; a finish three), which the whole-stack benchmarks (`overhead.py`,
`cpu_per_message.py`) cannot isolate: there every process shares two cores with the vLLM
worker. Here one process does each step in turn, with no worker and no scheduler, and the
process's own CPU time (user + system) around each is what is counted:

- `send`: `POST /api/v1/conversations/<id>/messages` through Django's test client (the
  middleware, the API key, the view, the turn: moderation, the tree write, context assembly,
  the reservation in Redis, the job queued);
- `finish`: `generation_finish` with the job, as a scheduler replica ends the answer (its
  text and usage: the usage event owed to the ledger's outbox);
- `flush`: `ledger_flush` once per round, divided by the round's answers (the replica's
  batched write of those usage events);
- `read`: `GET /api/v1/conversations/<id>` of the same conversation, the reference: what any
  authenticated request through the same stack costs, in the same run;
- `floor`: `GET /api/v1/generations/<id>` of the answer: the least an authenticated API
  request through the same stack costs (the key, the middleware, DRF, one row read and
  serialized), below which no step served by it can go.

`--conversations` conversations take `--turns` turns each, in rounds (one turn of every
conversation per round, in turn); the first round is a warm-up and not counted. Postgres and
Redis work on their own cores' time and are not in the figures. With `--profile FILE`,
py-spy records the process while it sends and finishes (raw collapsed stacks).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/chatsite_turn_bench \\
    REDIS_URL=redis://127.0.0.1:6379/11 SECRET_KEY=x PLUGINS_ENCRYPTION_KEY=x \\
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/turn_cpu.py

It uses its own database (created and migrated if missing; the name must contain "bench")
and Redis database (never db 0; flushed at start), prints the table and writes it to
benchmarks/results/turn_cpu-<UTC date-time>.txt (`--results` names another folder).
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import (  # noqa: E402
    django_start,
    percentile,
    prepare_stores,
    render,
    write_result,
)

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/chatsite_turn_bench"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/11"
STEPS = ("send", "finish", "flush", "read", "floor")
ANSWER = "Sourdough is bread leavened by wild yeast and lactic acid bacteria."


class _Statements(logging.Handler):
    """Counts the statements Django logs, whichever thread runs them (a view may run in
    another than the caller's), BEGIN and COMMIT included as Django's query capture has them."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


@contextmanager
def statements_logged() -> Iterator[_Statements]:
    """Django logs every statement while DEBUG is on: on only inside this block (its logging
    costs CPU, so no timed step runs in one)."""
    from django.conf import settings

    counter = _Statements()
    logger = logging.getLogger("django.db.backends")
    level, propagate = logger.level, logger.propagate
    logger.addHandler(counter)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    settings.DEBUG = True
    try:
        yield counter
    finally:
        settings.DEBUG = False
        logger.removeHandler(counter)
        logger.setLevel(level)
        logger.propagate = propagate


class Counted:
    """Per step: the CPU milliseconds of each time it ran, or (`counting`) its statements."""

    def __init__(self, *, counting: bool = False) -> None:
        self.counting = counting
        self.cpu: dict[str, list[float]] = {step: [] for step in STEPS}
        self.statements: dict[str, list[int]] = {step: [] for step in STEPS}

    def measure(self, step: str, call: Callable[[], Any], *, share: int = 1) -> Any:
        if self.counting:
            with statements_logged() as counter:
                result = call()
            self.statements[step].append(counter.count)
            return result
        began = time.process_time()
        result = call()
        spent = time.process_time() - began
        for _ in range(share):
            self.cpu[step].append(spent * 1000 / share)
        return result


def run(
    args: argparse.Namespace, warmed: Callable[[], Callable[[], None]]
) -> tuple[Counted, dict[str, Any]]:
    """The rounds; `warmed` is called after the warm-up round (it starts the profiler), and
    what it returns after the timed rounds."""
    from django.conf import settings
    from django.test import Client

    from benchmarks.stack import make_users
    from billing.ledger import ledger_flush
    from chatsite.catalog import catalog_changed
    from chatsite.redis import sync_redis
    from inference import queue
    from inference.models import ModelPool, Worker
    from inference.services import generation_finish

    # A pool with a worker the turns are placed for (nothing calls it: no scheduler runs).
    pool, _ = ModelPool.objects.update_or_create(
        name=settings.DEFAULT_MODEL,
        defaults={"served_model": "bench", "max_output_tokens": args.max_tokens},
    )
    Worker.objects.update_or_create(
        url="http://127.0.0.1:9",
        defaults={"pool": pool, "name": "turn-cpu", "state": Worker.State.HEALTHY},
    )
    catalog_changed()
    [(_, raw_key)] = make_users(1, f"turn-cpu-{int(time.time())}")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw_key}", HTTP_HOST="localhost")
    redis = sync_redis()
    api = "/api/v1/conversations"
    conversations = []
    for _ in range(args.conversations):
        made = client.post(
            api, {"system_prompt": "You are a helpful baker."}, content_type="application/json"
        )
        assert made.status_code == 201, made.content
        conversations.append(made.json()["id"])

    # A warm-up round (what a process reads once), the timed rounds, a round whose
    # statements are counted.
    counted, warm, statements = Counted(), Counted(), Counted(counting=True)
    stop: Callable[[], None] = lambda: None  # noqa: E731
    for round_number in range(args.turns + 2):
        into = warm if round_number == 0 else counted if round_number <= args.turns else statements
        if round_number == 1:
            stop = warmed()
        if round_number == args.turns + 1:
            stop()
        for index, conversation_id in enumerate(conversations):
            body = {"content": f"Question {round_number}.{index}: what makes sourdough sour?"}
            url = f"{api}/{conversation_id}"
            sent = into.measure(
                "send",
                partial(client.post, f"{url}/messages", body, content_type="application/json"),
            )
            assert sent.status_code == 201, sent.content
            generation_id = sent.json()["generation"]["id"]
            job = queue.read_job(redis, generation_id)
            assert job is not None, generation_id
            # Taken from its queue as a replica claims it (not counted: the scheduler's).
            queue.unqueue(redis, pool=job.pool, tier=job.tier, generation_id=generation_id)
            finished = into.measure(
                "finish",
                partial(
                    generation_finish,
                    generation_id=generation_id,
                    status="complete",
                    text=ANSWER,
                    finish_reason="stop",
                    prompt_tokens=60 + 30 * round_number,
                    output_tokens=16,
                    job=job,
                ),
            )
            assert finished, generation_id
            read = into.measure("read", partial(client.get, url))
            assert read.status_code == 200, read.content
            floor = into.measure(
                "floor", partial(client.get, f"/api/v1/generations/{generation_id}")
            )
            assert floor.status_code == 200, floor.content
        into.measure("flush", ledger_flush, share=len(conversations))
    counted.statements = statements.statements
    facts = {"answers": args.conversations * args.turns}
    return counted, facts


def report(args: argparse.Namespace, counted: Counted, facts: dict[str, Any]) -> str:
    rows = []
    read_p50 = percentile(counted.cpu["read"], 50)
    for step in STEPS:
        cpu = counted.cpu[step]
        statements = counted.statements[step]
        p50 = percentile(cpu, 50)
        rows.append(
            [
                step,
                str(len(cpu)),
                f"{p50:.2f}",
                f"{percentile(cpu, 90):.2f}",
                f"{sum(cpu) / len(cpu):.2f}",
                f"{p50 / read_p50:.2f}" if read_p50 else "",
                f"{min(statements)}-{max(statements)}",
            ]
        )
    lines = [
        f"turn CPU benchmark, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{os.cpu_count()} CPUs; {args.conversations} conversations x {args.turns} turns "
        f"(after a warm-up round), one process, no worker; {facts['answers']} answers",
        "",
        render(
            [
                "step",
                "n",
                "CPU ms p50",
                "CPU ms p90",
                "CPU ms mean",
                "p50 / read",
                "statements",
            ],
            rows,
        ),
        "",
        "CPU: this process's user + system time around each step (Postgres and Redis not "
        "counted); flush: one ledger_flush a round, per answer; statements: in one more "
        "round, untimed, as Django logs them (BEGIN and COMMIT included)",
    ]
    send_p50 = percentile(counted.cpu["send"], 50)
    floor_p50 = percentile(counted.cpu["floor"], 50)
    lines += [
        "",
        f"bar (#34): a send costs the edge <= 3 ms of CPU: {send_p50:.2f} ms p50, "
        + ("met" if send_p50 <= 3 else "NOT met"),
        f"the stack's floor: {floor_p50:.2f} ms p50; a send is {send_p50 / floor_p50:.1f} times it",
    ]
    return "\n".join(lines)


def profiled(path: Path | None) -> Callable[[], None]:
    """py-spy recording this process into `path` (raw collapsed stacks, only samples that
    hold the GIL: its CPU, not its waits on Postgres and Redis); the returned call stops it
    and waits for its file."""
    if path is None:
        return lambda: None
    spy = subprocess.Popen(  # noqa: S603 (our own command line)
        [
            str(Path(sys.executable).parent / "py-spy"),
            "record",
            "--pid",
            str(os.getpid()),
            "--gil",
            "--format",
            "raw",
            "--rate",
            "200",
            "--output",
            str(path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # attached before the first timed step

    def stop() -> None:
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=60)

    return stop


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=20)
    parser.add_argument("--turns", type=int, default=10, help="counted turns per conversation")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--profile", type=Path, default=None, help="py-spy raw output file")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # Every request comes from one address: the per-address abuse limit would refuse them.
    os.environ.setdefault("RATE_LIMIT_MESSAGE_POST", "1000000/m")
    os.environ.setdefault("DEBUG", "0")
    django_start(database_url=DEFAULT_DATABASE_URL, redis_url=DEFAULT_REDIS_URL)
    prepare_stores()
    counted, facts = run(args, lambda: profiled(args.profile))
    text = report(args, counted, facts)
    print(text)
    print(f"\nsaved {write_result(args.results, 'turn_cpu', text)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
