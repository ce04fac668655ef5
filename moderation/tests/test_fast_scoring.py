"""The local backend's fast paths give the answers of the slow ones they replace: the
profanity model the wheel's `predict_prob` gives, the merged rule searches what each rule
alone gives, on the labelled corpus and on random word salad from the model's vocabulary."""

from __future__ import annotations

import random

import pytest
from profanity_check import predict_prob
from profanity_check import profanity_check as shipped

from moderation.classifiers.local import LocalClassifier, RuleSet
from moderation.classifiers.profanity import model
from moderation.rules import CompiledRule, compile_rule, deobfuscate, normalise

from .test_corpus import load


def texts() -> list[str]:
    development, held_out = load()
    corpus = [text for _, _, text in development + held_out]
    vocabulary = sorted(shipped.vectorizer.vocabulary_)
    rng = random.Random(14)
    salad = [
        " ".join(rng.choice(vocabulary) for _ in range(rng.randint(1, 40))) for _ in range(200)
    ]
    return [*corpus, *salad, "", "   ", "the and of", "Ünïcödé 😀 ßtraße"]


def test_the_profanity_model_gives_the_wheels_probabilities() -> None:
    sample = texts()
    expected = predict_prob(sample)
    scorer = model()
    got = [scorer.probability(text) for text in sample]
    assert got == pytest.approx(list(expected), abs=1e-12)
    # Both ends occur, so the comparison covers more than the intercept.
    assert min(got) < 0.05 and max(got) > 0.95


def rule_by_rule(rules: tuple[CompiledRule, ...], text: str) -> dict[str, float]:
    """The rule loop `RuleSet` replaces: every rule on its own, in order."""
    normalised = normalise(text)
    variants = {normalised, deobfuscate(normalised)}
    scores: dict[str, float] = {}
    for rule in rules:
        if scores.get(rule.category, 0.0) >= rule.score:
            continue
        if any(rule.pattern.search(variant) for variant in variants):
            scores[rule.category] = rule.score
    return scores


@pytest.mark.django_db
def test_merged_rule_searches_score_as_each_rule_alone() -> None:
    # Rules an alternation cannot hold exactly stay searches of their own.
    alone = (
        compile_rule(category="spam", kind="regex", pattern=r"(\w)\1{5}", score=0.9, source="t"),
        compile_rule(category="spam", kind="regex", pattern=r"(?s)buy.now", score=0.8, source="t"),
        compile_rule(
            category="spam", kind="regex", pattern=r"(?P<w>free)\s+money", score=0.7, source="t"
        ),
    )
    rules = (
        *LocalClassifier._static_rules(),
        *alone,
        compile_rule(category="spam", kind="term", pattern="cheap pills", score=0.9, source="t"),
    )
    rule_set = RuleSet.of(rules)
    assert len(rule_set.searches) < len(rules) / 2
    searched = {pattern for _, _, pattern in rule_set.searches}
    assert {rule.pattern for rule in alone} <= searched
    matched = 0
    for text in [*texts(), "aaaaaaa", "BUY\nNOW", "cheap   pills here", "free money"]:
        normalised = normalise(text)
        scores: dict[str, float] = {}
        rule_set.score(scores, {normalised, deobfuscate(normalised)})
        assert scores == rule_by_rule(rules, text), text
        matched += bool(scores)
    assert matched > 50
