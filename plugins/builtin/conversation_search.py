"""Search over the caller's own past conversations by meaning, not by exact words.

Messages are embedded with all-MiniLM-L6-v2 (`embeddings`) into the `MessageEmbedding`
index (`search_index`); a query is embedded the same way and compared by cosine similarity
with the caller's messages only. The tool returns short snippets with the conversation's
title and id, never whole conversations.
"""

from __future__ import annotations

import time
from typing import Any

from chatsite import embeddings
from plugins.sdk import Plugin, Tool, ToolContext, ToolError

from . import search_index

MAX_QUERY_CHARS = 500
MAX_RESULTS = 10
DEFAULT_RESULTS = 5
DEFAULT_MIN_SCORE = 0.2
# Share of the tool's time limit that indexing at query time may use.
CATCH_UP_SHARE = 0.5
# Seconds kept for the query itself after catching up.
SEARCH_RESERVE_SECONDS = 2.0


def search(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Handler of `conversation_search`: the caller's messages closest to the query."""
    query = args.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ToolError("'query' must be a non-empty string.")
    if len(query) > MAX_QUERY_CHARS:
        raise ToolError(f"'query' is longer than {MAX_QUERY_CHARS} characters.")
    limit = args.get("limit", DEFAULT_RESULTS)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_RESULTS:
        raise ToolError(f"'limit' must be a whole number from 1 to {MAX_RESULTS}.")
    include_current = args.get("include_current", False)
    if not isinstance(include_current, bool):
        raise ToolError("'include_current' must be true or false.")
    min_score = ctx.config.get("min_score")
    min_score = DEFAULT_MIN_SCORE if min_score is None else float(min_score)

    # Catch up on messages the indexing task has not reached, within part of the time limit
    # (the first call in a process also spends some of it loading the model).
    started = time.monotonic()
    embeddings.get_model()
    left = ctx.timeout_seconds - (time.monotonic() - started) - SEARCH_RESERVE_SECONDS
    budget = max(min(ctx.timeout_seconds * CATCH_UP_SHARE, left), 0)
    search_index.search_index_pending(user_id=ctx.user_id, deadline=time.monotonic() + budget)
    hits = search_index.search_messages(
        user_id=ctx.user_id,
        query=query.strip(),
        limit=limit,
        exclude_conversation_id=None if include_current else ctx.conversation_id,
        min_score=min_score,
    )
    return {
        "query": query.strip(),
        "results": [
            {
                "conversation_id": str(hit.conversation_id),
                "conversation_title": hit.conversation_title,
                "message_id": str(hit.message_id),
                "role": hit.role,
                "date": hit.created_at.date().isoformat(),
                "score": hit.score,
                "snippet": hit.snippet,
            }
            for hit in hits
        ],
    }


plugin = Plugin(
    slug="conversation_search",
    name="Conversation search",
    version="1.0",
    description="Finds what the user discussed in earlier conversations, by meaning.",
    tools=[
        Tool(
            name="conversation_search",
            description=(
                "Search the user's own earlier conversations by meaning and return short "
                "snippets with each conversation's title. Use it when the user refers to "
                "something discussed before."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "query": {
                        "type": "string",
                        "maxLength": MAX_QUERY_CHARS,
                        "description": "What to look for, in words.",
                    },
                    "limit": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": MAX_RESULTS,
                        "default": DEFAULT_RESULTS,
                    },
                    "include_current": {
                        "type": "boolean",
                        "default": False,
                        "description": "Also search the current conversation.",
                    },
                },
                "required": ["query"],
                "additionalProperties": False,
            },
            handler=search,
        )
    ],
    config_schema={
        "type": "object",
        "properties": {
            "min_score": {
                "type": "number",
                "title": "Lowest similarity shown (cosine, 0 to 1)",
                "minimum": 0,
                "maximum": 1,
                "default": DEFAULT_MIN_SCORE,
            }
        },
    },
)
