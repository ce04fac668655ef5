"""Moderation's Prometheus metric: the checks that tripped, by stage and what they did.

Counted where a verdict is taken (`services.moderation_check_input` at the edge, the output
guard's `output.check` in the scheduler); `chatsite.metrics` says how a process exposes it.
"""

from __future__ import annotations

from prometheus_client import Counter

from .engine import Verdict

MODERATION_TRIPS = Counter(
    "chatsite_moderation_trips",
    "Moderation checks that tripped: stage input or output; action block (refused or "
    "withdrawn), review (flagged for staff) or unavailable (no backend could judge it).",
    ["stage", "action"],
)

INPUT = "input"
OUTPUT = "output"


def verdict_taken(stage: str, verdict: Verdict) -> None:
    """Count `verdict` if it trips: a block, a review, or an unavailable check."""
    if verdict.is_blocked:
        MODERATION_TRIPS.labels(stage, "block").inc()
    elif verdict.unavailable:
        MODERATION_TRIPS.labels(stage, "unavailable").inc()
    elif verdict.needs_review:
        MODERATION_TRIPS.labels(stage, "review").inc()
