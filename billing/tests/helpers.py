"""Helpers shared by billing's tests: sending through the API and finishing by hand."""

from __future__ import annotations

from typing import Any

from rest_framework.test import APIClient

from billing import quota
from chatsite.redis import sync_redis
from conversations.models import Conversation
from inference import queue
from inference.models import Generation
from inference.services import generation_finish

API = "/api/v1/conversations"


def send(
    client: APIClient, conversation: Conversation, content: str = "Hello!", **extra: Any
) -> Any:
    return client.post(
        f"{API}/{conversation.pk}/messages", {"content": content}, format="json", **extra
    )


def finish(
    generation_id: Any,
    *,
    status: str = Generation.Status.COMPLETE,
    text: str = "An answer.",
    prompt_tokens: int | None = 20,
    output_tokens: int | None = 5,
    job: queue.Job | None = None,
) -> None:
    """End a generation through `generation_finish`, as a process other than the scheduler
    does (its usage event written at once), or with `job` as a scheduler replica does."""
    generation_finish(
        generation_id=generation_id,
        status=status,
        text=text,
        finish_reason="stop" if status == Generation.Status.COMPLETE else status,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        job=job,
    )


def finish_as_scheduler(
    generation_id: Any, *, prompt_tokens: int = 20, output_tokens: int = 5
) -> None:
    """End a generation as a scheduler replica does, with the job it ran: its usage event
    is owed to the ledger's outbox until the replica's flush."""
    job = queue.read_job(sync_redis(), generation_id)
    assert job is not None, "its job is queued"
    finish(generation_id, prompt_tokens=prompt_tokens, output_tokens=output_tokens, job=job)


def tokens_left(user: Any, *, tokens_per_minute: int) -> int:
    _, tokens = quota.peek(
        user_id=user.pk,
        requests_per_minute=1,
        tokens_per_minute=tokens_per_minute,
        now=quota.now_ms(),
    )
    return tokens.remaining
