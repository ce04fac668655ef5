"""Removing a conversation: the one way, whoever asks (the API, admin, retention, `/v1`).

`conversation_remove` deletes every message and with them, by cascade, their generations,
summaries and whatever indexes them (search). Answers still queued or streaming are stopped
and their reservations given back (an abandoned answer is not charged). After commit the
conversation's Redis keys go (the generations' event streams and jobs, the worker affinity,
a pending summary claim) and the owner's open pages hear of it. Usage stays only in
billing's ledger (`UsageEvent` keeps the generation id, not a foreign key) and statements.

By default the row stays as a content-free tombstone; `keep_tombstone=False` leaves none
(the `/v1` requests of keys that do not keep their conversations).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from django.db import transaction
from django.db.models import ProtectedError, RestrictedError
from django.utils import timezone

from billing.services import reservation_release
from chatsite.redis import sync_redis
from chatsite.stream_events import StreamEvent
from inference import queue
from inference.models import Generation
from inference.services import generations_abandon

from .events import user_event_publish
from .models import Conversation, Message
from .summaries import summary_pending_key

# How long the closing `done` of an answer cut short by a deletion stays for its watchers.
ABANDONED_STREAM_SECONDS = 60


def conversation_remove(*, conversation: Conversation, keep_tombstone: bool = True) -> None:
    """Remove `conversation` and everything that hangs on it; removing it again does nothing."""
    with transaction.atomic():
        generations = list(
            Generation.objects.filter(conversation=conversation).select_related("pool")
        )
        in_flight = [generation for generation in generations if not generation.is_final]
        if keep_tombstone or not _drop_row(conversation):
            _wipe(conversation)
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


def _wipe(conversation: Conversation) -> None:
    """Delete every message and the conversation's content, keeping only a tombstone."""
    with transaction.atomic():
        conversation.refresh_from_db(from_queryset=Conversation.objects.select_for_update())
        if conversation.deleted_at is not None:
            return
        conversation.current_leaf = None
        conversation.title = ""
        conversation.title_set_by_user = False
        conversation.system_prompt = ""
        conversation.deleted_at = timezone.now()
        conversation.save(
            update_fields=[
                "current_leaf",
                "title",
                "title_set_by_user",
                "system_prompt",
                "deleted_at",
                "updated_at",
            ]
        )
        Message.objects.filter(conversation=conversation).delete()


def _drop_row(conversation: Conversation) -> bool:
    """Delete the conversation and, by cascade, everything on it; True once it is gone.
    False when other rows must keep pointing at it (a protected reference): it stays, for
    the caller to wipe to a content-free tombstone."""
    try:
        with transaction.atomic():
            # Locked first, as a send locks it: no message can join it while it goes.
            row = Conversation.objects.select_for_update().filter(pk=conversation.pk).first()
            if row is not None:
                row.delete()
    except (ProtectedError, RestrictedError):
        return False
    return True


def _abandon(generations: list[Generation]) -> None:
    generations_abandon(generations=generations)
    for generation in generations:
        reservation_release(user_id=generation.user_id, reservation_id=str(generation.pk))


def conversation_forget_redis(
    *,
    conversation_id: Any,
    owner_id: Any,
    generation_ids: Iterable[Any],
    in_flight_ids: Collection[Any] = (),
) -> None:
    """Delete a removed conversation's keys and tell its owner's open pages.

    Every generation's stream and job go, with their text. An answer still in flight was
    cancelled just before (`generations_abandon`, while its job could still carry the cancel
    flag); its stream is left holding only a `done` event for the tabs still watching, and
    expires within a minute. A scheduler finishing it later finds the rows gone and deletes
    whatever it wrote meanwhile.
    """
    keys = [queue.affinity_key(conversation_id), summary_pending_key(conversation_id)]
    for generation_id in generation_ids:
        keys += [queue.stream_key(generation_id), queue.job_key(generation_id)]
        if generation_id not in in_flight_ids:
            # A watcher of one in flight still counts itself out of this key (it expires).
            keys.append(queue.key("watchers", generation_id))
    redis = sync_redis()
    try:
        redis.delete(*keys)
        for generation_id in in_flight_ids:
            gid = str(generation_id)
            done = {"status": "cancelled", "finish_reason": "conversation_deleted"}
            queue.append_event(redis, gid, StreamEvent.DONE, done)
            redis.expire(queue.stream_key(gid), ABANDONED_STREAM_SECONDS)
    finally:
        redis.close()
    user_event_publish(
        user_id=owner_id, event="deleted", data={"conversation_id": str(conversation_id)}
    )
