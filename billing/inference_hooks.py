"""Billing's subscription to the inference plane: a finished generation's usage is settled."""

from __future__ import annotations

from inference.hooks import InferenceHooks, Outcome
from inference.models import Generation
from inference.unkept import UnkeptGeneration

from .ledger import ledger_flush
from .services import generation_settle


class BillingHooks(InferenceHooks):
    """Once a generation is final: its reservation settled, and its usage event written, or
    owed to the ledger's outbox until a flush (one without a row, or one that a scheduler
    replica finished: it flushes a second later)."""

    def generation_finished(
        self,
        *,
        generation: Generation | UnkeptGeneration,
        outcome: Outcome,
        flush_follows: bool = False,
    ) -> None:
        generation_settle(generation=generation, batched=flush_follows)

    def generations_flush(self) -> None:
        ledger_flush()
