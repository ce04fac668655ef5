"""CPU of the input checks on `/v1` requests that carry their whole conversation, checked as
one joined text (as before part-by-part checks) and part by part with the scores of parts seen
before kept (`moderation.engine.evaluate_parts`), side by side in one process.

A `/v1` client sends the system prompt and every earlier message again with each turn: the
router race's trace (shared system prompts of `--system-tokens`, several turns, answers of
about `--answer-words` words) made the edge spend 42% of its samples in the input checks. The
trace here is the race's (`router_race.make_trace`, its system prompts and questions); each
conversation's answers are made up of its own words, so no two answers are the same text.
Every request is checked both ways, in alternating order, each timed with the process's CPU
(user + system); the memo starts empty, so the first turn of each system prompt pays for it.
Both ways must agree on every verdict (the trace is harmless: nothing is blocked).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/chatsite_turn_bench \\
    REDIS_URL=redis://127.0.0.1:6379/11 SECRET_KEY=x PLUGINS_ENCRYPTION_KEY=x \\
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/input_checks.py

It uses its own database (created and migrated if missing; the name must contain "bench"),
for the thresholds and staff rules the checks read, prints the table and writes it to
benchmarks/results/input_checks-<UTC date-time>.txt (`--results` names another folder).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

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


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=120)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=16, help="shared system prompts")
    parser.add_argument("--system-tokens", type=int, default=1000)
    parser.add_argument("--answer-words", type=int, default=48)
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    # What router_race.make_trace reads besides these.
    args.rate, args.think = 4.0, 0.0
    return args


def requests(args: argparse.Namespace) -> list[list[str]]:
    """Every `/v1` request of the trace, in the order the turns come (a round of every
    conversation's next turn at a time), as its parts: the system prompt, then each
    question and answer, ending with the new question."""
    from benchmarks.router_race import make_trace, system_prompts
    from benchmarks.scheduler_affinity import POLICY_LINES

    trace = make_trace(args)
    prompts = system_prompts(args, "checks")
    words = " ".join(POLICY_LINES).split()
    rng = random.Random(args.seed)
    histories = [[prompts[conversation.system]] for conversation in trace]
    made: list[list[str]] = []
    for turn in range(args.turns):
        for conversation, history in zip(trace, histories, strict=True):
            history.append(conversation.questions[turn])
            made.append(list(history))
            answer = f"Answer {conversation.index}.{turn}: " + " ".join(
                rng.choice(words) for _ in range(args.answer_words)
            )
            history.append(answer)
    return made


def cpu_ms(call: Callable[[], object]) -> tuple[float, object]:
    started = time.process_time()
    result = call()
    return (time.process_time() - started) * 1000, result


def measure(args: argparse.Namespace) -> str:
    from moderation import engine

    made = requests(args)
    engine.SCORES.clear()
    policy = engine.policy()
    joined_ms: list[float] = []
    parts_ms: list[float] = []
    disagree = blocked = 0
    for index, parts in enumerate(made):
        joined = "\n\n".join(parts)
        ways = [
            (joined_ms, lambda joined=joined: engine.evaluate(joined, policy)),
            (parts_ms, lambda parts=parts: engine.evaluate_parts(parts, policy)),
        ]
        if index % 2:
            ways.reverse()
        verdicts = []
        for times, call in ways:
            spent, verdict = cpu_ms(call)
            times.append(spent)
            verdicts.append(verdict)
        decided = {bool(getattr(verdict, "is_blocked", False)) for verdict in verdicts}
        disagree += len(decided) > 1
        blocked += max(decided)
    chars = sum(len("\n\n".join(parts)) for parts in made) / len(made)
    rows = []
    for name, times in (("joined (before)", joined_ms), ("parts, kept scores", parts_ms)):
        rows.append(
            [
                name,
                str(len(times)),
                f"{percentile(times, 50):.2f}",
                f"{percentile(times, 99):.2f}",
                f"{sum(times) / len(times):.2f}",
                f"{sum(times) / sum(joined_ms):.2f}",
            ]
        )
    header = (
        f"input checks: {args.conversations} conversations x {args.turns} turns, "
        f"{args.prompts} shared system prompts of ~{args.system_tokens} tokens, answers of "
        f"{args.answer_words} words, seed {args.seed}; a request carries {chars:,.0f} "
        "characters on average\n"
        "CPU ms per request (one process, user + system), each request checked both ways in "
        "alternating order; the memo started empty\n"
    )
    table = render(["way", "requests", "p50", "p99", "mean", "total vs joined"], rows)
    footer = (
        f"\nverdicts: {blocked} requests blocked, {disagree} where the two ways disagree\n"
        f"memo: {len(engine.SCORES)} entries at the end\n"
    )
    return header + table + footer


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    django_start(database_url=DEFAULT_DATABASE_URL, redis_url=DEFAULT_REDIS_URL)
    prepare_stores()
    report = measure(args)
    print(report)
    path = write_result(args.results, "input_checks", report)
    print(f"saved {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
