"""Running the configured classifiers on a text and deciding what their scores mean.

`policy()` gathers what a check needs from the database (thresholds, each backend's
`refresh`); `evaluate()` then runs without the database, so the scheduler can run it off its
event loop in any thread.

A `/v1` request carries its whole conversation each time: the same system prompt and the
earlier messages come back with every turn. `evaluate_parts` checks such a text part by part,
and a backend whose scores depend on the text alone (`Classifier.memo_key`) is not asked again
for a part it scored before: its scores are kept in `SCORES`, a bounded LRU keyed by a digest
of the part (never the text itself). Thresholds are applied to them afresh each time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from django.conf import settings

from chatsite.memo import DigestMemo

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
    # For a text checked in parts (`evaluate_parts`): the index of the part that decided.
    part: int = 0

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


SCORES: DigestMemo[Scores] = DigestMemo(settings.MODERATION_MEMO_ENTRIES)


def _scores(classifier: Classifier, text: str, digest: bytes | None) -> Scores:
    """`classifier`'s scores for `text`, from `SCORES` when it scored the same text before
    (`digest` given, and the backend's scores depend on the text alone)."""
    memo_key = classifier.memo_key() if digest is not None else None
    if memo_key is None or digest is None:
        return clamp(classifier.classify(text))
    return SCORES.of(
        ((classifier.name, memo_key), digest), lambda: clamp(classifier.classify(text))
    )


def evaluate(
    text: str, policy: Policy, *, stop_at_block: bool = True, memo: bool = False
) -> Verdict:
    """Run the chain on `text`. A backend that fails is logged and named in `failed`; a
    later backend is skipped once the text is already blocked (when `stop_at_block`). With
    `memo`, scores a backend gave the same text before are reused (`SCORES`): for texts that
    come back, such as a conversation's earlier messages, not for ones seen once."""
    started = time.perf_counter()
    digest = DigestMemo.digest(text) if memo else None
    merged: Scores = {}
    ran: list[str] = []
    failed: list[str] = []
    for classifier in policy.classifiers:
        try:
            scores = _scores(classifier, text, digest)
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


def evaluate_parts(parts: Sequence[str], policy: Policy) -> Verdict:
    """`evaluate` for a text made of parts (a `/v1` request's system prompt and messages),
    each checked on its own with `memo`: a part is judged by what it says, not diluted by a
    long system prompt beside it, and one checked in an earlier turn costs a lookup. The
    verdict's scores are the highest any part reached; its `part` is the one that decided:
    the first blocked (the checks stop there), else the first asking for review, else 0."""
    started = time.perf_counter()
    verdicts: list[Verdict] = []
    for part in parts:
        verdicts.append(evaluate(part, policy, memo=True))
        if verdicts[-1].is_blocked:
            break
    if not verdicts:
        return evaluate("", policy)
    merged: Scores = {}
    for verdict in verdicts:
        for category, score in verdict.scores.items():
            merged[category] = max(score, merged.get(category, 0.0))
    blocked, review = decide(merged, policy.thresholds)
    deciding = next(
        (i for i, verdict in enumerate(verdicts) if verdict.is_blocked),
        next((i for i, verdict in enumerate(verdicts) if verdict.needs_review), 0),
    )
    return Verdict(
        scores=merged,
        blocked=blocked,
        review=review,
        backends=list(dict.fromkeys(name for v in verdicts for name in v.backends)),
        failed=list(dict.fromkeys(name for v in verdicts for name in v.failed)),
        seconds=time.perf_counter() - started,
        part=deciding,
    )
