"""What dropping a conversation costs: the related rows' deletes as one statement, against one
statement per related model.

Every `/v1` answer of a key that keeps no conversations ends with its conversation dropped
(`conversations.removal`, `keep_tombstone=False`), before the client reads `[DONE]`; the
retention sweep and account deletion drop them too. Per side, `--conversations` conversations
of `--messages` messages each are made, then dropped one after the other, timed with this
process's CPU clock and the wall clock. The sides alternate for `--rounds` rounds:

    one statement    the deletes of every related model, the messages and the row in one
                     `WITH ... DELETE` (`removal._one_statement`, on Postgres)
    one by one       one `DELETE` per related model, then the messages, then the row

Reported per side: CPU and wall milliseconds per drop (median over the rounds, then the
rounds' own values) and the statements one drop sends.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/chatsite_drop_bench \\
    REDIS_URL=redis://127.0.0.1:6379/7 SECRET_KEY=x \\
    .venv/bin/python benchmarks/conversation_drop.py --conversations 40 --rounds 6

It prints one table and writes it to benchmarks/results/conversation_drop-<UTC date-time>.txt.
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import django_start, prepare_stores, render, write_result  # noqa: E402

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/chatsite_drop_bench"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/7"
SIDES = ("one statement", "one by one")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=40, help="dropped per round")
    parser.add_argument("--messages", type=int, default=8, help="per conversation")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    return parser.parse_args(argv)


def make_conversations(user: Any, args: argparse.Namespace) -> list[Any]:
    from conversations.models import Message
    from conversations.services import conversation_create

    made = []
    for number in range(args.conversations):
        conversation = conversation_create(
            owner=user, title=f"Drop {number}", system_prompt="Be brief."
        )
        parent = Message.objects.get(conversation=conversation, parent=None)
        for index in range(args.messages):
            parent = Message.objects.create(
                conversation=conversation,
                parent=parent,
                role=Message.Role.USER if index % 2 == 0 else Message.Role.ASSISTANT,
                content="A line of a conversation. " * 20,
            )
        made.append(conversation)
    return made


def drop_all(conversations: list[Any]) -> tuple[float, float, int]:
    """(CPU ms, wall ms) per drop, and the statements of the first drop."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from conversations.models import Conversation
    from conversations.removal import conversation_remove

    with CaptureQueriesContext(connection) as first:
        conversation_remove(conversation=conversations[0], keep_tombstone=False)
    cpu, wall = time.process_time(), time.perf_counter()
    for conversation in conversations[1:]:
        conversation_remove(conversation=conversation, keep_tombstone=False)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    left = Conversation.objects.filter(pk__in=[c.pk for c in conversations]).count()
    if left:
        raise SystemExit(f"{left} conversations were not dropped")
    timed = max(1, len(conversations) - 1)
    return 1000 * cpu / timed, 1000 * wall / timed, len(first)


def benchmark(args: argparse.Namespace) -> str:
    from django.contrib.auth.models import User

    from conversations import removal

    user = User.objects.create_user(username=f"drop-bench-{secrets.token_hex(4)}")
    measured: dict[str, list[tuple[float, float, int]]] = {side: [] for side in SIDES}
    for round_ in range(args.rounds):
        for side in SIDES if round_ % 2 == 0 else reversed(SIDES):
            one_by_one = mock.patch.object(removal, "_one_statement", lambda plan, alias: None)
            with one_by_one if side == "one by one" else contextlib.nullcontext():
                measured[side].append(drop_all(make_conversations(user, args)))
    rows = []
    for side, values in measured.items():
        cpu = [value[0] for value in values]
        wall = [value[1] for value in values]
        rows.append(
            [
                side,
                f"{statistics.median(cpu):.2f}",
                f"{statistics.median(wall):.2f}",
                str(values[0][2]),
                " ".join(f"{c:.2f}/{w:.2f}" for c, w, _ in values),
            ]
        )
    one, apart = (statistics.median(v[0] for v in measured[side]) for side in SIDES)
    header = (
        f"Dropping a conversation of {args.messages} messages: {args.conversations} per round, "
        f"{args.rounds} rounds, sides alternated; this process's CPU and the wall clock."
    )
    table = render(
        ["side", "CPU ms/drop", "wall ms/drop", "statements", "rounds (CPU/wall ms)"], rows
    )
    return f"{header}\n\n{table}\n\nCPU per drop, one statement over one by one: {one / apart:.2f}"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.conversations < 2 or args.rounds < 1:
        raise SystemExit("--conversations must be at least 2 and --rounds at least 1")
    django_start(database_url=DEFAULT_DATABASE_URL, redis_url=DEFAULT_REDIS_URL)
    prepare_stores()
    text = benchmark(args)
    print(text)
    path = write_result(args.results, "conversation_drop", text)
    print(f"\nwritten to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
