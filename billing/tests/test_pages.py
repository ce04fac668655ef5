"""The usage page and API, statements over the API, and the staff console."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from billing import services
from billing.models import Invoice, Plan, Statement, UsageEvent
from billing.tests.conftest import QuotaClock
from billing.tests.factories import price, subscribe
from billing.tests.helpers import finish, send
from conversations.models import Conversation
from conversations.services import conversation_create
from inference.models import ModelPool

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(db: object) -> Client:
    staff = User.objects.create_superuser("boss", "boss@example.com", "pw")
    client = Client()
    client.force_login(staff)
    return client


def used_one_message(api_client: APIClient, user: User, pool: ModelPool) -> str:
    price(pool, input_price=1_000_000, output_price=2_000_000)
    generation_id = send(api_client, conversation_create(owner=user, model=pool.name)).json()[
        "generation"
    ]["id"]
    finish(generation_id, prompt_tokens=1000, output_tokens=500)
    return str(generation_id)


def test_the_usage_page_shows_this_periods_cost_and_what_is_left(
    api_client: APIClient, user: User, pool: ModelPool, quota_clock: QuotaClock
) -> None:
    subscribe(user, name="Plus", message_cap=5, requests_per_minute=30)
    used_one_message(api_client, user, pool)
    client = Client()
    client.force_login(user)

    response = client.get("/billing/usage/")

    assert response.status_code == 200
    page = response.content.decode()
    assert 'id="plan-name">Plus<' in page
    assert "0.002 USD" in page  # 1000 * 1.00 + 500 * 2.00 per million
    overview = response.context["overview"]
    assert [(c.pool_name, c.limit, c.used, c.remaining) for c in overview.caps] == [
        (pool.name, 5, 1, 4)
    ]
    assert overview.caps[0].resets_at is not None
    assert overview.caps[0].resets_at > timezone.now()
    assert overview.requests.remaining == 29


def test_the_usage_page_needs_a_log_in() -> None:
    response = Client().get("/billing/usage/")

    assert response.status_code == 302


def test_the_usage_api_answers_the_same(api_client: APIClient, user: User, pool: ModelPool) -> None:
    subscribe(user, message_cap=5)
    used_one_message(api_client, user, pool)

    body = api_client.get("/api/v1/billing/usage").json()

    assert body["plan"]["message_cap"] == 5
    assert body["pools"] == [
        {
            "pool": pool.name,
            "generations": 1,
            "prompt_tokens": 1000,
            "output_tokens": 500,
            "cost_micros": 2000,
        }
    ]
    assert body["usage_cost_micros"] == 2000
    assert body["caps"][0]["remaining"] == 4
    assert body["concurrent_in_use"] == 0
    assert body["requests"]["limit"] == body["plan"]["requests_per_minute"]


def test_the_statements_api_lists_the_callers_statements(
    api_client: APIClient, user: User, other_user: User, pool: ModelPool
) -> None:
    subscribe(user, monthly_price_micros=1_000_000)
    UsageEvent.objects.create(
        generation_id=uuid.uuid4(),
        user=user,
        pool=pool,
        tier="plus",
        status="complete",
        prompt_tokens=10,
        output_tokens=10,
        cost_micros=500,
        occurred_at=datetime(2026, 3, 3, tzinfo=UTC),
    )
    statement = services.statement_close(user=user, period_start=date(2026, 3, 1))
    services.invoice_issue(statement=statement)
    services.statement_close(user=other_user, period_start=date(2026, 3, 1))

    body = api_client.get("/api/v1/billing/statements").json()

    assert len(body) == 1
    assert body[0]["total_micros"] == 1_000_500
    assert body[0]["lines"] == [
        {
            "pool": pool.name,
            "generations": 1,
            "prompt_tokens": 10,
            "output_tokens": 10,
            "cost_micros": 500,
        }
    ]
    assert body[0]["invoice"]["amount_minor"] == 100
    assert body[0]["invoice"]["status"] == "open"


def test_staff_see_tokens_and_cost_per_pool_per_day_and_the_top_users(
    api_client: APIClient, user: User, pool: ModelPool, staff_client: Client
) -> None:
    used_one_message(api_client, user, pool)

    response = staff_client.get("/admin/billing/usagereport/?days=7")

    assert response.status_code == 200
    per_day = response.context["per_day"]
    assert [(row["pool__name"], row["prompt_tokens"], row["cost_micros"]) for row in per_day] == [
        (pool.name, 1000, 2000)
    ]
    assert [row["user__username"] for row in response.context["top_users"]] == [user.username]
    assert b"0.002 USD" in response.content


def test_staff_edit_plans_and_read_the_ledger(
    api_client: APIClient, user: User, pool: ModelPool, staff_client: Client
) -> None:
    used_one_message(api_client, user, pool)
    free = Plan.objects.get(slug="free")

    assert staff_client.get(f"/admin/billing/plan/{free.pk}/change/").status_code == 200
    assert staff_client.get("/admin/billing/usageevent/").status_code == 200
    assert staff_client.get("/admin/billing/subscription/add/").status_code == 200
    event = UsageEvent.objects.get()
    assert staff_client.get(f"/admin/billing/usageevent/{event.pk}/change/").status_code == 200


def test_staff_issue_invoices_and_mark_them_paid(
    user: User, staff_client: Client, pool: ModelPool
) -> None:
    subscribe(user, monthly_price_micros=1_000_000)
    statement = services.statement_close(user=user, period_start=date(2026, 3, 1))

    staff_client.post(
        "/admin/billing/statement/",
        {"action": "issue_invoices", "_selected_action": [statement.pk]},
    )
    invoice = Invoice.objects.get(statement=statement)
    staff_client.post(
        "/admin/billing/invoice/", {"action": "mark_paid", "_selected_action": [invoice.pk]}
    )

    invoice.refresh_from_db()
    assert invoice.status == Invoice.Status.PAID
    assert invoice.paid_by is not None and invoice.paid_by.username == "boss"
    assert Statement.objects.count() == 1


def test_a_statement_page_lists_its_lines(
    user: User, staff_client: Client, conversation: Conversation
) -> None:
    statement = services.statement_close(user=user, period_start=date(2026, 3, 1))

    assert staff_client.get(f"/admin/billing/statement/{statement.pk}/change/").status_code == 200
