"""Moderation of answers while they stream (the scheduler's side of ARCHITECTURE.md step 8).

The scheduler keeps one `OutputWindow` per generation. Once enough new text has arrived
(`MODERATION_WINDOW_TOKENS` less the overlap), it checks a window of at least
`MODERATION_WINDOW_TOKENS` ending at the newest text and reaching back past the previous
check's end by `MODERATION_WINDOW_OVERLAP_TOKENS`, so a phrase cut by one window's edge lies
whole in the next and no text goes unchecked. At the end the whole text is checked once
more. Checks run off the event loop. When one trips, the scheduler withdraws the answer
with `retract_event`'s payload (its stream writer drops the text from the stream in the same
step). `StreamingOutputGuard` is what the scheduler loads (`INFERENCE_OUTPUT_GUARD`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.conf import settings

from chatsite.stream_events import RetractData
from inference.services import CONTENT_FILTER

from . import engine, metrics
from .categories import label
from .engine import Verdict

CHARS_PER_TOKEN = 4


@dataclass
class OutputWindow:
    """Where a generation's output checks stand."""

    window_chars: int
    step_chars: int
    checked_to: int = 0
    review: Verdict | None = None
    review_excerpt: str = ""
    blocked: Verdict | None = None
    blocked_excerpt: str = ""

    def due(self, text: str) -> str | None:
        """The window to check now, or None if too little new text has arrived."""
        if len(text) < self.checked_to:
            # The answer restarted (another worker, a tool round): start over.
            self.checked_to = 0
        if len(text) - self.checked_to < self.step_chars:
            return None
        # From a little before the last check's end (the overlap) to the newest text: at
        # least one window, more if the check fell behind the stream.
        start = max(0, min(self.checked_to - self.overlap_chars, len(text) - self.window_chars))
        return text[start:]

    @property
    def overlap_chars(self) -> int:
        return self.window_chars - self.step_chars

    def covered(self, text: str) -> bool:
        """Whether the last window checked already held all of `text`."""
        return self.checked_to == len(text) and len(text) <= self.window_chars

    def record(self, verdict: Verdict, excerpt: str, *, end: int) -> bool:
        """Take a check's verdict on the text up to `end`; True if it withdraws the answer.

        Marked only once the check is done, so a check cancelled midway is made again.
        """
        self.checked_to = max(self.checked_to, end)
        if verdict.is_blocked or verdict.unavailable:
            self.blocked, self.blocked_excerpt = verdict, excerpt
            return True
        self.note(verdict, excerpt)
        return False

    def note(self, verdict: Verdict, excerpt: str) -> None:
        """Keep the strongest verdict that asks only for review, to flag at the end."""
        if verdict.needs_review and (
            self.review is None
            or max(verdict.scores.values(), default=0.0)
            > max(self.review.scores.values(), default=0.0)
        ):
            self.review, self.review_excerpt = verdict, excerpt


def output_window() -> OutputWindow | None:
    """A fresh window for a new generation, or None when output checks are off."""
    if not settings.MODERATION_OUTPUT_ENABLED:
        return None
    window = settings.MODERATION_WINDOW_TOKENS * CHARS_PER_TOKEN
    overlap = min(settings.MODERATION_WINDOW_OVERLAP_TOKENS * CHARS_PER_TOKEN, window - 1)
    return OutputWindow(window_chars=window, step_chars=window - overlap)


async def check(text: str) -> Verdict:
    """Evaluate `text` without blocking the event loop: the policy where database access is
    allowed, the classifiers in a worker thread."""
    policy = await sync_to_async(engine.policy)()
    verdict = await asyncio.to_thread(engine.evaluate, text, policy)
    metrics.verdict_taken(metrics.OUTPUT, verdict)
    return verdict


def retract_event(verdict: Verdict) -> RetractData:
    """The `retract` event's payload: why, and the notice clients show instead."""
    categories = verdict.blocked
    return RetractData(
        reason=CONTENT_FILTER,
        categories=categories,
        labels=[label(category) for category in categories],
        notice=settings.MODERATION_RETRACT_NOTICE,
    )


class StreamingOutputGuard:
    """Output moderation as the scheduler's output guard (`inference.scheduler.guard`)."""

    def window(self) -> OutputWindow | None:
        return output_window()

    async def check(self, excerpt: str) -> Verdict:
        return await check(excerpt)

    def retract_payload(self, verdict: Verdict) -> RetractData:
        return retract_event(verdict)

    def warm(self) -> None:
        if settings.MODERATION_OUTPUT_ENABLED:
            engine.warm()
