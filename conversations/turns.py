"""A chat turn end to end: the request path of ARCHITECTURE.md, steps 1-6, in one place.

The web chat, the JSON API and the OpenAI-compatible API all call these, so a message is
checked, stored and queued the same way whichever door it came through. The tree write and
the generation row share one transaction; the job reaches the queue only after it commits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction

from billing.selectors import user_tier
from inference.models import Generation
from inference.services import generation_start, generations_abandon, pool_for_model

from . import services
from .models import Conversation, Message


@dataclass(frozen=True)
class Turn:
    """What a send, edit or regenerate produced."""

    conversation: Conversation
    user_message: Message | None
    assistant_message: Message
    generation: Generation


def conversation_start(
    *,
    user: User,
    model: str | None = None,
    system_prompt: str = "",
    title: str = "",
    source: str = Conversation.Source.WEB,
) -> Conversation:
    """Start a conversation with a model the user's plan may use."""
    model = (model or settings.DEFAULT_MODEL).strip()
    pool_for_model(model=model, tier=user_tier(user=user))
    return services.conversation_create(
        owner=user, model=model, system_prompt=system_prompt, title=title, source=source
    )


def conversation_remove(*, conversation: Conversation) -> None:
    """Delete a conversation; answers still queued or streaming for it are stopped."""
    with transaction.atomic():
        in_flight = list(
            Generation.objects.filter(conversation=conversation)
            .exclude(status__in=Generation.FINAL_STATUSES)
            .select_related("pool")
        )
        services.conversation_delete(conversation=conversation)
        if in_flight:
            transaction.on_commit(lambda: generations_abandon(generations=in_flight))


def turn_send(
    *,
    user: User,
    conversation: Conversation,
    content: str,
    parent: Message | Any | None = None,
) -> Turn:
    """Add a user message under `parent` (default: the current leaf) and queue its answer."""
    with transaction.atomic():
        user_message, placeholder = services.message_send(
            conversation=conversation, content=content, parent=parent
        )
        generation = generation_start(message=placeholder, user=user, tier=user_tier(user=user))
    return Turn(conversation, user_message, placeholder, generation)


def turn_edit(*, user: User, message: Message, content: str) -> Turn:
    """Fork at an earlier user message with new content and queue the new answer."""
    with transaction.atomic():
        user_message, placeholder = services.message_edit(message=message, content=content)
        generation = generation_start(message=placeholder, user=user, tier=user_tier(user=user))
    return Turn(message.conversation, user_message, placeholder, generation)


def turn_regenerate(*, user: User, message: Message) -> Turn:
    """Queue a new answer beside the assistant `message`."""
    with transaction.atomic():
        placeholder = services.message_regenerate(message=message)
        generation = generation_start(message=placeholder, user=user, tier=user_tier(user=user))
    return Turn(message.conversation, None, placeholder, generation)
