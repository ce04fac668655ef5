"""Removing a conversation: the one way, whoever asks (the API, admin, retention, `/v1`).

`conversation_remove` deletes every message and with them, by cascade, their generations,
summaries, attachments and whatever indexes them (search), the files uploaded but not yet
sent, and the memory facts and suggestions derived from the conversation
(conversations/memory.py). Answers still queued or streaming are stopped and their
reservations given back (an abandoned answer is not charged). After commit the
conversation's Redis keys go (the generations' event streams and jobs, the worker affinity,
a pending summary claim) and the owner's open pages hear of it. Usage stays only in
billing's ledger (`UsageEvent` keeps the generation id, not a foreign key) and statements.
Feedback on its answers goes with them, and its share links go too (their pages 404).

By default the row stays as a content-free tombstone; `keep_tombstone=False` leaves none
(the `/v1` requests of keys that do not keep their conversations).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from django.db import connections, models, router, transaction
from django.db.models import ProtectedError, Q, RestrictedError, signals, sql
from django.utils import timezone

from billing.services import reservation_release
from chatsite.redis import sync_redis
from chatsite.stream_events import StreamEvent
from inference import queue
from inference.models import Generation
from inference.services import generations_abandon

from .events import user_event_publish
from .models import Attachment, Conversation, MemoryFact, Message, Share
from .summaries import summary_pending_key

# How long the closing `done` of an answer cut short by a deletion stays for its watchers.
ABANDONED_STREAM_SECONDS = 60


def conversation_remove(
    *, conversation: Conversation, keep_tombstone: bool = True, unless_in_flight: bool = False
) -> bool:
    """Remove `conversation` and everything that hangs on it; removing it again does nothing.
    With `unless_in_flight`, nothing is removed (False) while one of its answers is still
    queued or streaming."""
    with transaction.atomic():
        generations = list(
            Generation.objects.filter(conversation=conversation).select_related("pool")
        )
        in_flight = [generation for generation in generations if not generation.is_final]
        if in_flight and unless_in_flight:
            return False
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
    return True


def _wipe(conversation: Conversation) -> None:
    """Delete every message and the conversation's content, keeping only a tombstone."""
    with transaction.atomic():
        try:
            conversation.refresh_from_db(from_queryset=Conversation.objects.select_for_update())
        except Conversation.DoesNotExist:
            return  # dropped meanwhile (its owner's account): nothing left
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
        # A share is a copy of the messages: it goes with them, its link 404 from now on.
        Share.objects.filter(conversation=conversation).delete()
        # Files uploaded but never sent hang on the conversation, not on a message.
        Attachment.objects.filter(conversation=conversation).delete()
        MemoryFact.objects.filter(conversation=conversation).delete()


def _drop_row(conversation: Conversation) -> bool:
    """Delete the conversation and, by cascade, everything on it; True once it is gone.
    False when other rows must keep pointing at it (a protected reference): it stays, for
    the caller to wipe to a content-free tombstone."""
    plan = drop_plan()
    try:
        # Only Django's collector raises for a protected reference, which the savepoint
        # undoes; the plan's raw deletes need none.
        with transaction.atomic(savepoint=plan is None):
            # Locked first, as a send locks it: no message can join it while it goes.
            row = Conversation.objects.select_for_update().filter(pk=conversation.pk).first()
            if row is None:
                return True
            if plan is None:
                row.delete()
            else:
                plan.run(row.pk)
    except (ProtectedError, RestrictedError):
        return False
    return True


@dataclass(frozen=True)
class DropPlan:
    """The statements that drop a conversation's rows when every relation to it and its
    messages is a plain cascade or set-null (`drop_plan`): one per related model, then the
    messages and the conversation, where Django's collector first selects every message and
    then deletes by lists of ids (a conversation with a row of every kind: 21 statements by the
    collector before #18; one per related model, 18; now 7, the deletes in one statement on
    Postgres, `_one_statement`, and no savepoint around them).

    The conversation is locked meanwhile, and the rows refer to each other only within it
    (replies, the current leaf); Postgres checks its foreign keys at commit."""

    # Per related model, the lookups from its rows to the conversation's id.
    deletes: tuple[tuple[type[models.Model], tuple[str, ...]], ...]
    # (model, field to empty, lookup from its rows to the conversation's id).
    nulls: tuple[tuple[type[models.Model], str, str], ...]

    def run(self, conversation_id: Any) -> None:
        for model, name, lookup in self.nulls:
            model._base_manager.filter(**{lookup: conversation_id}).update(**{name: None})
        connection = connections[router.db_for_write(Conversation)]
        joined = _one_statement(self, connection.alias)
        if joined is not None:
            text, placeholders = joined
            with connection.cursor() as cursor:
                cursor.execute(text, [conversation_id] * placeholders)
            return
        for rows in self._deletions(conversation_id):
            rows._raw_delete(rows.db)

    def _deletions(self, conversation_id: Any) -> list[models.QuerySet[Any]]:
        """The rows to delete, the conversation's own last."""
        found = []
        for model, lookups in self.deletes:
            where = Q()
            for lookup in lookups:
                where |= Q(**{lookup: conversation_id})
            found.append(model._base_manager.filter(where))
        found.append(Message._base_manager.filter(conversation_id=conversation_id))
        found.append(Conversation._base_manager.filter(pk=conversation_id))
        return found


# What the statement is compiled with: a value of the conversations' key type that no
# conversation has, so that each place it lands in the statement can be told.
_PROBE_ID = uuid.UUID(int=0)


@functools.cache
def _one_statement(plan: DropPlan, alias: str) -> tuple[str, int] | None:
    """The plan's deletes as one statement on Postgres (each related model's in a `WITH`, the
    conversation's row last), with how many times it takes the conversation's id: one round
    trip and no query building per drop, where the statements took one each. Postgres runs
    every data-modifying `WITH` to completion, all on one snapshot, and checks the foreign keys
    (deferred) at commit. None elsewhere, or where a statement takes other values than the
    id: the deletes then go one by one."""
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return None
    parts: list[str] = []
    placeholders = 0
    for rows in plan._deletions(_PROBE_ID):
        query = rows.query.clone()
        query.__class__ = sql.DeleteQuery
        text, params = query.get_compiler(alias).as_sql()
        if any(param != _PROBE_ID for param in params):
            return None
        parts.append(text)
        placeholders += len(params)
    *related, own = parts
    steps = ", ".join(f"d{number} AS ({text})" for number, text in enumerate(related))
    return (f"WITH {steps} {own}" if steps else own), placeholders


@functools.cache
def drop_plan() -> DropPlan | None:
    """How to drop a conversation's rows without Django's collector, read from the models'
    relations to conversations and messages; None where some relation needs the collector
    (a cascade that goes further, a protected or restricted reference, a delete signal)."""
    if any(_observed(model) for model in (Conversation, Message)):
        return None
    deletes: dict[type[models.Model], list[str]] = {}
    nulls: list[tuple[type[models.Model], str, str]] = []
    for target, to_conversation in ((Conversation, "id"), (Message, "conversation_id")):
        for relation in target._meta.get_fields(include_hidden=True):
            if not (relation.auto_created and not relation.concrete and relation.is_relation):
                continue
            model: type[models.Model] = relation.related_model  # type: ignore[assignment]
            if model in (Conversation, Message):
                continue  # the rows being dropped, among themselves
            field = relation.field  # type: ignore[union-attr]
            lookup = f"{field.name}__{to_conversation}"
            on_delete = relation.on_delete  # type: ignore[union-attr]
            if on_delete is models.CASCADE and not _observed(model) and not _referenced(model):
                deletes.setdefault(model, []).append(lookup)
            elif on_delete is models.SET_NULL:
                nulls.append((model, field.name, lookup))
            else:
                return None
    return DropPlan(
        deletes=tuple((model, tuple(lookups)) for model, lookups in deletes.items()),
        nulls=tuple(nulls),
    )


def _observed(model: type[models.Model]) -> bool:
    return signals.pre_delete.has_listeners(model) or signals.post_delete.has_listeners(model)


def _referenced(model: type[models.Model]) -> bool:
    return any(
        field.auto_created and not field.concrete and field.is_relation
        for field in model._meta.get_fields(include_hidden=True)
    )


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
