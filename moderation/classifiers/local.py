"""The default backend: offline, on the CPU. `alt-profanity-check` (a linear model shipped in
its wheel, evaluated by `profanity.ProfanityModel`) scores profanity, and harassment where the
text addresses someone; rule lists (built in, from settings, and staff's in admin) score every
category.

A text's score in a category is the highest of the model's and of every rule that matches, so
rules of one category and score are searched as one alternation (`RuleSet`): 73 built-in
rules become 31 searches per variant of the text.
"""

from __future__ import annotations

import itertools
import logging
import re
import threading
from dataclasses import dataclass

from django.conf import settings

from moderation import selectors
from moderation.categories import Category
from moderation.rules import BUILTIN_RULES, CompiledRule, compile_rule, deobfuscate, normalise

from . import profanity
from .base import Classifier, Scores

logger = logging.getLogger(__name__)

# Profanity aimed at someone is harassment; the model alone is not sure enough to block it
# (thresholds decide), so it weighs in below a rule's certainty.
_ADDRESSED = re.compile(r"\b(?:you|your|you're|youre|u|ur|yourself)\b")
ADDRESSED_WEIGHT = 0.75
UNADDRESSED_WEIGHT = 0.5


@dataclass(frozen=True)
class RuleSet:
    """Rules as searches: one per (category, score) for the rules an alternation keeps
    exact, one per rule for the others (references to a group, whose number an alternation
    would shift, named groups, flags of their own), highest score first."""

    searches: tuple[tuple[str, float, re.Pattern[str]], ...]

    @classmethod
    def of(cls, rules: tuple[CompiledRule, ...]) -> RuleSet:
        merged: dict[tuple[str, float], list[str]] = {}
        alone: list[tuple[str, float, re.Pattern[str]]] = []
        for rule in rules:
            pattern = rule.pattern
            if (
                pattern.groupindex
                or pattern.flags != _MERGEABLE_FLAGS
                or _REFERENCE.search(pattern.pattern)
            ):
                alone.append((rule.category, rule.score, pattern))
            else:
                merged.setdefault((rule.category, rule.score), []).append(pattern.pattern)
        searches = alone + [
            (category, score, re.compile("|".join(f"(?:{p})" for p in patterns), re.IGNORECASE))
            for (category, score), patterns in merged.items()
        ]
        return cls(tuple(sorted(searches, key=lambda search: -search[1])))

    def score(self, scores: Scores, variants: set[str]) -> None:
        """Raise each category in `scores` to the highest score of a rule that matches."""
        for category, score, pattern in self.searches:
            if scores.get(category, 0.0) >= score:
                continue
            if any(pattern.search(variant) for variant in variants):
                scores[category] = score


# What may refer to a group by number or name: \1, (?P=name), (?(1)...). A false alarm only
# keeps the rule a search of its own.
_REFERENCE = re.compile(r"\\[1-9]|\(\?P=|\(\?\(")
_MERGEABLE_FLAGS = re.compile("", re.IGNORECASE).flags
_RULE_SETS = itertools.count()


class LocalClassifier(Classifier):
    """alt-profanity-check plus rule lists."""

    name = "local"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._static = self._static_rules()
        self._staff: tuple[CompiledRule, ...] = ()
        self._rule_set = RuleSet.of(self._static)
        # Names the rule set, unique in the process: a text's scores depend on it and the
        # model alone.
        self._version = next(_RULE_SETS)

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

    def warm(self) -> None:
        profanity.model()

    def refresh(self) -> None:
        """Staff's rules as the catalog keeps them: the rule set is rebuilt only when they
        changed (a new tuple, read after a change; the same rules read again while Redis is
        away are the same rules)."""
        staff = selectors.staff_rules()
        if staff is self._staff or staff == self._staff:
            return
        with self._lock:
            self._staff = staff
            self._rule_set = RuleSet.of(self._static + self._staff)
            self._version = next(_RULE_SETS)

    def memo_key(self) -> int:
        return self._version

    def rule_set(self) -> RuleSet:
        with self._lock:
            return self._rule_set

    def classify(self, text: str) -> Scores:
        return self.classify_many([text])[0]

    def classify_many(self, texts: list[str]) -> list[Scores]:
        """Score several texts."""
        rule_set = self.rule_set()
        scorer = profanity.model()
        results = []
        for text in texts:
            profanity_score = scorer.probability(text)
            normalised = normalise(text)
            variants = {normalised, deobfuscate(normalised)}
            addressed = bool(_ADDRESSED.search(normalised))
            scores: Scores = {
                Category.PROFANITY: profanity_score,
                Category.HARASSMENT: profanity_score
                * (ADDRESSED_WEIGHT if addressed else UNADDRESSED_WEIGHT),
            }
            rule_set.score(scores, variants)
            results.append({str(k): v for k, v in scores.items()})
        return results
