"""The output guard: what the scheduler asks of output moderation while an answer streams.

The scheduler knows no classifier. It keeps one `GuardWindow` per generation (a pure state
object: what to check next, and the verdicts so far), asks the guard to `check` the excerpt
the window says is due, and when a check trips stops the answer (`ContentBlocked`) and
withdraws it with the guard's `retract_payload`. The implementation is named by
`settings.INFERENCE_OUTPUT_GUARD` (default: `moderation.output.StreamingOutputGuard`).
Verdicts are opaque here: they go from `check` to the window and to the output-flag hook.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from django.conf import settings

from chatsite import dotted
from chatsite.stream_events import RetractData


class ContentBlocked(Exception):
    """Raised inside the streaming loop when a check trips: it ends the upstream request
    (closing it aborts the generation in vLLM)."""


class GuardWindow(Protocol):
    """Where one generation's output checks stand."""

    @property
    def blocked(self) -> Any | None:
        """The verdict that withdrew the answer, if one did."""

    @property
    def blocked_excerpt(self) -> str: ...

    @property
    def review(self) -> Any | None:
        """The strongest verdict that asks staff to review the answer, if any."""

    @property
    def review_excerpt(self) -> str: ...

    def due(self, text: str) -> str | None:
        """The excerpt of `text` to check now, or None if too little new text arrived."""

    def covered(self, text: str) -> bool:
        """Whether the last excerpt checked already held all of `text`."""

    def record(self, verdict: Any, excerpt: str, *, end: int) -> bool:
        """Take a check's verdict on the text up to `end`; True if it withdraws the answer."""


@runtime_checkable
class OutputGuard(Protocol):
    """Output moderation as the scheduler sees it."""

    def window(self) -> GuardWindow | None:
        """A fresh window for a new generation, or None when output checks are off."""

    async def check(self, excerpt: str) -> Any:
        """The verdict on `excerpt`, without blocking the event loop."""

    def retract_payload(self, verdict: Any) -> RetractData:
        """The `retract` event's payload for an answer `verdict` withdrew."""

    def warm(self) -> None:
        """Load the classifiers' models now, as the replica starts (synchronous, before the
        loops run), not during the first answer it checks."""


def configured_guard() -> OutputGuard:
    """The guard `settings.INFERENCE_OUTPUT_GUARD` names; ImproperlyConfigured if none."""
    guard: OutputGuard = dotted.build(
        "INFERENCE_OUTPUT_GUARD", settings.INFERENCE_OUTPUT_GUARD, OutputGuard
    )
    return guard
