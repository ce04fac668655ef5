"""A chat turn end to end: the request path of ARCHITECTURE.md, steps 1-6, in one place.

The web chat, the JSON API and the OpenAI-compatible API all call these, so a message is
checked, stored and queued the same way whichever door it came through. The tree write and
the generation row share one transaction; the job reaches the queue only after it commits.

Billing wraps each turn: an `Idempotency-Key` replays the turn it already made (charged
once); the plan must include the model; the generation's reservation (made by
`generation_start` once the prompt is counted) is given back if the transaction fails.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction

from billing.selectors import plan_allows_model, plan_for_user
from billing.services import (
    idempotency_claim,
    idempotency_complete,
    idempotency_fingerprint,
    idempotency_release,
    reservation_release,
)
from inference.models import Generation
from inference.services import generation_start, generations_abandon, pool_for_model
from moderation.models import Flag
from moderation.services import flag_record, moderation_check_input, moderation_ensure_can_send

from . import services
from .models import Conversation, Message
from .retention import conversation_forget_redis


@dataclass(frozen=True)
class Turn:
    """What a send, edit or regenerate produced."""

    conversation: Conversation
    user_message: Message | None
    assistant_message: Message
    generation: Generation
    replayed: bool = False


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
    plan = plan_for_user(user=user)
    pool_for_model(model=model, tier=plan.tier)
    plan_allows_model(plan=plan, model=model)
    return services.conversation_create(
        owner=user, model=model, system_prompt=system_prompt, title=title, source=source
    )


def conversation_remove(*, conversation: Conversation) -> None:
    """Delete a conversation; answers still queued or streaming for it are stopped, and
    their reservations given back (an abandoned answer is not charged). Its Redis keys go
    after commit, and the owner's open pages hear of it (conversations/retention.py)."""
    with transaction.atomic():
        generations = list(
            Generation.objects.filter(conversation=conversation).select_related("pool")
        )
        in_flight = [generation for generation in generations if not generation.is_final]
        services.conversation_delete(conversation=conversation)
        if in_flight:
            transaction.on_commit(lambda: _abandon(in_flight))
        transaction.on_commit(
            lambda: conversation_forget_redis(
                conversation_id=conversation.pk,
                owner_id=conversation.owner_id,
                generation_ids=[generation.pk for generation in generations],
                in_flight_ids={generation.pk for generation in in_flight},
            ),
            robust=True,
        )


def _abandon(generations: list[Generation]) -> None:
    generations_abandon(generations=generations)
    for generation in generations:
        reservation_release(user_id=generation.user_id, reservation_id=str(generation.pk))


def turn_send(
    *,
    user: User,
    conversation: Conversation,
    content: str,
    parent: Message | Any | None = None,
    idempotency_key: str | None = None,
) -> Turn:
    """Add a user message under `parent` (default: the current leaf) and queue its answer."""
    parent_id = parent.pk if isinstance(parent, Message) else parent
    return _queued_turn(
        user=user,
        conversation=conversation,
        write=lambda: services.message_send(
            conversation=conversation, content=content, parent=parent
        ),
        content=content,
        idempotency_key=idempotency_key,
        request={
            "action": "send",
            "conversation": conversation.pk,
            "content": content,
            "parent": parent_id,
        },
    )


def turn_edit(
    *, user: User, message: Message, content: str, idempotency_key: str | None = None
) -> Turn:
    """Fork at an earlier user message with new content and queue the new answer."""
    return _queued_turn(
        user=user,
        conversation=message.conversation,
        write=lambda: services.message_edit(message=message, content=content),
        content=content,
        idempotency_key=idempotency_key,
        request={"action": "edit", "message": message.pk, "content": content},
    )


def turn_regenerate(*, user: User, message: Message, idempotency_key: str | None = None) -> Turn:
    """Queue a new answer beside the assistant `message`."""
    return _queued_turn(
        user=user,
        conversation=message.conversation,
        write=lambda: (None, services.message_regenerate(message=message)),
        content=None,
        idempotency_key=idempotency_key,
        request={"action": "regenerate", "message": message.pk},
    )


_Write = Callable[[], tuple[Message | None, Message]]


def _queued_turn(
    *,
    user: User,
    conversation: Conversation,
    write: _Write,
    content: str | None,
    idempotency_key: str | None,
    request: dict[str, Any],
    max_tokens: int | None = None,
    params: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: str | dict[str, Any] | None = None,
) -> Turn:
    """Run `write` (the tree change) and start its generation, once per idempotency key.

    `content` is the new user text the turn adds (None when it adds none, as a regenerate).
    `max_tokens` (at most the plan's) and `params` (sampling: temperature, top_p, stop) are
    the caller's wishes for the answer; `tools` and `tool_choice` a `/v1` client's own tools
    (`generation_start`).
    """
    options: dict[str, Any] = {
        "max_tokens": max_tokens,
        "params": params,
        "tools": tools,
        "tool_choice": tool_choice,
    }
    if idempotency_key is None:
        return _write_and_start(
            user=user, conversation=conversation, write=write, content=content, **options
        )
    fingerprint = idempotency_fingerprint(request)
    stored = idempotency_claim(user=user, key=idempotency_key, fingerprint=fingerprint)
    if stored is not None:
        replay = _replay(stored)
        if replay is not None:
            return replay
        # What the key made is gone (its conversation was deleted): run the request again,
        # which answers as it would without the key.
    try:
        turn = _write_and_start(
            user=user, conversation=conversation, write=write, content=content, **options
        )
    except BaseException:
        idempotency_release(user=user, key=idempotency_key, fingerprint=fingerprint)
        raise
    idempotency_complete(
        user=user,
        key=idempotency_key,
        fingerprint=fingerprint,
        result={
            "conversation": str(turn.conversation.pk),
            "user_message": str(turn.user_message.pk) if turn.user_message else None,
            "assistant_message": str(turn.assistant_message.pk),
            "generation": str(turn.generation.pk),
        },
    )
    return turn


def _write_and_start(
    *,
    user: User,
    conversation: Conversation,
    write: _Write,
    content: str | None,
    max_tokens: int | None = None,
    params: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: str | dict[str, Any] | None = None,
) -> Turn:
    # Moderation (issue 6), before anything is written or reserved: a suspended account is
    # refused every send, and a blocked text costs nothing and never reaches a worker. The
    # flag of a blocked text commits on its own here, so it survives the refusal.
    moderation_ensure_can_send(user=user)
    plan = plan_for_user(user=user)
    plan_allows_model(plan=plan, model=conversation.model)
    verdict = None
    if content is not None and content.strip() and len(content) <= settings.MESSAGE_MAX_CHARS:
        verdict = moderation_check_input(user=user, conversation=conversation, content=content)
    generation: Generation | None = None
    try:
        with transaction.atomic():
            user_message, placeholder = write()
            generation = generation_start(
                message=placeholder,
                user=user,
                tier=plan.tier,
                max_tokens=min(max_tokens or plan.max_output_tokens, plan.max_output_tokens),
                params=params,
                tools=tools,
                tool_choice=tool_choice,
            )
    except BaseException:
        if generation is not None:
            # The rows rolled back after the reservation was made: give it back now.
            reservation_release(user_id=user.pk, reservation_id=str(generation.pk))
        raise
    if verdict is not None and verdict.needs_review and user_message is not None:
        flag_record(
            user=user,
            conversation=conversation,
            message=user_message,
            direction=Flag.Direction.INPUT,
            excerpt=user_message.content,
            verdict=verdict,
            action=Flag.Action.REVIEW,
        )
    return Turn(conversation, user_message, placeholder, generation)


def _replay(stored: dict[str, Any]) -> Turn | None:
    """The turn an idempotency key already made, or None if it no longer exists."""
    generation = (
        Generation.objects.select_related("conversation", "message")
        .filter(pk=stored["generation"])
        .first()
    )
    if generation is None:
        return None
    user_message = (
        Message.objects.filter(pk=stored["user_message"]).first()
        if stored["user_message"]
        else None
    )
    return Turn(generation.conversation, user_message, generation.message, generation, True)


def turn_from_messages(
    *,
    user: User,
    model: str,
    system_prompt: str,
    messages: Sequence[services.BranchTurn],
    max_tokens: int | None = None,
    params: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: str | dict[str, Any] | None = None,
    idempotency_key: str | None = None,
) -> Turn:
    """A new conversation from a client that sends the whole of it with every request (the
    OpenAI-compatible API), and its answer queued.

    `messages` are the user, assistant and tool turns, oldest first, ending with the user
    turn to answer or the results of the client's tool calls (see
    `services.conversation_write_branch`); `tools` and `tool_choice` the client's own tools,
    whose calls end the answer for the client to run. The turns become one linear branch
    under the `system_prompt`, in a conversation marked as coming from the API. The turn
    takes the same path as the web chat's: plan, input checks, reservation, scheduler. On a
    refusal the conversation is removed again, so a refused request leaves nothing behind.
    """
    conversation = conversation_start(
        user=user, model=model, system_prompt=system_prompt, source=Conversation.Source.API
    )
    # Every message here is the client's own text, never checked before: all of it is new.
    written = "\n\n".join(part for part in [system_prompt, *(m[1] for m in messages)] if part)
    try:
        turn = _queued_turn(
            user=user,
            conversation=conversation,
            write=lambda: services.conversation_write_branch(
                conversation=conversation, messages=messages
            ),
            content=written,
            idempotency_key=idempotency_key,
            request={
                "action": "messages",
                "model": model,
                "system_prompt": system_prompt,
                "messages": [list(message) for message in messages],
                "max_tokens": max_tokens,
                "params": params,
                "tools": tools,
                "tool_choice": tool_choice,
            },
            max_tokens=max_tokens,
            params=params,
            tools=tools,
            tool_choice=tool_choice,
        )
    except BaseException:
        services.conversation_purge(conversation=conversation)
        raise
    if turn.replayed:
        services.conversation_purge(conversation=conversation)
    return turn


def conversation_discard(*, conversation_id: Any) -> bool:
    """Remove a conversation not to be kept once none of its answers is in flight (their
    usage is settled by then); False, leaving it, while one still is."""
    conversation = Conversation.objects.filter(pk=conversation_id).first()
    if conversation is None:
        return True
    in_flight = (
        Generation.objects.filter(conversation=conversation)
        .exclude(status__in=Generation.FINAL_STATUSES)
        .exists()
    )
    if in_flight:
        return False
    services.conversation_purge(conversation=conversation)
    return True
