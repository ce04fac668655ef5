"""The Celery task that embeds a large attachment's chunks, apart from conversations/tasks.py:
attachments.py queues it, and tasks.py imports the services that import attachments.py."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.db import transaction

from . import attachment_context
from .task_retry import RETRY_POLICY


@shared_task(soft_time_limit=240, time_limit=300, **RETRY_POLICY)
def embed_attachment(attachment_id: str) -> bool:
    """Embed the chunks of a large attachment for retrieval (a no-op once they are)."""
    return attachment_context.attachment_embed(attachment_id=attachment_id)


def attachment_embed_later(*, attachment_id: Any) -> None:
    """Queue `embed_attachment` after commit. Robust: should the broker be down, the upload
    stands, and the first message that needs the vectors computes them."""
    transaction.on_commit(lambda: embed_attachment.delay(str(attachment_id)), robust=True)
