"""Celery tasks of billing: reconciliation every minute, statements once a month ends.

An account deleted while either runs is passed over: nothing is written for it and the task
goes on with the others (`chatsite.vanishing`).
"""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from . import services
from .selectors import month_start


@shared_task(ignore_result=True, soft_time_limit=240, time_limit=300)
def reconcile_usage() -> dict[str, int]:
    """Repair drift between the ledger, the generations and the Redis counters."""
    return services.usage_reconcile().as_dict()


@shared_task(ignore_result=True, soft_time_limit=1800, time_limit=2000)
def close_statements() -> int:
    """Close last month into statements and invoice them, once its late usage has landed.

    Runs hourly and does nothing once every statement of last month exists.
    """
    delayed = timezone.now() - timedelta(seconds=settings.BILLING_STATEMENT_DELAY_SECONDS)
    previous = month_start(month_start(delayed) - timedelta(days=1))
    statements = services.statements_close(period_start=previous)
    services.invoices_issue(period_start=previous)
    return len(statements)
