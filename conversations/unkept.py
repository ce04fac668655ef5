"""Conversations of keys that do not keep them, remembered until they are removed.

The view that served the request removes its conversation once the answer is final. Should
that not happen (the edge process died, the answer outlived the request), the conversation
stays listed here, in a Redis sorted set scored by when it was made, and the sweeper
(`tasks.sweep_unkept_conversations`, every minute) removes it once its answer is final.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings

from chatsite.redis import sync_redis
from conversations.models import Conversation
from conversations.removal import conversation_remove
from inference import queue

logger = logging.getLogger(__name__)


def _key() -> str:
    return queue.key("oai", "unkept")


def unkept_remember(*, conversation_id: Any) -> None:
    """List a conversation to be removed once answered."""
    sync_redis().zadd(_key(), {str(conversation_id): queue.now_ms()})


def unkept_listed(*, conversation_id: Any) -> bool:
    """Whether the conversation is one of those to be removed once answered."""
    return sync_redis().zscore(_key(), str(conversation_id)) is not None


def unkept_discard(*, conversation_id: Any) -> bool:
    """Remove the conversation, leaving no tombstone, once none of its answers is in flight
    (their usage is settled by then); False, leaving it, while one still is."""
    conversation = Conversation.objects.filter(pk=conversation_id).first()
    if conversation is not None and not conversation_remove(
        conversation=conversation, keep_tombstone=False, unless_in_flight=True
    ):
        return False
    sync_redis().zrem(_key(), str(conversation_id))
    return True


def unkept_sweep(*, older_than_seconds: int | None = None) -> int:
    """Remove the listed conversations older than `older_than_seconds` whose answers are
    final; returns how many were removed."""
    if older_than_seconds is None:
        older_than_seconds = settings.OPENAI_API_UNKEPT_SWEEP_AFTER_SECONDS
    cutoff = queue.now_ms() - older_than_seconds * 1000
    removed = 0
    for conversation_id in sync_redis().zrangebyscore(_key(), "-inf", cutoff, 0, 1000):
        try:
            removed += unkept_discard(conversation_id=conversation_id)
        except Exception:
            logger.exception("could not remove unkept conversation %s", conversation_id)
    return removed
