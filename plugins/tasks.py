"""Celery tasks of plugins: keeping the conversation search index current."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.db import transaction

from plugins.builtin import search_index


@shared_task(ignore_result=True, soft_time_limit=60, time_limit=90)
def search_index_message(message_id: str) -> bool:
    """Embed one finished message for `conversation_search` (idempotent)."""
    return search_index.search_index_message(message_id=message_id)


def search_index_schedule(*, message_id: Any) -> None:
    """Queue `search_index_message` for after the current transaction commits.

    Robust: a broker outage must not fail the write that triggered it; the query indexes what
    is missing anyway (`search_index.search_index_pending`).
    """
    transaction.on_commit(lambda: search_index_message.delay(str(message_id)), robust=True)
