"""Automatic titles: after a conversation's first exchange, the small pool names it.

The request goes out after the first answer completes (`tasks.title_request_after_answer`,
called as the answer is finished, `conversations.finish`); the Celery task `tasks.generate_title`
writes the title with a conditional UPDATE, so a title the user set meanwhile always wins,
and tells the owner's open pages through their event stream. One task per conversation is
pending at a time (`title_pending_key`, claimed when it is queued, released when it ends).
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from inference import queue

from . import small_model
from .events import user_event_publish
from .models import Conversation, Message

TITLE_INSTRUCTION = (
    "You name conversations. Reply with a title of at most six words for the conversation "
    "below: no quotes, no punctuation at the end, nothing else."
)
# How much of the first exchange the title prompt quotes.
EXCERPT_CHARS = 1500
# A pending title task's claim outlives its retries (time limit 120 s, backoff up to 120 s).
PENDING_SECONDS = 900

_PREFIX = re.compile(r"^\s*(?:title|subject|topic)\s*[:\-]\s*", re.IGNORECASE)
# Quotes (straight and typographic), markdown marks, trailing punctuation, dashes, spaces.
_EDGE_PUNCTUATION = "\"'`\u201c\u201d\u2018\u2019\u00ab\u00bb*_#.:;,!-\u2013\u2014 "


def title_pending_key(conversation_id: Any) -> str:
    return queue.key("title-pending", conversation_id)


def clean_title(raw: str, *, max_chars: int | None = None) -> str:
    """One short line: the first non-empty line, without a `Title:` label, quotes, markdown
    marks or trailing punctuation, cut at a word boundary to `max_chars`."""
    max_chars = max_chars or settings.AUTO_TITLE_MAX_CHARS
    line = next((part for part in raw.splitlines() if part.strip(" \t\"'`*#")), "")
    line = _PREFIX.sub("", line)
    line = " ".join(line.split()).strip(_EDGE_PUNCTUATION)
    line = _PREFIX.sub("", line).strip(_EDGE_PUNCTUATION)
    if len(line) > max_chars:
        head = line[:max_chars]
        if line[max_chars] != " " and " " in head:
            head = head.rsplit(" ", 1)[0]  # no word cut in half
        line = head.rstrip(_EDGE_PUNCTUATION)
    return line


def _first_exchange(conversation: Conversation) -> tuple[Message, Message] | None:
    """The first user message and its first completed answer, if there is one yet."""
    answer = (
        Message.objects.filter(
            conversation=conversation,
            role=Message.Role.ASSISTANT,
            status=Message.Status.COMPLETE,
            parent__role=Message.Role.USER,
        )
        .exclude(content="")
        .select_related("parent")
        .order_by("created_at", "id")
        .first()
    )
    if answer is None or answer.parent is None:
        return None
    return answer.parent, answer


def title_generate(*, conversation_id: Any) -> str | None:
    """Write an automatic title for an untitled conversation; returns it, or None if the
    conversation is gone, already titled, or has no completed exchange. Idempotent."""
    conversation = Conversation.objects.filter(
        pk=conversation_id, title="", title_set_by_user=False, deleted_at__isnull=True
    ).first()
    if conversation is None:
        return None
    exchange = _first_exchange(conversation)
    if exchange is None:
        return None
    question, answer = exchange
    pool = small_model.pool_for_background(
        setting="TITLE_MODEL", conversation_model=conversation.model
    )
    raw = small_model.complete(
        pool=pool,
        messages=[
            {"role": "system", "content": TITLE_INSTRUCTION},
            {
                "role": "user",
                "content": f"User: {question.content[:EXCERPT_CHARS]}\n\n"
                f"Assistant: {answer.content[:EXCERPT_CHARS]}",
            },
        ],
        max_tokens=settings.TITLE_MAX_TOKENS,
        conversation_id=conversation.pk,
    )
    # A model that answers nothing usable still leaves the sidebar something to show.
    title = clean_title(raw) or clean_title(question.content)
    if not title:
        return None
    with transaction.atomic():
        # The condition is the guarantee: a rename or a deletion that won the race stays.
        written = Conversation.objects.filter(
            pk=conversation.pk, title="", title_set_by_user=False, deleted_at__isnull=True
        ).update(title=title, updated_at=timezone.now())
        if not written:
            return None
        owner_id = conversation.owner_id
        transaction.on_commit(
            lambda: user_event_publish(
                user_id=owner_id,
                event="title",
                data={"conversation_id": str(conversation.pk), "title": title},
            )
        )
    return title
