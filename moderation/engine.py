"""Running the configured classifiers on a text and deciding what their scores mean.

`policy()` gathers what a check needs from the database (thresholds, each backend's
`refresh`); `evaluate()` then runs without the database, so the scheduler can run it off its
event loop in any thread.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from django.conf import settings

from . import selectors
from .classifiers import Classifier, ClassifierError, Scores, clamp, configured_classifiers
from .selectors import Threshold

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Policy:
    """What `evaluate` needs: the backends, ready, and every category's thresholds."""

    classifiers: tuple[Classifier, ...]
    thresholds: dict[str, Threshold]


@dataclass(frozen=True)
class Verdict:
    """The chain's scores for a text and the decision they lead to."""

    scores: Scores
    blocked: list[str]
    review: list[str]
    backends: list[str]
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def is_blocked(self) -> bool:
        return bool(self.blocked)

    @property
    def needs_review(self) -> bool:
        return not self.blocked and bool(self.review)

    @property
    def unavailable(self) -> bool:
        """A backend failed and the settings say a failed check refuses the text."""
        return bool(self.failed) and settings.MODERATION_FAIL_CLOSED

    @property
    def categories(self) -> list[str]:
        return self.blocked or self.review

    def backend_label(self) -> str:
        return ",".join(self.backends)


def policy() -> Policy:
    """The configured backends, refreshed, and the current thresholds (database allowed)."""
    classifiers = configured_classifiers()
    for classifier in classifiers:
        try:
            classifier.refresh()
        except Exception:
            logger.exception("moderation backend %s could not refresh", classifier.name)
    return Policy(classifiers=classifiers, thresholds=selectors.thresholds())


def warm() -> None:
    """Load every configured backend's model now (see `Classifier.warm`)."""
    for classifier in configured_classifiers():
        classifier.warm()


def warm_input() -> None:
    """`warm`, where messages are checked as they are sent (an edge's `EDGE_WARM_UP`)."""
    if settings.MODERATION_INPUT_ENABLED:
        warm()


def decide(scores: Scores, thresholds: dict[str, Threshold]) -> tuple[list[str], list[str]]:
    """(categories at or past their block threshold, those only past review), highest first."""
    blocked, review = [], []
    for category, score in sorted(scores.items(), key=lambda item: -item[1]):
        threshold = thresholds.get(category)
        if threshold is None:
            continue
        if threshold.block is not None and score >= threshold.block:
            blocked.append(category)
        elif threshold.review is not None and score >= threshold.review:
            review.append(category)
    return blocked, review


def evaluate(text: str, policy: Policy, *, stop_at_block: bool = True) -> Verdict:
    """Run the chain on `text`. A backend that fails is logged and named in `failed`; a
    later backend is skipped once the text is already blocked (when `stop_at_block`)."""
    started = time.perf_counter()
    merged: Scores = {}
    ran: list[str] = []
    failed: list[str] = []
    for classifier in policy.classifiers:
        try:
            scores = clamp(classifier.classify(text))
        except ClassifierError as exc:
            logger.warning("moderation backend %s failed: %s", classifier.name, exc)
            failed.append(classifier.name)
            continue
        except Exception:
            logger.exception("moderation backend %s failed", classifier.name)
            failed.append(classifier.name)
            continue
        ran.append(classifier.name)
        for category, score in scores.items():
            merged[category] = max(score, merged.get(category, 0.0))
        if stop_at_block and decide(merged, policy.thresholds)[0]:
            break
    blocked, review = decide(merged, policy.thresholds)
    return Verdict(
        scores={category: round(score, 4) for category, score in merged.items()},
        blocked=blocked,
        review=review,
        backends=ran,
        failed=failed,
        seconds=time.perf_counter() - started,
    )
