"""Per-user events for open pages: a title written in the background, a conversation deleted.

A Redis Stream per user (`<prefix>:events:{s<n>}:<user id>`, capped and expiring, under a
stream tag as generations' streams are: `inference.queue`), served as Server-Sent
Events by `GET /api/v1/events/stream` (conversations/api/events.py), so any edge process can
serve any user and a reconnecting page gets what it missed with `Last-Event-ID`.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings

from chatsite.redis import stream_tag, sync_redis


def user_events_key(user_id: Any) -> str:
    tag = stream_tag(f"user-{user_id}")
    return f"{settings.INFERENCE_REDIS_PREFIX}:events:{tag}:{user_id}"


def user_event_publish(*, user_id: Any, event: str, data: dict[str, Any]) -> str:
    """Append `event` to the user's stream; returns its id. Call after commit."""
    redis = sync_redis()
    try:
        stream = user_events_key(user_id)
        entry_id = redis.xadd(
            stream,
            {"event": event, "data": json.dumps(data)},
            maxlen=settings.USER_EVENTS_MAXLEN,
            approximate=True,
        )
        redis.expire(stream, settings.USER_EVENTS_TTL_SECONDS)
    finally:
        redis.close()
    return str(entry_id)
