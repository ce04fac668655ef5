"""The Celery task of imports, and the request that queues it after commit.

Idempotent like the app's other tasks (conversations/tasks.py): a job already ended is left
alone, and a run that dies midway wrote nothing (one transaction), so `acks_late` and retries
on faults of the database or Redis are safe.
"""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import transaction

from chatsite.errors import ServiceError

from ..errors import ErrorCode
from ..models import ImportJob
from ..task_retry import RETRYABLE
from .importing import import_job_fail, import_job_run

logger = logging.getLogger(__name__)


@shared_task(
    soft_time_limit=3300,
    time_limit=3600,
    autoretry_for=RETRYABLE,
    retry_backoff=2,
    retry_backoff_max=120,
    retry_jitter=True,
    max_retries=5,
    acks_late=True,
    ignore_result=True,
)
def run_import(job_id: str) -> str | None:
    """Check, then write, every conversation of an uploaded file (importing.py)."""
    job = import_job_run(job_id=job_id)
    return job.status if job is not None else None


def import_request(*, job: ImportJob) -> None:
    """Queue the job's import once the upload is committed (the worker must see its pieces).
    A broker that cannot take it ends the job `failed` at once rather than `queued` forever."""

    def _enqueue() -> None:
        try:
            run_import.delay(str(job.pk))
        except Exception:
            logger.exception("import %s could not be queued", job.pk)
            import_job_fail(
                job=job,
                fault=ServiceError(
                    ErrorCode.IMPORT_FAILED,
                    "The import could not be started; nothing was imported. Please try again.",
                ),
            )

    transaction.on_commit(_enqueue)
