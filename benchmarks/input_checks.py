"""CPU of the work a `/v1` request repeats on the conversation it carries again, each way side
by side in one process: the input checks on one joined text (as before part-by-part checks)
and part by part with the scores of parts seen before kept (`moderation.engine.evaluate_parts`);
the prompt's token ids for placement encoded whole (as before) and by pieces with the ids of
pieces seen before kept (`inference.prompts.encode`).

A `/v1` client sends the system prompt and every earlier message again with each turn: the
router race's trace (shared system prompts of `--system-tokens`, several turns, answers of
about `--answer-words` words) made the edge spend 42% of its samples in the input checks. The
trace here is the race's (`router_race.make_trace`, its system prompts and questions); each
conversation's answers are made up of its own words, so no two answers are the same text.
Every request is done both ways, in alternating order, each timed with the process's CPU
(user + system); the memos start empty, so the first turn of each system prompt pays for it.
Both ways must agree on every verdict (the trace is harmless: nothing is blocked) and on every
prompt's token ids.

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
from functools import partial
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
    args.rate, args.think, args.paid = 4.0, 0.0, 0.0
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


def side_by_side(
    made: list[list[str]], ways: list[tuple[str, Callable[[list[str]], object]]]
) -> tuple[list[list[float]], list[list[object]]]:
    """Each request done both ways, in alternating order: the CPU ms of each way per
    request, and what each way returned."""
    times: list[list[float]] = [[] for _ in ways]
    results: list[list[object]] = [[] for _ in ways]
    for index, parts in enumerate(made):
        order = list(range(len(ways)))
        if index % 2:
            order.reverse()
        for way in order:
            call = ways[way][1]
            spent, result = cpu_ms(partial(call, parts))
            times[way].append(spent)
            results[way].append(result)
    return times, results


def rows_of(names: Sequence[str], times: list[list[float]]) -> list[list[str]]:
    return [
        [
            name,
            str(len(spent)),
            f"{percentile(spent, 50):.2f}",
            f"{percentile(spent, 99):.2f}",
            f"{sum(spent) / len(spent):.2f}",
            f"{sum(spent) / sum(times[0]):.2f}",
        ]
        for name, spent in zip(names, times, strict=True)
    ]


def as_messages(parts: list[str]) -> list[dict[str, str]]:
    """A request's parts as the messages the scheduler places: the system prompt, then the
    questions and answers in turn."""
    roles = ["user", "assistant"]
    return [{"role": "system", "content": parts[0]}] + [
        {"role": roles[i % 2], "content": part} for i, part in enumerate(parts[1:])
    ]


def measure(args: argparse.Namespace) -> str:
    from django.conf import settings

    from inference import prompts
    from moderation import engine

    made = requests(args)
    engine.SCORES.clear()
    prompts.PIECES.clear()
    policy = engine.policy()
    folder = str(settings.MODEL_DIR)
    tokenizer = prompts.load_tokenizer(folder)
    checks, verdicts = side_by_side(
        made,
        [
            ("joined", lambda parts: engine.evaluate("\n\n".join(parts), policy)),
            ("parts", lambda parts: engine.evaluate_parts(parts, policy)),
        ],
    )
    decided = [
        {bool(getattr(verdict, "is_blocked", False)) for verdict in pair}
        for pair in zip(*verdicts, strict=True)
    ]
    disagree = sum(len(both) > 1 for both in decided)
    blocked = sum(max(both) for both in decided)
    tokens, ids = side_by_side(
        made,
        [
            (
                "whole",
                lambda parts: (
                    tokenizer.encode(
                        prompts.render(folder, as_messages(parts)), add_special_tokens=False
                    ).ids
                ),
            ),
            ("pieces", lambda parts: prompts.token_ids(folder, as_messages(parts))),
        ],
    )
    differ = sum(whole != pieces for whole, pieces in zip(*ids, strict=True))
    chars = sum(len("\n\n".join(parts)) for parts in made) / len(made)
    header = (
        f"input checks: {args.conversations} conversations x {args.turns} turns, "
        f"{args.prompts} shared system prompts of ~{args.system_tokens} tokens, answers of "
        f"{args.answer_words} words, seed {args.seed}; a request carries {chars:,.0f} "
        "characters on average\n"
        "CPU ms per request (one process, user + system), each request done both ways in "
        "alternating order; the memos started empty\n\n"
    )
    columns = ["way", "requests", "p50", "p99", "mean", "total vs first"]
    checks_table = render(columns, rows_of(["joined (before)", "parts, kept scores"], checks))
    tokens_table = render(
        columns,
        rows_of(["whole prompt encoded (before)", "pieces, kept ids"], tokens),
    )
    return (
        header
        + "the input checks (the edge):\n"
        + checks_table
        + f"\nverdicts: {blocked} requests blocked, {disagree} where the two ways disagree\n"
        + f"memo: {len(engine.SCORES)} entries at the end\n\n"
        + "the prompt's token ids for placement (the scheduler):\n"
        + tokens_table
        + f"\ntoken ids: {differ} requests where the two ways differ\n"
        + f"memo: {len(prompts.PIECES)} pieces at the end\n"
    )


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
