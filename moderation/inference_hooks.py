"""Moderation's subscription to the inference plane: flags of streamed answers."""

from __future__ import annotations

from typing import Any

from inference.hooks import InferenceHooks

from .services import output_flag_record


class ModerationHooks(InferenceHooks):
    """An answer output moderation withdrew, or asked staff to review, gets its flag."""

    def generation_output_flagged(
        self, *, generation_id: Any, user_id: int, excerpt: str, verdict: Any, retracted: bool
    ) -> None:
        output_flag_record(
            generation_id=generation_id,
            user_id=user_id,
            excerpt=excerpt,
            verdict=verdict,
            retracted=retracted,
        )
