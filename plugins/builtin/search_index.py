"""The search index of `conversation_search`: writes (services) and the query (selector).

A finished user or assistant message is embedded once (`search_index_message`, run by the
Celery task `plugins.tasks.search_index_message` after the message's transaction commits;
`plugins.tasks.search_index_schedule` queues it). A query first embeds, in one bounded
batch, those of the caller's messages that are not indexed yet (`search_index_pending`), so
search works before the task has caught up or where Celery is not running.

Every read is scoped twice to the caller: the index row's `user` and the conversation's
owner must both be the caller, and the conversation must not be deleted.
"""

from __future__ import annotations

import functools
import re
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from django.conf import settings
from django.db.models import Exists, OuterRef, QuerySet

from chatsite import embeddings
from chatsite.vanishing import unless_vanished
from conversations.models import Message
from plugins.models import MessageEmbedding

INDEXED_ROLES = (Message.Role.USER, Message.Role.ASSISTANT)
SNIPPET_CHARS = 240
_INDEX_BATCH = 16
_WORD = re.compile(r"\w{3,}")


def _indexable(user_id: int) -> QuerySet[Message]:
    return Message.objects.filter(
        conversation__owner_id=user_id,
        conversation__deleted_at__isnull=True,
        role__in=INDEXED_ROLES,
        status=Message.Status.COMPLETE,
    ).exclude(content="")


def _store(messages: list[Message]) -> int:
    """Embed and index `messages`; returns how many were indexed.

    A message whose conversation is removed while it is embedded (a `/v1` conversation goes
    the moment its answer is final) is left out: the others are indexed without it, and no
    row is ever written for it.
    """
    if not messages:
        return 0
    vectors = embeddings.embed([message.content for message in messages])
    rows = [
        MessageEmbedding(
            message_id=message.pk,
            user_id=message.conversation.owner_id,
            conversation_id=message.conversation_id,
            model_name=embeddings.MODEL_NAME,
            vector=embeddings.to_bytes(vector),
        )
        for message, vector in zip(messages, vectors, strict=True)
    ]
    while rows:
        with unless_vanished(
            MessageEmbedding,
            still_there=functools.partial(_all_searchable, rows),
            what=f"search index of {len(rows)} messages",
        ) as write:
            # Two indexers of one message (the task and a query's catch-up) meet at the
            # unique constraint.
            MessageEmbedding.objects.bulk_create(rows, ignore_conflicts=True)
        if not write.vanished:
            return len(rows)
        # Fewer rows each time round: `still_there` re-raised unless some message went.
        kept = _searchable(rows)
        rows = [row for row in rows if row.message_id in kept]
    return 0


def _all_searchable(rows: list[MessageEmbedding]) -> bool:
    return len(_searchable(rows)) == len(rows)


def _searchable(rows: list[MessageEmbedding]) -> set[Any]:
    """Which of the rows' messages still exist in a conversation that is not deleted."""
    return set(
        Message.objects.filter(
            pk__in=[row.message_id for row in rows], conversation__deleted_at__isnull=True
        ).values_list("pk", flat=True)
    )


def search_index_message(*, message_id: Any) -> bool:
    """Embed one message for search; False if it is not searchable (role, status, deleted),
    and False, writing nothing, if its conversation is removed before it is indexed.

    Idempotent: a message already indexed under the current model is left alone.
    """
    message = (
        Message.objects.select_related("conversation")
        .filter(
            pk=message_id,
            conversation__deleted_at__isnull=True,
            role__in=INDEXED_ROLES,
            status=Message.Status.COMPLETE,
        )
        .exclude(content="")
        .first()
    )
    if message is None:
        return False
    if MessageEmbedding.objects.filter(
        message_id=message.pk, model_name=embeddings.MODEL_NAME
    ).exists():
        return True
    return _store([message]) == 1


def search_index_pending(
    *, user_id: int, limit: int | None = None, deadline: float | None = None
) -> int:
    """Embed up to `limit` of the user's searchable messages not yet indexed, newest first.

    Works in small batches and starts no new batch after `deadline` (`time.monotonic()`), so
    a query never waits for a whole history. Returns how many were indexed.
    """
    limit = settings.PLUGINS_SEARCH_LAZY_INDEX_LIMIT if limit is None else limit
    if limit <= 0:
        return 0
    indexed = MessageEmbedding.objects.filter(
        message_id=OuterRef("pk"), model_name=embeddings.MODEL_NAME
    )
    pending = list(
        _indexable(user_id)
        .filter(~Exists(indexed))
        .select_related("conversation")
        .order_by("-created_at")[:limit]
    )
    done = 0
    for start in range(0, len(pending), _INDEX_BATCH):
        if deadline is not None and time.monotonic() >= deadline:
            break
        done += _store(pending[start : start + _INDEX_BATCH])
    return done


@dataclass(frozen=True)
class SearchHit:
    """One message found by meaning, with where it is and a short extract."""

    conversation_id: uuid.UUID
    conversation_title: str
    message_id: uuid.UUID
    role: str
    snippet: str
    score: float
    created_at: datetime


def snippet(text: str, query: str, size: int = SNIPPET_CHARS) -> str:
    """About `size` characters of `text`, around the first word it shares with the query."""
    text = " ".join(text.split())
    if len(text) <= size:
        return text
    start = 0
    lowered = text.lower()
    for word in _WORD.findall(query.lower()):
        found = lowered.find(word)
        if found >= 0:
            start = max(0, found - size // 3)
            break
    end = min(len(text), start + size)
    start = max(0, end - size)
    extract = text[start:end].strip()
    return ("…" if start else "") + extract + ("…" if end < len(text) else "")


def search_messages(
    *,
    user_id: int,
    query: str,
    limit: int = 5,
    exclude_conversation_id: Any = None,
    min_score: float = 0.0,
) -> list[SearchHit]:
    """The user's messages closest in meaning to `query`, best first (cosine similarity).

    Only `user_id`'s own messages in conversations that are not deleted are compared; the
    newest `PLUGINS_SEARCH_MAX_CANDIDATES` index rows at most.
    """
    rows = MessageEmbedding.objects.filter(
        user_id=user_id,
        conversation__owner_id=user_id,
        conversation__deleted_at__isnull=True,
        model_name=embeddings.MODEL_NAME,
    )
    if exclude_conversation_id is not None:
        rows = rows.exclude(conversation_id=exclude_conversation_id)
    candidates = list(
        rows.order_by("-id").values_list("message_id", "vector")[
            : settings.PLUGINS_SEARCH_MAX_CANDIDATES
        ]
    )
    if not candidates:
        return []
    matrix = np.vstack([embeddings.from_bytes(vector) for _, vector in candidates])
    scores = matrix @ embeddings.embed([query])[0]
    # A few spare in case a message vanished since the index row was read.
    order = np.argsort(-scores)[: limit * 2]
    wanted = [(candidates[i][0], float(scores[i])) for i in order if scores[i] >= min_score]
    messages = Message.objects.select_related("conversation").in_bulk(
        [message_id for message_id, _ in wanted]
    )
    hits = []
    for message_id, score in wanted:
        message = messages.get(message_id)
        # Read again from the messages themselves: the owner check does not trust the index.
        if (
            message is None
            or message.conversation.owner_id != user_id
            or message.conversation.deleted_at is not None
        ):
            continue
        hits.append(
            SearchHit(
                conversation_id=message.conversation_id,
                conversation_title=str(message.conversation),
                message_id=message.pk,
                role=message.role,
                snippet=snippet(message.content, query),
                score=round(score, 3),
                created_at=message.created_at,
            )
        )
        if len(hits) == limit:
            break
    return hits
