"""What the inference plane tells the rest of the service: a small registry of subscribers.

`inference/` knows nothing of conversations, billing, moderation or plugins. It reports what
happens to a generation by calling the hooks below on every subscriber named in
`settings.INFERENCE_HOOKS` (dotted paths to `InferenceHooks` subclasses, in order), the way
Saleor's plugin manager or Django's authentication backends work. A subscriber overrides the
methods it cares about; the base class does nothing. An unknown dotted path stops the process
at start (`InferenceConfig.ready`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from django.conf import settings

from chatsite import dotted

if TYPE_CHECKING:
    from .models import Generation
    from .unkept import UnkeptGeneration


@dataclass(frozen=True)
class Outcome:
    """How a generation ended, as `generation_finish` records it."""

    status: str
    text: str
    finish_reason: str
    prompt_tokens: int | None
    output_tokens: int | None
    cached_tokens: int | None


class InferenceHooks:
    """One subscriber to the inference plane. Every method does nothing here."""

    def generation_first_token(self, *, generation_id: Any) -> None:
        """The answer's first token arrived: it is now visibly streaming."""

    def generations_routed(self, *, generation_ids: list[str], route: dict[str, str]) -> None:
        """The overload policy sent these queued generations to another pool: `route` holds
        its name (`model`), why (`reason`) and what the user is shown (`notice`)."""

    def generation_tool_round(
        self,
        *,
        generation_id: Any,
        text: str,
        tool_calls: list[dict[str, Any]],
        results: list[dict[str, Any]],
    ) -> bool:
        """The scheduler ran the tools the model called: keep the round. False when the
        generation ended or its transcript is gone meanwhile (it is then not continued)."""
        return True

    def generation_tool_calls(
        self, *, generation_id: Any, tool_calls: list[dict[str, Any]]
    ) -> None:
        """The answer ended at tool calls for the client (`/v1`) to run."""

    def generation_finishing(self, *, generation: Generation, outcome: Outcome) -> None:
        """The generation reaches its final state. Called inside the transaction that writes
        it, with the row locked: rows written here commit with it (or not at all); side
        effects go out with `transaction.on_commit`."""

    def generation_finished(
        self,
        *,
        generation: Generation | UnkeptGeneration,
        outcome: Outcome,
        flush_follows: bool = False,
    ) -> None:
        """The final state is committed; the stream's `done` event goes out after this. For a
        generation without a row (an `inference.unkept.UnkeptGeneration`), the only hook of
        its finish: write what must last of it without waiting for a statement (batch it).
        `flush_follows`: the caller, a scheduler replica, calls `generations_flush` about a
        second after, so what must last of a generation with a row may be batched too."""

    def generations_flush(self) -> None:
        """Write, in one batch, what the finishes of generations without a row left to write
        (`generation_finished`). The scheduler calls it about a second after it finished
        some, and once as it starts (what a replica that died left)."""

    def generation_output_flagged(
        self, *, generation_id: Any, user_id: int, excerpt: str, verdict: Any, retracted: bool
    ) -> None:
        """Output moderation withdrew `user_id`'s answer (`retracted`) or asked staff to
        review it (an unkept generation has no row that would name the user)."""


class HookManager:
    """Calls each subscriber in turn."""

    def __init__(self, subscribers: Sequence[InferenceHooks]) -> None:
        self.subscribers = list(subscribers)

    def generation_first_token(self, *, generation_id: Any) -> None:
        for subscriber in self.subscribers:
            subscriber.generation_first_token(generation_id=generation_id)

    def generations_routed(self, *, generation_ids: list[str], route: dict[str, str]) -> None:
        for subscriber in self.subscribers:
            subscriber.generations_routed(generation_ids=generation_ids, route=route)

    def generation_tool_round(
        self,
        *,
        generation_id: Any,
        text: str,
        tool_calls: list[dict[str, Any]],
        results: list[dict[str, Any]],
    ) -> bool:
        kept = True
        for subscriber in self.subscribers:
            kept = (
                subscriber.generation_tool_round(
                    generation_id=generation_id, text=text, tool_calls=tool_calls, results=results
                )
                and kept
            )
        return kept

    def generation_tool_calls(
        self, *, generation_id: Any, tool_calls: list[dict[str, Any]]
    ) -> None:
        for subscriber in self.subscribers:
            subscriber.generation_tool_calls(generation_id=generation_id, tool_calls=tool_calls)

    def generation_finishing(self, *, generation: Generation, outcome: Outcome) -> None:
        for subscriber in self.subscribers:
            subscriber.generation_finishing(generation=generation, outcome=outcome)

    def generation_finished(
        self,
        *,
        generation: Generation | UnkeptGeneration,
        outcome: Outcome,
        flush_follows: bool = False,
    ) -> None:
        for subscriber in self.subscribers:
            subscriber.generation_finished(
                generation=generation, outcome=outcome, flush_follows=flush_follows
            )

    def generations_flush(self) -> None:
        for subscriber in self.subscribers:
            subscriber.generations_flush()

    def generation_output_flagged(
        self, *, generation_id: Any, user_id: int, excerpt: str, verdict: Any, retracted: bool
    ) -> None:
        for subscriber in self.subscribers:
            subscriber.generation_output_flagged(
                generation_id=generation_id,
                user_id=user_id,
                excerpt=excerpt,
                verdict=verdict,
                retracted=retracted,
            )


def load_hooks(paths: Sequence[str]) -> HookManager:
    """The manager of the subscribers at `paths`; ImproperlyConfigured names a bad one."""
    return HookManager([dotted.build("INFERENCE_HOOKS", path, InferenceHooks) for path in paths])


@cache
def _configured(paths: tuple[str, ...]) -> HookManager:
    return load_hooks(paths)


def get_hooks() -> HookManager:
    """The subscribers `settings.INFERENCE_HOOKS` names (loaded once per setting value)."""
    return _configured(tuple(settings.INFERENCE_HOOKS))
