"""Reads of conversations that views and other apps share.

Every fetch by id goes through a `*_for_user` function, so one place decides who may see
what: another user's conversation or message is `NotFound`, exactly like one that never
existed.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Count, Exists, F, OuterRef, Q, UUIDField
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce, Lower

from chatsite import jsonbody, rows
from chatsite.errors import NotFound, ServiceError

from .errors import ErrorCode
from .models import (
    Attachment,
    BranchSummary,
    Conversation,
    Feedback,
    Folder,
    MemoryFact,
    Message,
    Personalization,
    Share,
)
from .share_tokens import share_id_from_token

SIDEBAR_MAX_LIMIT = 100


def conversation_for_user(
    *, user: Any, conversation_id: uuid.UUID, include_deleted: bool = False
) -> Conversation:
    """The conversation if `user` owns it; otherwise NotFound.

    A tombstone is NotFound too unless `include_deleted`: writers ask for it so that the
    owner hears `conversation_deleted` from the service instead of a puzzling 404.
    """
    if not getattr(user, "is_authenticated", False):
        raise NotFound("Conversation not found.")
    # On every write's way: a fixed statement, not a queryset compiled per call.
    conversation = rows.one(
        Conversation,
        "id = %s AND owner_id = %s" + ("" if include_deleted else " AND deleted_at IS NULL"),
        # As a queryset's filter would: an id that is no UUID raises ValidationError.
        [Conversation._meta.pk.get_db_prep_value(conversation_id, connection), user.pk],
    )
    if conversation is None:
        raise NotFound("Conversation not found.")
    return conversation


def message_for_user(
    *, user: Any, message_id: uuid.UUID, conversation: Conversation | None = None
) -> Message:
    """The message if `user` owns its conversation (and it lies in `conversation`, if given).

    A tombstone has no messages left; when the caller already holds one (fetched with
    `include_deleted` to write into it), the answer is `conversation_deleted`, not 404.
    """
    if not getattr(user, "is_authenticated", False):
        raise NotFound("Message not found.")
    if conversation is not None and conversation.deleted_at is not None:
        raise ServiceError(ErrorCode.CONVERSATION_DELETED, "This conversation was deleted.")
    messages = Message.objects.select_related("conversation").filter(
        pk=message_id, conversation__owner_id=user.pk, conversation__deleted_at__isnull=True
    )
    if conversation is not None:
        messages = messages.filter(conversation_id=conversation.pk)
    message = messages.first()
    if message is None:
        raise NotFound("Message not found.")
    return message


def attachment_for_user(
    *, user: Any, attachment_id: uuid.UUID, conversation: Conversation, with_data: bool = False
) -> Attachment:
    """The file `attachment_id` of `conversation` (which the caller fetched for `user`);
    NotFound for another conversation's, as for a missing one. Its bytes only `with_data`."""
    attachments = Attachment.objects.filter(
        pk=attachment_id,
        conversation_id=conversation.pk,
        conversation__owner_id=user.pk,
        conversation__deleted_at__isnull=True,
    )
    if not with_data:
        attachments = attachments.defer("data", "text", "embeddings")
    attachment = attachments.select_related("conversation").first()
    if attachment is None:
        raise NotFound("Attachment not found.")
    return attachment


def attachments_by_message(*, messages: Sequence[Message]) -> dict[Any, list[Attachment]]:
    """The files on each of `messages` that carry any, in the order the user chose them; one
    query, none if no message carries a file, and without their bytes or text."""
    found: dict[Any, list[Attachment]] = {}
    carrying = [m.pk for m in messages if m.metadata.get(Attachment.METADATA_KEY)]
    if not carrying:
        return found
    rows = Attachment.objects.filter(message_id__in=carrying).only(
        "id", "message_id", "conversation_id", "name", "kind", "size", "position", "created_at"
    )
    for attachment in rows:
        found.setdefault(attachment.message_id, []).append(attachment)
    return found


def message_visible_content(*, message: Message) -> str:
    """The text the owner may see: an answer moderation withheld keeps its text for staff
    review only (admin), never for the owner's API or page."""
    return "" if message.status == Message.Status.BLOCKED else message.content


def message_notice(*, message: Message) -> str | None:
    """What the owner sees in place of a withheld answer's text; None for the others."""
    if message.status != Message.Status.BLOCKED:
        return None
    notice: str = settings.MODERATION_RETRACT_NOTICE
    return notice


@dataclass(frozen=True)
class SidebarPage:
    """One page of the sidebar and the cursor of the next one (None on the last page)."""

    conversations: list[Conversation]
    next_cursor: str | None


def _encode_cursor(conversation: Conversation) -> str:
    raw = json.dumps(
        [conversation.pinned, conversation.last_activity_at.isoformat(), str(conversation.pk)]
    )
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[bool, datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        pinned, stamp, conversation_id = jsonbody.loads(raw)
        if not isinstance(pinned, bool):
            raise TypeError("pinned is not a boolean")
        last_activity_at = datetime.fromisoformat(stamp)
        if last_activity_at.tzinfo is None:
            raise ValueError("naive datetime")
        return pinned, last_activity_at, uuid.UUID(conversation_id)
    except (binascii.Error, UnicodeDecodeError, ValueError, TypeError) as exc:
        raise ServiceError(ErrorCode.INVALID_CURSOR, "The cursor is not valid.") from exc


# The sidebar's `folder` filter for conversations in no folder.
UNFILED = "none"


def conversation_sidebar(
    *,
    user: Any,
    query: str = "",
    cursor: str | None = None,
    limit: int = 20,
    folder: Folder | str | None = None,
    pinned: bool | None = None,
    archived: bool = False,
) -> SidebarPage:
    """The user's live conversations, pinned first, then newest activity first, optionally
    by title search, by `folder` (a Folder, or UNFILED for those in none) and by `pinned`.

    The main list leaves out archived conversations; `archived=True` is the Archived view.
    Keyset pagination on (pinned, last_activity_at, id): pages stay free of duplicates and
    gaps while new messages reorder the list, and each page costs the same however deep it is
    (one index, `conv_sidebar_idx`, serves the order).
    """
    limit = max(1, min(limit, SIDEBAR_MAX_LIMIT))
    conversations = Conversation.objects.filter(
        owner_id=user.pk, deleted_at__isnull=True, archived=archived
    ).order_by("-pinned", "-last_activity_at", "-id")
    if query.strip():
        conversations = conversations.filter(title__icontains=query.strip())
    if folder == UNFILED:
        conversations = conversations.filter(folder__isnull=True)
    elif isinstance(folder, Folder):
        conversations = conversations.filter(folder_id=folder.pk)
    if pinned is not None:
        conversations = conversations.filter(pinned=pinned)
    if cursor:
        last_pinned, last_activity_at, last_id = _decode_cursor(cursor)
        after = Q(pinned=last_pinned) & (
            Q(last_activity_at__lt=last_activity_at)
            | Q(last_activity_at=last_activity_at, id__lt=last_id)
        )
        if last_pinned:
            after |= Q(pinned=False)
        conversations = conversations.filter(after)
    rows = list(conversations[: limit + 1])
    page = rows[:limit]
    next_cursor = _encode_cursor(page[-1]) if len(rows) > limit else None
    return SidebarPage(conversations=page, next_cursor=next_cursor)


def folder_for_user(*, user: Any, folder_id: uuid.UUID) -> Folder:
    """The folder if `user` owns it; otherwise NotFound."""
    if not getattr(user, "is_authenticated", False):
        raise NotFound("Folder not found.")
    folder = Folder.objects.filter(owner_id=user.pk, pk=folder_id).first()
    if folder is None:
        raise NotFound("Folder not found.")
    return folder


def folders_of(*, user: Any) -> list[Folder]:
    """The user's folders by name (at most FOLDERS_MAX_PER_USER, so never paged)."""
    return list(Folder.objects.filter(owner_id=user.pk).order_by(Lower("name"), "id"))


def message_ancestry(*, message_id: uuid.UUID) -> list[Message]:
    """The message and all its ancestors, root first, in one recursive query."""
    return list(Message.objects.raw(*_ancestry_sql(message_id)))


@dataclass(frozen=True)
class LockedPath:
    """What a turn reads as it takes its conversation's lock: the branch from the root to a
    message (root first), the summaries that run through its messages (by message id), and
    the conversation's row as the lock found it (its leaf, whether it was deleted)."""

    path: list[Message]
    summaries: dict[uuid.UUID, BranchSummary]
    current_leaf_id: uuid.UUID | None
    deleted_at: datetime | None


def message_ancestry_locked(
    *, message_id: uuid.UUID, conversation_id: uuid.UUID
) -> LockedPath | None:
    """Lock the conversation `conversation_id`'s row (`FOR UPDATE`, until the transaction
    ends) and read `message_ancestry` of `message_id` with the summaries through it, in one
    statement; None if there is no such message (the lock is then not promised).

    The row comes back as it is once locked; the messages as the statement began, which is
    before the lock if it had to wait: messages are never changed but for their pointers, and
    what a turn must judge on fresh data (an answer in progress) it judges in its write."""
    summary_fields = BranchSummary._meta.concrete_fields
    quote = connection.ops.quote_name
    summary_columns = "".join(
        f", s.{quote(str(field.column))} AS summary__{field.attname}" for field in summary_fields
    )
    sql, params = _ancestry_sql(
        message_id,
        extra=(
            ", locked.current_leaf_id AS locked_leaf_id,"
            f" locked.deleted_at AS locked_deleted_at{summary_columns}"
        ),
        joins=(
            f" CROSS JOIN locked LEFT JOIN {quote(BranchSummary._meta.db_table)} s"
            " ON s.through_message_id = m.id"
        ),
        ctes=(
            f", locked AS (SELECT current_leaf_id, deleted_at FROM"  # noqa: S608
            f" {quote(Conversation._meta.db_table)} WHERE id = %s FOR UPDATE)"
        ),
    )
    conversation_param = Conversation._meta.pk.get_db_prep_value(conversation_id, connection)
    path = list(Message.objects.raw(sql, [params[0], conversation_param]))
    if not path:
        return None
    summaries = {}
    for message in path:
        values = [getattr(message, f"summary__{field.attname}") for field in summary_fields]
        if values[0] is not None:
            summaries[message.pk] = BranchSummary.from_db(
                connection.alias, [field.attname for field in summary_fields], values
            )
    return LockedPath(
        path=path,
        summaries=summaries,
        current_leaf_id=path[0].locked_leaf_id,  # type: ignore[attr-defined]
        deleted_at=path[0].locked_deleted_at,  # type: ignore[attr-defined]
    )


def _ancestry_sql(
    message_id: uuid.UUID, *, extra: str = "", joins: str = "", ctes: str = ""
) -> tuple[str, list[Any]]:
    """The recursive query of a message's ancestry (root first) and its parameter; `ctes`
    adds queries after the recursive one (their parameters go after it), `extra` columns
    and `joins` tables to the result."""
    table = connection.ops.quote_name(Message._meta.db_table)
    # The table name comes from the model, never from input; the id is a bound parameter.
    sql = f"""
        WITH RECURSIVE ancestry (id, parent_id, depth) AS (
            SELECT id, parent_id, 0 FROM {table} WHERE id = %s
            UNION ALL
            SELECT m.id, m.parent_id, ancestry.depth + 1
            FROM {table} m JOIN ancestry ON m.id = ancestry.parent_id
        ){ctes}
        SELECT m.*{extra} FROM {table} m JOIN ancestry ON m.id = ancestry.id{joins}
        ORDER BY ancestry.depth DESC
    """  # noqa: S608
    return sql, [Message._meta.pk.get_db_prep_value(message_id, connection)]


def active_branch(*, conversation: Conversation) -> list[Message]:
    """The messages on screen: root to the conversation's current leaf."""
    if conversation.current_leaf_id is None:
        return []
    return message_ancestry(message_id=conversation.current_leaf_id)


@dataclass(frozen=True)
class SiblingPosition:
    """Where a message stands among its siblings: `index` of `count` (1-based), all ids."""

    index: int
    count: int
    sibling_ids: tuple[uuid.UUID, ...]


def sibling_positions(*, branch: Sequence[Message]) -> list[SiblingPosition]:
    """For each message of `branch`, its place among its siblings, ordered by age.

    One query for the whole branch, so a client can show `< 2/3 >` at every fork.
    """
    parent_ids = {message.parent_id for message in branch if message.parent_id is not None}
    siblings: dict[uuid.UUID, list[uuid.UUID]] = defaultdict(list)
    if parent_ids:
        rows = (
            Message.objects.filter(parent_id__in=parent_ids)
            .order_by("created_at", "id")
            .values_list("parent_id", "id")
        )
        for parent_id, message_id in rows:
            siblings[parent_id].append(message_id)
    positions = []
    for message in branch:
        ids = tuple(siblings[message.parent_id]) if message.parent_id else (message.pk,)
        positions.append(SiblingPosition(ids.index(message.pk) + 1, len(ids), ids))
    return positions


def question_of(*, message_id: Any) -> Any | None:
    """The id of the user message an answer replies to (above any tool rounds between)."""
    parent_id = Message.objects.filter(pk=message_id).values_list("parent_id", flat=True).first()
    while parent_id is not None:
        role, next_parent = Message.objects.filter(pk=parent_id).values_list("role", "parent_id")[0]
        if role == Message.Role.USER:
            return parent_id
        parent_id = next_parent
    return None


# Share links

SHARES_MAX_LISTED = 200


def share_for_user(*, user: Any, share_id: uuid.UUID) -> Share:
    """The share if `user` owns its (live) conversation; otherwise NotFound."""
    if not getattr(user, "is_authenticated", False):
        raise NotFound("Share not found.")
    share = Share.objects.filter(
        pk=share_id, conversation__owner_id=user.pk, conversation__deleted_at__isnull=True
    ).first()
    if share is None:
        raise NotFound("Share not found.")
    return share


def shares_of(*, user: Any, conversation: Conversation | None = None) -> list[Share]:
    """The user's shares, newest first (revoked ones too, marked), of one conversation if
    given; at most SHARES_MAX_LISTED, in one query. The snapshots are not read."""
    shares = (
        Share.objects.filter(conversation__owner_id=user.pk, conversation__deleted_at__isnull=True)
        .defer("messages")
        .order_by("-created_at", "-id")
    )
    if conversation is not None:
        shares = shares.filter(conversation_id=conversation.pk)
    return list(shares[:SHARES_MAX_LISTED])


def shared_snapshot(*, token: str) -> Share:
    """The share a link's token opens, for anyone; NotFound for a malformed or forged token,
    a revoked share, or one whose conversation was deleted."""
    share_id = share_id_from_token(token=token)
    share = (
        Share.objects.filter(
            pk=share_id, revoked_at__isnull=True, conversation__deleted_at__isnull=True
        ).first()
        if share_id is not None
        else None
    )
    if share is None:
        raise NotFound("This shared conversation does not exist or is no longer shared.")
    return share


# Feedback


def feedback_of(*, user_id: Any, message_ids: Sequence[Any]) -> dict[Any, Feedback]:
    """The user's feedback on these messages, by message id, in one query."""
    if not message_ids:
        return {}
    rows = Feedback.objects.filter(user_id=user_id, message_id__in=message_ids)
    return {feedback.message_id: feedback for feedback in rows}


@dataclass(frozen=True)
class FeedbackRow:
    """One line of the staff's feedback report: a model and the pool that answered."""

    model: str
    pool: str
    answers: int
    regenerated: int
    thumbs_up: int
    thumbs_down: int

    @property
    def regenerate_rate(self) -> float | None:
        """The share of the answers that were asked again (None without answers)."""
        return self.regenerated / self.answers if self.answers else None


def _question_of_answer() -> RawSQL:
    """The id of the user message an answer replies to: its parent, or, after tool rounds
    (the tool loop re-parents the answer under its last tool result), the nearest user message
    above it; as a correlated subquery of the answer's row."""
    table = connection.ops.quote_name(Message._meta.db_table)
    user = Message.Role.USER.value
    # The table name comes from the model and the role from its choices, never from input.
    sql = f"""(
        WITH RECURSIVE above (id, parent_id, role, depth) AS (
            SELECT m.id, m.parent_id, m.role, 0 FROM {table} m WHERE m.id = {table}.parent_id
            UNION ALL
            SELECT m.id, m.parent_id, m.role, above.depth + 1
            FROM {table} m JOIN above ON m.id = above.parent_id AND above.role <> '{user}'
        )
        SELECT id FROM above WHERE role = '{user}' ORDER BY depth LIMIT 1
    )"""  # noqa: S608
    return RawSQL(sql, [], output_field=UUIDField())  # noqa: S611 (no input in it, as above)


def feedback_report(*, since: datetime, until: datetime) -> list[FeedbackRow]:
    """Per model and answering pool, over answers written in [since, until): how many, how
    many were regenerated, and the thumbs up and down they got.

    An answer is a message with a generation (so the tool loop's intermediate rounds are not
    counted). It was regenerated when a later answer replies to the same question: Regenerate
    adds a sibling under the question (above any tool rounds the answer made), where an edit
    forks the question itself and so is no regeneration. The pool is the one that answered
    (`Generation.served_pool`, else the one asked). Two grouped queries, whatever the period.
    """
    later_answer = Message.objects.filter(
        parent_id=OuterRef("question_id"),
        role=Message.Role.ASSISTANT,
        generation__isnull=False,
        created_at__gt=OuterRef("created_at"),
    )
    pool = Coalesce(F("generation__served_pool__name"), F("generation__pool__name"))
    answers = (
        Message.objects.filter(
            role=Message.Role.ASSISTANT,
            generation__isnull=False,
            created_at__gte=since,
            created_at__lt=until,
        )
        .annotate(question_id=_question_of_answer())
        .annotate(pool_name=pool, was_regenerated=Exists(later_answer))
        .values("model", "pool_name")
        .annotate(
            answers=Count("pk"),
            regenerated=Count("pk", filter=Q(was_regenerated=True)),
        )
    )
    thumbs = (
        Feedback.objects.filter(
            message__generation__isnull=False,
            message__created_at__gte=since,
            message__created_at__lt=until,
        )
        .annotate(
            model=F("message__model"),
            pool_name=Coalesce(
                F("message__generation__served_pool__name"), F("message__generation__pool__name")
            ),
        )
        .values("model", "pool_name")
        .annotate(
            up=Count("pk", filter=Q(rating=Feedback.Rating.UP)),
            down=Count("pk", filter=Q(rating=Feedback.Rating.DOWN)),
        )
    )
    counts: dict[tuple[str, str], dict[str, int]] = defaultdict(
        lambda: {"answers": 0, "regenerated": 0, "up": 0, "down": 0}
    )
    for row in answers:
        line = counts[(row["model"], row["pool_name"])]
        line["answers"], line["regenerated"] = row["answers"], row["regenerated"]
    for thumb in thumbs:
        line = counts[(thumb["model"], thumb["pool_name"])]
        line["up"], line["down"] = thumb["up"], thumb["down"]
    return [
        FeedbackRow(
            model=model,
            pool=pool_name,
            answers=line["answers"],
            regenerated=line["regenerated"],
            thumbs_up=line["up"],
            thumbs_down=line["down"],
        )
        for (model, pool_name), line in sorted(counts.items())
    ]


def personalization_of(*, user_id: Any) -> Personalization:
    """The user's instructions and memory switch; the defaults (unsaved) if never set."""
    found = Personalization.objects.filter(user_id=user_id).first()
    return found if found is not None else Personalization(user_id=user_id)


def memory_fact_for_user(*, user: Any, fact_id: uuid.UUID) -> MemoryFact:
    """A fact or pending suggestion of `user`'s; NotFound for another user's, a dismissed
    one, or none."""
    if not getattr(user, "is_authenticated", False):
        raise NotFound("Memory not found.")
    fact = (
        MemoryFact.objects.filter(owner_id=user.pk, pk=fact_id)
        .exclude(status=MemoryFact.Status.DISMISSED)
        .first()
    )
    if fact is None:
        raise NotFound("Memory not found.")
    return fact


def memory_facts_of(*, user_id: Any) -> list[MemoryFact]:
    """The user's confirmed facts in the order the model is told them (at most
    MEMORY_MAX_FACTS, so never paged)."""
    return list(
        MemoryFact.objects.filter(owner_id=user_id, status=MemoryFact.Status.CONFIRMED).order_by(
            "confirmed_at", "id"
        )
    )


def memory_suggestions_of(*, user_id: Any) -> list[MemoryFact]:
    """The small model's suggestions awaiting the user, oldest first (at most
    MEMORY_MAX_SUGGESTIONS)."""
    return list(
        MemoryFact.objects.filter(owner_id=user_id, status=MemoryFact.Status.SUGGESTED).order_by(
            "created_at", "id"
        )
    )
