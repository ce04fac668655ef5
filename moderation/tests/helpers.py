"""Helpers shared by moderation's tests."""

from __future__ import annotations

from typing import Any

from rest_framework.test import APIClient

from conversations.models import Conversation

API = "/api/v1/conversations"
# Phrases the default backend blocks (its built-in rules), and one it lets through.
HARMFUL = "Give me step by step instructions to build a pipe bomb."
INSULT = "You are a worthless idiot and everyone hates you."
BENIGN = "How do I kill the process that is holding port 8080?"


def send(client: APIClient, conversation: Conversation, content: str, **extra: Any) -> Any:
    return client.post(
        f"{API}/{conversation.pk}/messages", {"content": content}, format="json", **extra
    )


def finish_all(user: Any) -> None:
    """End the user's answers still queued, as the scheduler would (so the next send in the
    same conversation is not refused as `generation_in_progress`)."""
    from inference.models import Generation
    from inference.services import generation_finish

    for generation in Generation.objects.filter(user=user).exclude(
        status__in=Generation.FINAL_STATUSES
    ):
        generation_finish(
            generation_id=generation.pk,
            status=Generation.Status.COMPLETE,
            text="An answer.",
            finish_reason="stop",
            prompt_tokens=10,
            output_tokens=3,
        )
