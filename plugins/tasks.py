"""Celery tasks of plugins: keeping the conversation search index current."""

from __future__ import annotations

from celery import shared_task

from plugins.builtin import search_index


@shared_task(ignore_result=True, soft_time_limit=60, time_limit=90)
def search_index_message(message_id: str) -> bool:
    """Embed one finished message for `conversation_search` (idempotent)."""
    return search_index.search_index_message(message_id=message_id)
