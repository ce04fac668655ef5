"""Full-text search over the text of a user's messages (Postgres text search).

What is searched: user and assistant messages of the caller's own live conversations
(archived ones included: they are kept, only out of the main list). Never another user's,
never a deleted conversation's (its messages are gone with it), never the text of an answer
moderation withheld (`blocked`: the owner never sees it).

The index is a GIN index on `to_tsvector('simple', content)` (migration 0004): an expression
index, so the vector is computed by Postgres when a message row is written. An answer's text
is written once, when it finishes (conversations/finish.py), so the turn pays nothing more
than that insert into the index (GIN's pending list makes it cheap). The query below must
spell the same expression for Postgres to use the index.

Results are ranked with `ts_rank_cd` (cover density: matches close together count more),
newest first among equals, and paged by offset: a rank is a float, a poor keyset, and a
search is read a page or two deep. The snippet comes from `ts_headline` with two control
characters as delimiters that no client ever sees: they are taken out here and the matches
handed over as offsets into plain text, so the client marks them up itself and no HTML from
the server reaches the page.
"""

from __future__ import annotations

import base64
import binascii
import re
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.postgres.search import (
    SearchHeadline,
    SearchQuery,
    SearchRank,
    SearchVectorField,
)
from django.db import connection
from django.db.models import F, Func, Value
from django.db.models.functions import Replace

from chatsite.errors import ServiceError

from .errors import ErrorCode
from .models import SEARCH_CONFIG, Message

SEARCH_MAX_LIMIT = 50
SEARCH_MAX_QUERY_CHARS = 200
# Deeper than this a search should be narrowed, not paged (an offset costs what it skips).
SEARCH_MAX_OFFSET = 1000
_START, _STOP = "\x02", "\x03"
_MARKS = re.compile(f"([{_START}{_STOP}])")


class _Document(Func):
    """`to_tsvector('simple', content)` exactly as the index spells it (Django's
    SearchVector wraps the column in COALESCE, which the index would not match)."""

    function = "to_tsvector"
    template = f"%(function)s('{SEARCH_CONFIG}'::regconfig, %(expressions)s)"
    output_field = SearchVectorField()


@dataclass(frozen=True)
class SearchHit:
    """A message that matched: where it lives, and a snippet with its matches as
    `highlights`, (start, end) offsets in Unicode code points into `snippet`."""

    message_id: uuid.UUID
    conversation_id: uuid.UUID
    conversation_title: str
    role: str
    created_at: datetime
    rank: float
    snippet: str
    highlights: list[tuple[int, int]]


@dataclass(frozen=True)
class SearchPage:
    hits: list[SearchHit]
    next_cursor: str | None


def _encode_offset(offset: int) -> str:
    return base64.urlsafe_b64encode(str(offset).encode()).decode().rstrip("=")


def _decode_offset(cursor: str) -> int:
    try:
        offset = int(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode())
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise ServiceError(ErrorCode.INVALID_CURSOR, "The cursor is not valid.") from exc
    if not 0 < offset <= SEARCH_MAX_OFFSET:
        raise ServiceError(ErrorCode.INVALID_CURSOR, "The cursor is not valid.")
    return offset


def split_marks(headline: str) -> tuple[str, list[tuple[int, int]]]:
    """The headline's text without its delimiters, and where the matches lie in it."""
    text: list[str] = []
    spans: list[tuple[int, int]] = []
    position = 0
    start: int | None = None
    for part in _MARKS.split(headline):
        if part == _START:
            start = position
        elif part == _STOP:
            if start is not None and position > start:
                spans.append((start, position))
            start = None
        else:
            text.append(part)
            position += len(part)
    return "".join(text), spans


def _check_query(query: str) -> str:
    query = query.strip()
    if not query:
        raise ServiceError(ErrorCode.EMPTY_SEARCH, "Type something to search for.")
    if len(query) > SEARCH_MAX_QUERY_CHARS:
        raise ServiceError(
            ErrorCode.SEARCH_TOO_LONG,
            f"A search may hold at most {SEARCH_MAX_QUERY_CHARS} characters.",
            detail={"max_chars": SEARCH_MAX_QUERY_CHARS},
        )
    return query


def document() -> _Document:
    """A message's text as the index holds it."""
    return _Document(F("content"))


def tsquery(query: str) -> SearchQuery:
    """The user's words as a text search query: websearch_to_tsquery takes any text without
    a syntax error (quotes, -, or), so nothing needs escaping."""
    return SearchQuery(query, config=SEARCH_CONFIG, search_type="websearch")


def message_search(
    *, user: Any, query: str, cursor: str | None = None, limit: int = 20
) -> SearchPage:
    """The user's messages matching `query` (web search syntax: words, "a phrase", -not,
    or), best first, one page at a time."""
    query = _check_query(query)
    if connection.vendor != "postgresql":
        raise ServiceError(
            ErrorCode.SEARCH_UNAVAILABLE,
            "Search needs the Postgres database.",
            status=503,
        )
    limit = max(1, min(limit, SEARCH_MAX_LIMIT))
    offset = _decode_offset(cursor) if cursor else 0
    matching = tsquery(query)
    vector = document()
    # The delimiters are taken out of the text first, so a message cannot forge a match.
    plain = Replace(Replace(F("content"), Value(_START), Value("")), Value(_STOP), Value(""))
    rows = list(
        Message.objects.filter(
            conversation__owner_id=user.pk,
            conversation__deleted_at__isnull=True,
            role__in=(Message.Role.USER, Message.Role.ASSISTANT),
        )
        .exclude(status=Message.Status.BLOCKED)
        .annotate(document=vector)
        .filter(document=matching)
        .annotate(
            rank=SearchRank(vector, matching, cover_density=True),
            headline=SearchHeadline(
                plain,
                matching,
                config=SEARCH_CONFIG,
                start_sel=_START,
                stop_sel=_STOP,
                max_words=30,
                min_words=12,
                short_word="0",  # no edge words dropped: the snippet reads as written
                max_fragments=2,
                fragment_delimiter=" … ",
            ),
            conversation_title=F("conversation__title"),
        )
        .order_by("-rank", "-created_at", "-id")
        .values(
            "id",
            "conversation_id",
            "conversation_title",
            "role",
            "created_at",
            "rank",
            "headline",
        )[offset : offset + limit + 1]
    )
    hits = []
    for row in rows[:limit]:
        snippet, highlights = split_marks(row["headline"])
        hits.append(
            SearchHit(
                message_id=row["id"],
                conversation_id=row["conversation_id"],
                conversation_title=row["conversation_title"],
                role=row["role"],
                created_at=row["created_at"],
                rank=float(row["rank"]),
                snippet=snippet,
                highlights=highlights,
            )
        )
    more = len(rows) > limit and offset + limit <= SEARCH_MAX_OFFSET
    return SearchPage(hits=hits, next_cursor=_encode_offset(offset + limit) if more else None)
