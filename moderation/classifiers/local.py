"""The default backend: offline, on the CPU. `alt-profanity-check` (a linear model shipped in
its wheel) scores profanity, and harassment where the text addresses someone; rule lists
(built in, from settings, and staff's in admin) score every category."""

from __future__ import annotations

import logging
import re
import threading
import time

from django.conf import settings

from moderation import selectors
from moderation.categories import Category
from moderation.rules import BUILTIN_RULES, CompiledRule, compile_rule, deobfuscate, normalise

from .base import Classifier, Scores

logger = logging.getLogger(__name__)

# Profanity aimed at someone is harassment; the model alone is not sure enough to block it
# (thresholds decide), so it weighs in below a rule's certainty.
_ADDRESSED = re.compile(r"\b(?:you|your|you're|youre|u|ur|yourself)\b")
ADDRESSED_WEIGHT = 0.75
UNADDRESSED_WEIGHT = 0.5
# Staff rules are re-read at most this often per process (and at once after a change).
RULES_REFRESH_SECONDS = 5.0


def _profanity_scores(texts: list[str]) -> list[float]:
    from profanity_check import predict_prob  # imported late: it loads scikit-learn

    return [float(p) for p in predict_prob(texts)]


class LocalClassifier(Classifier):
    """alt-profanity-check plus rule lists."""

    name = "local"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._static = self._static_rules()
        self._staff: tuple[CompiledRule, ...] = ()
        self._staff_version: str | None = None
        self._checked_at = 0.0

    @staticmethod
    def _static_rules() -> tuple[CompiledRule, ...]:
        rules = []
        if settings.MODERATION_BUILTIN_RULES:
            for category, kind, pattern, score in BUILTIN_RULES:
                rules.append(
                    compile_rule(
                        category=category, kind=kind, pattern=pattern, score=score, source="builtin"
                    )
                )
        for entry in settings.MODERATION_RULES:
            rules.append(
                compile_rule(
                    category=str(entry["category"]),
                    kind=str(entry.get("kind", "term")),
                    pattern=str(entry["pattern"]),
                    score=float(str(entry.get("score", 1.0))),
                    source="settings",
                )
            )
        return tuple(rules)

    def refresh(self) -> None:
        now = time.monotonic()
        version = selectors.rules_version()
        if version == self._staff_version and now - self._checked_at < RULES_REFRESH_SECONDS:
            return
        staff = selectors.compiled_staff_rules()
        with self._lock:
            self._staff, self._staff_version, self._checked_at = tuple(staff), version, now

    def rules(self) -> tuple[CompiledRule, ...]:
        with self._lock:
            return self._static + self._staff

    def classify(self, text: str) -> Scores:
        return self.classify_many([text])[0]

    def classify_many(self, texts: list[str]) -> list[Scores]:
        """Score several texts at once (the profanity model is faster on a batch)."""
        rules = self.rules()
        results = []
        for text, profanity in zip(texts, _profanity_scores(texts), strict=True):
            normalised = normalise(text)
            variants = {normalised, deobfuscate(normalised)}
            addressed = bool(_ADDRESSED.search(normalised))
            scores: Scores = {
                Category.PROFANITY: profanity,
                Category.HARASSMENT: profanity
                * (ADDRESSED_WEIGHT if addressed else UNADDRESSED_WEIGHT),
            }
            for rule in rules:
                if scores.get(rule.category, 0.0) >= rule.score:
                    continue
                if any(rule.pattern.search(variant) for variant in variants):
                    scores[rule.category] = rule.score
            results.append({str(k): v for k, v in scores.items()})
        return results
