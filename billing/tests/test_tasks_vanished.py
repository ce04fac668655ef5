"""Billing's Celery tasks and accounts that go while they work: reconciliation and the monthly
close return quietly (no traceback, no retry) and write nothing for an account deleted between
their read and their write, and go on with everyone else."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from accounts.tests.factories import UserFactory
from billing import services
from billing.models import Invoice, Statement, UsageEvent
from billing.providers import PaymentProvider
from billing.tasks import close_statements, reconcile_usage
from billing.tests.factories import subscribe
from chatsite.errors import ServiceError
from chatsite.testing import logged, run_task_quietly
from inference.models import Generation, ModelPool
from inference.services import generation_finish
from inference.tests.fixtures import send_turn

pytestmark = pytest.mark.django_db


def _deleted_first(
    monkeypatch: pytest.MonkeyPatch, name: str, user: User
) -> Callable[[], list[Any]]:
    """Make `billing.services.<name>`, called between a task's read and its write, delete
    `user`'s account before its first call for them; returns the record of that call."""
    real = getattr(services, name)
    raced: list[Any] = []

    def deleted_meanwhile(*args: Any, **kwargs: Any) -> Any:
        if not raced:
            raced.append(kwargs or args)
            User.objects.filter(pk=user.pk).delete()
        return real(*args, **kwargs)

    monkeypatch.setattr(services, name, deleted_meanwhile)
    return lambda: raced


# Reconciliation


def _unrecorded(user: User) -> Generation:
    """A final answer whose usage event was never written (its process died), long enough
    ago for the reconciler to take it."""
    turn = send_turn(user)
    generation_finish(generation_id=turn.generation.id, status="complete", text="An answer.")
    UsageEvent.objects.filter(generation_id=turn.generation.id).delete()
    Generation.objects.filter(pk=turn.generation.pk).update(
        finished_at=timezone.now() - timedelta(minutes=10)
    )
    return Generation.objects.get(pk=turn.generation.pk)


def test_reconciliation_records_nothing_for_an_account_deleted_before_the_insert(
    user: User, pool: ModelPool, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = _unrecorded(user)
    stays = _unrecorded(UserFactory.create())
    # The price is read after the generation and before its usage event is inserted.
    raced = _deleted_first(monkeypatch, "pool_price", user)

    report = run_task_quietly(reconcile_usage, caplog=caplog)
    assert raced()
    assert list(UsageEvent.objects.values_list("generation_id", flat=True)) == [stays.pk]
    assert not UsageEvent.objects.filter(generation_id=gone.pk).exists()
    assert report["events_recorded"] == 1
    assert logged(caplog, "chatsite.vanishing") == [
        f"usage of generation {gone.pk}: gone before it was written, nothing written"
    ]


# The monthly close


def _last_month() -> date:
    today = timezone.now()
    return date(today.year - (today.month == 1), (today.month - 2) % 12 + 1, 1)


def _used_last_month(user: User, pool: ModelPool) -> None:
    subscribe(user, monthly_price_micros=1_000_000)
    month = _last_month()
    UsageEvent.objects.create(
        generation_id=uuid.uuid4(),
        user=user,
        pool=pool,
        tier="plus",
        status="complete",
        prompt_tokens=1,
        output_tokens=1,
        cost_micros=10,
        occurred_at=datetime(month.year, month.month, 2, tzinfo=UTC),
    )


def test_the_close_writes_no_statement_for_an_account_deleted_while_it_is_made(
    user: User,
    other_user: User,
    pool: ModelPool,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
) -> None:
    settings.BILLING_STATEMENT_DELAY_SECONDS = 0
    _used_last_month(user, pool)
    _used_last_month(other_user, pool)
    # The ledger is read after the user and before their statement is inserted.
    raced = _deleted_first(monkeypatch, "usage_by_pool", user)

    assert run_task_quietly(close_statements, caplog=caplog) == 1
    assert raced()
    assert list(Statement.objects.values_list("user_id", flat=True)) == [other_user.pk]
    assert list(Invoice.objects.values_list("statement__user_id", flat=True)) == [other_user.pk]


class RecordingProvider(PaymentProvider):
    """A provider that remembers whose invoices it was handed."""

    def __init__(self) -> None:
        self.accounts: list[int] = []

    def invoice_issue(self, *, invoice: Invoice) -> str:
        self.accounts.append(invoice.statement.user_id)
        return f"recorded-{invoice.pk}"


def test_the_close_issues_no_invoice_for_an_account_deleted_while_it_is_invoiced(
    user: User,
    other_user: User,
    pool: ModelPool,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
) -> None:
    settings.BILLING_STATEMENT_DELAY_SECONDS = 0
    provider = RecordingProvider()
    monkeypatch.setattr(services, "payment_provider", lambda: provider)
    for account in (user, other_user):
        _used_last_month(account, pool)
        services.statement_close(user=account, period_start=_last_month())
    # The amount is worked out after the statement is read and before its invoice is inserted.
    raced = _deleted_first(monkeypatch, "micros_to_minor", user)

    assert run_task_quietly(close_statements, caplog=caplog) == 0
    assert raced()
    assert not Statement.objects.filter(user_id=user.pk).exists()
    assert list(Invoice.objects.values_list("statement__user_id", flat=True)) == [other_user.pk]
    assert provider.accounts == [other_user.pk], "the provider heard of the other one only"


def test_staff_issuing_an_invoice_for_an_account_deleted_meanwhile_are_told_so(
    user: User, pool: ModelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The admin's "issue invoices" action calls `invoice_issue` and shows its ServiceError."""
    _used_last_month(user, pool)
    statement = services.statement_close(user=user, period_start=_last_month())
    _deleted_first(monkeypatch, "micros_to_minor", user)

    with pytest.raises(ServiceError) as refused:
        services.invoice_issue(statement=statement)
    assert (refused.value.code, refused.value.status) == ("account_deleted", 404)
    assert not Invoice.objects.exists()
