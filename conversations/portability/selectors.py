"""Reads of import jobs: another user's job is NotFound, like one that never existed."""

from __future__ import annotations

import uuid
from typing import Any

from chatsite.errors import NotFound
from chatsite.redis import sync_redis

from ..models import ImportJob
from .importing import import_progress_key

IMPORT_JOBS_LISTED = 20


def import_job_for_user(*, user: Any, job_id: uuid.UUID) -> ImportJob:
    """The job if `user` started it; otherwise NotFound."""
    if not getattr(user, "is_authenticated", False):
        raise NotFound("Import not found.")
    job = ImportJob.objects.filter(owner_id=user.pk, pk=job_id).first()
    if job is None:
        raise NotFound("Import not found.")
    return job


def import_jobs_of(*, user: Any) -> list[ImportJob]:
    """The user's latest imports, newest first."""
    return list(ImportJob.objects.filter(owner_id=user.pk)[:IMPORT_JOBS_LISTED])


def import_job_progress(*, job: ImportJob) -> int:
    """Conversations checked (while `validating`) or written (while `importing`) so far."""
    if job.status == ImportJob.Status.DONE:
        return job.imported
    if job.status not in (ImportJob.Status.VALIDATING, ImportJob.Status.IMPORTING):
        return 0
    value = sync_redis().get(import_progress_key(job.pk))
    return int(value) if value else 0
