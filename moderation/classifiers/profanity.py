"""alt-profanity-check's model, evaluated without scikit-learn's per-call overhead.

The wheel ships a TF-IDF vectorizer and a linear SVM calibrated five times over
(`CalibratedClassifierCV`, sigmoid). `predict_prob` on one message costs about 6 ms of CPU,
nearly all of it scikit-learn validating its input and building sparse matrices; the model
itself is a few dozen multiplications. `ProfanityModel` reads the same fitted parameters
once and computes the same probability: the vectorizer's own analyzer, term counts times
the idf, l2-normalised, then for each calibrated classifier `w·x + b` through its sigmoid,
averaged. The suite checks it against `predict_prob` on a corpus of texts.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

import numpy as np


class ProfanityModel:
    """The probability that a text is profane, as `profanity_check.predict_prob` gives it."""

    def __init__(self, vectorizer: Any, model: Any) -> None:
        if (vectorizer.norm, vectorizer.use_idf, vectorizer.sublinear_tf, vectorizer.binary) != (
            "l2",
            True,
            False,
            False,
        ):
            raise ValueError("the profanity vectorizer is not the plain l2 TF-IDF this expects")
        if list(model.classes_) != [0, 1] or model.method != "sigmoid":
            raise ValueError("the profanity model is not a binary sigmoid-calibrated one")
        self._analyze = vectorizer.build_analyzer()
        self._vocabulary: dict[str, int] = vectorizer.vocabulary_
        self._idf = np.asarray(vectorizer.idf_, dtype=np.float64)
        calibrated = model.calibrated_classifiers_
        # One row per calibrated classifier: its weights, intercept and sigmoid (a, b).
        self._weights = np.vstack([c.estimator.coef_.ravel() for c in calibrated])
        self._intercepts = np.array([float(c.estimator.intercept_[0]) for c in calibrated])
        self._a = np.array([float(c.calibrators[0].a_) for c in calibrated])
        self._b = np.array([float(c.calibrators[0].b_) for c in calibrated])

    def probability(self, text: str) -> float:
        counts = collections.Counter(
            index
            for term in self._analyze(text)
            if (index := self._vocabulary.get(term)) is not None
        )
        if counts:
            columns = np.fromiter(counts.keys(), dtype=np.intp, count=len(counts))
            values = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
            values *= self._idf[columns]
            values /= np.sqrt(values @ values)
            decisions = self._weights[:, columns] @ values + self._intercepts
        else:
            decisions = self._intercepts
        # scikit-learn's _SigmoidCalibration: P(profane) = 1 / (1 + exp(a·d + b)).
        return float(np.mean(1.0 / (1.0 + np.exp(self._a * decisions + self._b))))


_model: ProfanityModel | None = None
_lock = threading.Lock()


def model() -> ProfanityModel:
    """The wheel's model, loaded once per process (on first use: it loads scikit-learn)."""
    global _model
    with _lock:
        if _model is None:
            from profanity_check import profanity_check as shipped

            _model = ProfanityModel(shipped.vectorizer, shipped.model)
        return _model
