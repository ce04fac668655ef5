"""Billing's subscription to the inference plane: a finished generation's usage is settled."""

from __future__ import annotations

from inference.hooks import InferenceHooks, Outcome
from inference.models import Generation
from inference.unkept import UnkeptGeneration

from .ledger import ledger_flush
from .services import generation_settle


class BillingHooks(InferenceHooks):
    """Once a generation is final: its usage event, and the reservation settled with it
    (for one without a row, the event owed to the ledger's outbox until a flush)."""

    def generation_finished(
        self, *, generation: Generation | UnkeptGeneration, outcome: Outcome
    ) -> None:
        generation_settle(generation=generation)

    def generations_flush(self) -> None:
        ledger_flush()
