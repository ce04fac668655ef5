"""Writes of imports: an upload kept for the worker, and its job queued."""

from __future__ import annotations

from datetime import timedelta
from typing import IO, Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from ..errors import ErrorCode
from ..models import ImportChunk, ImportJob
from .formats import ImportFault
from .importers import sniff
from .tasks import import_request

FILENAME_MAX_CHARS = 255
# An import not ended after this long is taken as lost (its task's time limit is an hour) and
# no longer holds the owner's next upload back.
IMPORT_RUNNING_AT_MOST_SECONDS = 3600


def _too_large(size: int) -> ImportFault:
    return ImportFault(
        ErrorCode.IMPORT_TOO_LARGE,
        f"The file is {size} bytes; an import takes at most {settings.IMPORT_MAX_BYTES}.",
        status=413,
        detail={"max_bytes": settings.IMPORT_MAX_BYTES, "bytes": size},
    )


def import_job_create(*, owner: Any, file: IO[bytes], filename: str, size: int) -> ImportJob:
    """Keep an uploaded file for import, in pieces of IMPORT_CHUNK_BYTES (in Postgres, so a
    worker on any host reads it), and queue its import after commit.

    Refused at once: an empty file, one over IMPORT_MAX_BYTES (413), one that is neither
    JSON nor a zip by its first bytes, and a second upload while one of the owner's imports
    is still running (409: one at a time per user, so nobody fills the database with uploads).
    What the file holds is checked by the task.
    """
    if size <= 0:
        raise ImportFault(ErrorCode.IMPORT_EMPTY, "The file is empty.")
    if size > settings.IMPORT_MAX_BYTES:
        raise _too_large(size)
    head = file.read(64)
    sniff(head)
    with transaction.atomic():
        # The owner's row is locked while running imports are looked for: two uploads at
        # once cannot both pass.
        get_user_model().objects.select_for_update().filter(pk=owner.pk).first()
        since = timezone.now() - timedelta(seconds=IMPORT_RUNNING_AT_MOST_SECONDS)
        running = ImportJob.objects.filter(owner_id=owner.pk, created_at__gte=since).exclude(
            status__in=ImportJob.FINAL_STATUSES
        )
        if running.exists():
            raise ImportFault(
                ErrorCode.IMPORT_IN_PROGRESS,
                "One of your imports is still running: wait for it to end.",
                status=409,
            )
        job = ImportJob.objects.create(
            owner=owner, filename=filename[:FILENAME_MAX_CHARS], size_bytes=size
        )
        index, stored, piece = 0, 0, head
        while True:
            piece += file.read(settings.IMPORT_CHUNK_BYTES - len(piece))
            if not piece:
                break
            stored += len(piece)
            if stored > settings.IMPORT_MAX_BYTES:  # the size announced was not the size sent
                raise _too_large(stored)
            ImportChunk.objects.create(job=job, index=index, data=piece)
            index, piece = index + 1, b""
        if stored != size:
            job.size_bytes = stored
            job.save(update_fields=["size_bytes"])
        import_request(job=job)
    return job
