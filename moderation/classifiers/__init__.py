"""Moderation backends, chosen and chained by dotted path in `settings.MODERATION_BACKENDS`.

Each backend scores a text in the same taxonomy; the chain's score for a category is the
highest any backend gave (see `moderation.engine`).
"""

from __future__ import annotations

from functools import lru_cache

from django.conf import settings
from django.utils.module_loading import import_string

from .base import Classifier, ClassifierError, Scores, clamp

__all__ = ["Classifier", "ClassifierError", "Scores", "clamp", "configured_classifiers"]


def configured_classifiers() -> tuple[Classifier, ...]:
    """One instance of each configured backend per process, in the configured order."""
    return _instances(tuple(settings.MODERATION_BACKENDS))


@lru_cache(maxsize=8)
def _instances(paths: tuple[str, ...]) -> tuple[Classifier, ...]:
    classifiers = []
    for path in paths:
        backend = import_string(path)
        instance = backend()
        if not isinstance(instance, Classifier):
            raise TypeError(f"{path} is not a moderation Classifier")
        classifiers.append(instance)
    return tuple(classifiers)
