"""Build what a dotted-path setting names: the inference hooks, the placement policy, the tool
runner, the output guard, the conversation's tools.

One place turns a setting's value into an object, so each of them refuses a bad value the
same way: `ImproperlyConfigured`, naming the setting and the value, when the process starts
(the apps' `ready()` build them once).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string


def load(setting: str, path: str) -> Any:
    """The object at `path`; ImproperlyConfigured if it cannot be imported."""
    try:
        return import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(f"{setting}: cannot import {path!r} ({exc}).") from exc


def load_callable(setting: str, path: str) -> Callable[..., Any]:
    """The function at `path`; ImproperlyConfigured if there is none."""
    target = load(setting, path)
    if not callable(target):
        raise ImproperlyConfigured(f"{setting}: {path!r} is not callable.")
    return cast(Callable[..., Any], target)


def build(setting: str, path: str, protocol: type[Any]) -> Any:
    """An instance of the class at `path` that satisfies `protocol` (a runtime-checkable
    Protocol); ImproperlyConfigured otherwise."""
    cls = load(setting, path)
    instance = cls() if isinstance(cls, type) else None
    if not isinstance(instance, protocol):
        raise ImproperlyConfigured(
            f"{setting}: {path!r} is not a class implementing "
            f"{protocol.__module__}.{protocol.__qualname__}."
        )
    return instance
