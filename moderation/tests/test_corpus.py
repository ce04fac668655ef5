"""The default backend's precision and recall on a labelled corpus written for these tests
(corpus.tsv). Its second part was written after the rules were frozen and never used to tune
them: its figures are the honest ones for text the rules were not written against."""

from __future__ import annotations

from pathlib import Path

import pytest

from moderation import engine

pytestmark = pytest.mark.django_db

CORPUS = Path(__file__).with_name("corpus.tsv")
HELD_OUT_MARK = "# Held out"


def load() -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    development: list[tuple[str, str, str]] = []
    held_out: list[tuple[str, str, str]] = []
    target = development
    for line in CORPUS.read_text().splitlines():
        if line.startswith(HELD_OUT_MARK):
            target = held_out
        if not line.strip() or line.startswith("#"):
            continue
        label, category, text = line.split("\t")
        assert label in {"block", "allow"}, line
        target.append((label, category, text))
    return development, held_out


def figures(rows: list[tuple[str, str, str]]) -> dict[str, float]:
    policy = engine.policy()
    tp = fp = fn = tn = 0
    for label, _, text in rows:
        blocked = engine.evaluate(text, policy).is_blocked
        if blocked and label == "block":
            tp += 1
        elif blocked:
            fp += 1
        elif label == "block":
            fn += 1
        else:
            tn += 1
    return {
        "n": len(rows),
        "precision": tp / (tp + fp) if tp + fp else 1.0,
        "recall": tp / (tp + fn) if tp + fn else 1.0,
        "false_positive_rate": fp / (fp + tn) if fp + tn else 0.0,
    }


def test_the_corpus_is_big_and_varied() -> None:
    development, held_out = load()
    rows = development + held_out
    assert len(rows) >= 200
    assert sum(label == "block" for label, _, _ in rows) >= 80
    assert sum(label == "allow" for label, _, _ in rows) >= 100
    categories = {category for label, category, _ in rows if label == "block"}
    assert categories >= {f"S{n}" for n in range(1, 15)} | {"harassment"}


def test_default_backend_precision_and_recall(capsys: pytest.CaptureFixture[str]) -> None:
    development, held_out = load()
    table = {
        "all": figures(development + held_out),
        "development": figures(development),
        "held out": figures(held_out),
    }
    with capsys.disabled():
        print("\ndefault backend on the corpus (block decision)")
        print(f"{'part':<12} {'n':>4} {'precision':>10} {'recall':>7} {'FP rate':>8}")
        for part, row in table.items():
            print(
                f"{part:<12} {row['n']:>4.0f} {row['precision']:>10.3f} {row['recall']:>7.3f} "
                f"{row['false_positive_rate']:>8.3f}"
            )
    # Floors: benign text (tricky words included) is almost never blocked; recall is what
    # keyword rules reach on text they were written for. On unseen text the local backend is
    # a weak baseline (see the held-out row): production sites chain Llama Guard.
    assert table["all"]["precision"] >= 0.95
    assert table["all"]["recall"] >= 0.75
    assert table["all"]["false_positive_rate"] <= 0.02
    assert table["held out"]["false_positive_rate"] <= 0.1
