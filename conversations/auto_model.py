"""The `auto` model: each turn's pool chosen by how hard the task looks.

A conversation whose model is `settings.AUTO_MODEL` ("auto") has each answer written by the
small pool (`AUTO_MODEL_SMALL`) or the large one (`AUTO_MODEL_LARGE`), as the chooser named
by `AUTO_MODEL_CHOOSER` decides from the request: the plan's tier, the prompt's length, the
message's text. `RuleChooser`, the default, goes by rules; a classifier is a class with the
same `choose` method. The choice and its reason are recorded on the generation and the
answer, and shown with it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Protocol, runtime_checkable

from django.conf import settings

from chatsite import dotted


@dataclass(frozen=True)
class TaskFacts:
    """What a chooser is told of a turn."""

    tier: str
    text: str  # the user's new message
    prompt_tokens: int  # the conversation so far and the message, as last counted


@dataclass(frozen=True)
class Choice:
    pool: str
    reason: str  # one of REASONS


# Why a pool was chosen, as the answer tells it.
REASONS = {
    "code": "it involves code",
    "long_prompt": "the conversation is long",
    "plan": "your plan includes it",
    "simple": "a short question",
    "plan_limit": "the model your plan includes",
}


@runtime_checkable
class PoolChooser(Protocol):
    def choose(self, facts: TaskFacts) -> Choice: ...


# A fenced block, or a line that reads as code: a definition, an import, a statement ending in
# a semicolon or a brace, an arrow function.
_CODE = re.compile(
    r"```|^\s*(def|class|import|from \S+ import|#include|function|public|fn|SELECT)\b"
    r"|[;{}]\s*$|=>",
    re.MULTILINE,
)


def has_code(text: str) -> bool:
    return bool(_CODE.search(text))


class RuleChooser:
    """The large pool for code, for a long prompt and for the tiers that pay for it; the
    small one for the rest."""

    def choose(self, facts: TaskFacts) -> Choice:
        large, small = settings.AUTO_MODEL_LARGE, settings.AUTO_MODEL_SMALL
        if has_code(facts.text):
            return Choice(large, "code")
        if facts.prompt_tokens >= settings.AUTO_MODEL_LONG_PROMPT_TOKENS:
            return Choice(large, "long_prompt")
        if facts.tier in settings.AUTO_MODEL_LARGE_TIERS:
            return Choice(large, "plan")
        return Choice(small, "simple")


@cache
def _chooser(path: str) -> PoolChooser:
    chooser: PoolChooser = dotted.build("AUTO_MODEL_CHOOSER", path, PoolChooser)
    return chooser


def configured_chooser() -> PoolChooser:
    return _chooser(settings.AUTO_MODEL_CHOOSER)


def is_auto(model: str) -> bool:
    return bool(settings.AUTO_MODEL) and model == settings.AUTO_MODEL


def notice(choice: Choice) -> str:
    return f"Auto chose {choice.pool}: {REASONS.get(choice.reason, choice.reason)}."
