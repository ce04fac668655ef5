"""The Celery task of imports, and the request that queues it after commit.

Idempotent like the app's other tasks (conversations/tasks.py): a job already ended is left
alone, and a run that dies midway wrote nothing (one transaction), so `acks_late` and retries
on faults of the database or Redis are safe.
"""

from __future__ import annotations

from celery import shared_task
from django.db import transaction

from ..models import ImportJob
from ..tasks import RETRYABLE
from .importing import import_job_run


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
    """Queue the job's import once the upload is committed (the worker must see its pieces)."""
    job_id = str(job.pk)
    transaction.on_commit(lambda: run_import.delay(job_id))
