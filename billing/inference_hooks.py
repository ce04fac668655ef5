"""Billing's subscription to the inference plane: a finished generation's usage is settled."""

from __future__ import annotations

from inference.hooks import InferenceHooks, Outcome
from inference.models import Generation

from .services import generation_settle


class BillingHooks(InferenceHooks):
    """Once a generation is final: its usage event, and the reservation settled with it."""

    def generation_finished(self, *, generation: Generation, outcome: Outcome) -> None:
        generation_settle(generation=generation)
