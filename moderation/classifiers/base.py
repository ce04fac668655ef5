"""The interface every moderation backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from typing import Any, ClassVar

import httpx

from moderation.categories import CATEGORIES

Scores = dict[str, float]


class ClassifierError(Exception):
    """A backend could not score a text (unreachable, an error answer, an answer it cannot
    read). The caller decides, by `settings.MODERATION_FAIL_CLOSED`, what that means."""


class Classifier(ABC):
    """Scores a text in the one taxonomy (`moderation.categories`), 0..1 per category.

    `classify` never touches the database, so it may run in any thread (the scheduler runs it
    off its event loop); what a backend keeps in the database (staff-edited rules, the workers
    of a pool) it loads in `refresh`, which the caller runs where queries are allowed.
    """

    name: ClassVar[str] = "classifier"

    def refresh(self) -> None:  # noqa: B027 (most backends keep nothing in the database)
        """Reload what this backend reads from the database; cheap when nothing changed."""

    def warm(self) -> None:  # noqa: B027 (most backends load nothing)
        """Load now what the first `classify` would load (a model), so a process pays for
        it as it starts and not in its first user's answer. No database, no network."""

    def memo_key(self) -> Hashable | None:
        """What this backend's scores depend on besides the text (a version of its rules),
        when a text scored once may keep its scores until that changes (`engine.SCORES`);
        None, the default, scores every text afresh (a remote model may change under us)."""
        return None

    @abstractmethod
    def classify(self, text: str) -> Scores:
        """Scores for the categories this backend knows; the others count as 0."""


def clamp(scores: Scores) -> Scores:
    """Only known categories, each within 0..1."""
    return {
        category: min(1.0, max(0.0, float(score)))
        for category, score in scores.items()
        if category in CATEGORIES
    }


def post_json(
    url: str,
    body: dict[str, Any],
    *,
    timeout: float,
    what: str,
    headers: dict[str, str] | None = None,
) -> Any:
    """POST `body` to an HTTP backend and return its JSON answer; anything else (unreachable,
    a status other than 200, a body that is not JSON) is a ClassifierError naming `what`."""
    try:
        response = httpx.post(url, json=body, headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        raise ClassifierError(f"{what} unreachable: {exc}") from exc
    if response.status_code != 200:
        raise ClassifierError(f"{what} answered {response.status_code}")
    try:
        return response.json()
    except ValueError as exc:
        raise ClassifierError(f"{what} sent an unreadable answer") from exc
