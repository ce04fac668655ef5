"""Monthly statements add up to the ledger plus the plan fee; invoices go to the provider."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from billing import services, tasks
from billing.models import Invoice, Plan, Statement, UsageEvent
from billing.providers import PaymentProvider
from billing.tests.factories import subscribe
from chatsite.errors import ServiceError
from inference.models import ModelPool

pytestmark = pytest.mark.django_db

MARCH = date(2026, 3, 1)


def event(user: User, pool: ModelPool, at: datetime, prompt: int, output: int, cost: int) -> None:
    UsageEvent.objects.create(
        generation_id=uuid.uuid4(),
        user=user,
        pool=pool,
        tier="plus",
        status="complete",
        prompt_tokens=prompt,
        output_tokens=output,
        cost_micros=cost,
        occurred_at=at,
    )


@pytest.fixture
def two_pools(pool: ModelPool) -> tuple[ModelPool, ModelPool]:
    return pool, ModelPool.objects.create(name="bigger-model", served_model="bigger")


def test_a_statement_adds_up_to_its_lines_and_the_plan_fee(
    user: User, other_user: User, two_pools: tuple[ModelPool, ModelPool]
) -> None:
    small, big = two_pools
    subscribe(user, monthly_price_micros=20_000_000)
    event(user, small, datetime(2026, 3, 1, 0, 0, tzinfo=UTC), 100, 10, 1_001)
    event(user, small, datetime(2026, 3, 15, 12, 0, tzinfo=UTC), 200, 20, 2_002)
    event(user, big, datetime(2026, 3, 31, 23, 59, 59, tzinfo=UTC), 1000, 500, 400_000)
    # Outside the month, and another user's: not on this statement.
    event(user, small, datetime(2026, 4, 1, 0, 0, tzinfo=UTC), 5, 5, 9_999)
    event(user, small, datetime(2026, 2, 28, 23, 59, tzinfo=UTC), 5, 5, 9_999)
    event(other_user, small, datetime(2026, 3, 10, tzinfo=UTC), 5, 5, 9_999)

    statement = services.statement_close(user=user, period_start=MARCH)

    lines = {line.pool.name: line for line in statement.lines.all()}
    assert set(lines) == {small.name, big.name}
    assert (lines[small.name].generations, lines[small.name].cost_micros) == (2, 3_003)
    assert (lines[small.name].prompt_tokens, lines[small.name].output_tokens) == (300, 30)
    assert (lines[big.name].generations, lines[big.name].cost_micros) == (1, 400_000)
    assert statement.usage_cost_micros == sum(line.cost_micros for line in lines.values())
    assert statement.plan_fee_micros == 20_000_000
    assert statement.total_micros == 20_403_003
    assert (statement.generations, statement.prompt_tokens, statement.output_tokens) == (
        3,
        1300,
        530,
    )
    assert statement.period_end == date(2026, 4, 1)


def test_closing_a_month_twice_returns_the_same_statement(user: User, pool: ModelPool) -> None:
    event(user, pool, datetime(2026, 3, 5, tzinfo=UTC), 10, 10, 100)
    first = services.statement_close(user=user, period_start=MARCH)
    event(user, pool, datetime(2026, 3, 6, tzinfo=UTC), 10, 10, 100)

    again = services.statement_close(user=user, period_start=MARCH)

    assert again.pk == first.pk
    assert again.usage_cost_micros == 100
    assert Statement.objects.count() == 1


def test_the_month_closes_for_users_with_usage_or_a_fee(
    user: User, other_user: User, pool: ModelPool
) -> None:
    idle = User.objects.create_user("idle")
    subscribe(other_user, monthly_price_micros=5_000_000)
    event(user, pool, datetime(2026, 3, 5, tzinfo=UTC), 10, 10, 100)

    closed = services.statements_close(period_start=MARCH)

    assert {s.user_id for s in closed} == {user.pk, other_user.pk}
    assert not Statement.objects.filter(user=idle).exists()
    assert services.statements_close(period_start=MARCH) == []


def test_an_invoice_is_the_total_in_cents_with_the_offline_providers_reference(
    user: User, pool: ModelPool
) -> None:
    subscribe(user, monthly_price_micros=20_000_000)
    event(user, pool, datetime(2026, 3, 5, tzinfo=UTC), 10, 10, 4_999)
    statement = services.statement_close(user=user, period_start=MARCH)

    invoice = services.invoice_issue(statement=statement)

    assert (invoice.amount_minor, invoice.currency, invoice.status) == (2000, "USD", "open")
    assert invoice.provider == "billing.providers.OfflineProvider"
    assert invoice.provider_reference == f"offline-{invoice.pk}"
    assert services.invoice_issue(statement=statement).pk == invoice.pk


def test_staff_mark_an_offline_invoice_paid_once(user: User, pool: ModelPool) -> None:
    staff = User.objects.create_user("staff", is_staff=True)
    subscribe(user, monthly_price_micros=1_000_000)
    invoice = services.invoice_issue(
        statement=services.statement_close(user=user, period_start=MARCH)
    )

    paid = services.invoice_mark_paid(invoice=invoice, by=staff)

    assert (paid.status, paid.paid_by_id) == (Invoice.Status.PAID, staff.pk)
    assert paid.paid_at is not None
    with pytest.raises(ServiceError) as refused:
        services.invoice_mark_paid(invoice=invoice, by=staff)
    assert refused.value.code == "invoice_not_open"


class CardProvider(PaymentProvider):
    """A provider that collects by itself: staff may not mark its invoices paid."""

    def invoice_issue(self, *, invoice: Invoice) -> str:
        return f"card-{invoice.amount_minor}"


def test_the_provider_is_chosen_by_dotted_path(user: User, settings: Any) -> None:
    settings.BILLING_PAYMENT_PROVIDER = f"{__name__}.CardProvider"
    subscribe(user, monthly_price_micros=3_000_000)
    staff = User.objects.create_user("staff", is_staff=True)

    invoice = services.invoice_issue(
        statement=services.statement_close(user=user, period_start=MARCH)
    )

    assert invoice.provider_reference == "card-300"
    with pytest.raises(ServiceError) as refused:
        services.invoice_mark_paid(invoice=invoice, by=staff)
    assert refused.value.code == "manual_payment_unsupported"


def test_a_statement_with_nothing_to_pay_gets_no_invoice(user: User) -> None:
    statement = services.statement_close(user=user, period_start=MARCH)

    with pytest.raises(ServiceError) as refused:
        services.invoice_issue(statement=statement)

    assert refused.value.code == "nothing_to_invoice"
    assert services.invoices_issue(period_start=MARCH) == []


def test_the_monthly_task_closes_last_month_and_invoices_it(
    user: User, pool: ModelPool, settings: Any
) -> None:
    settings.BILLING_STATEMENT_DELAY_SECONDS = 0
    plan: Plan = subscribe(user, monthly_price_micros=1_000_000)
    today = timezone.now()
    last_month = date(today.year - (today.month == 1), (today.month - 2) % 12 + 1, 1)
    event(user, pool, datetime(last_month.year, last_month.month, 2, tzinfo=UTC), 1, 1, 10)

    assert tasks.close_statements() == 1
    statement = Statement.objects.get(user=user)
    assert statement.period_start == last_month
    assert statement.plan_id == plan.pk
    assert statement.invoice.amount_minor == 100
    assert tasks.close_statements() == 0
