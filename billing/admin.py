"""Staff console for billing: plans and prices are edited here; the ledger, statements and
invoices are read-only, changed only through the services' actions (issuing invoices needs
the "add invoice" permission, marking one paid "change invoice"); the usage reports."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone

from chatsite.auth import request_user
from chatsite.errors import ServiceError

from . import selectors, services
from .models import (
    Invoice,
    Plan,
    PlanPool,
    PoolPrice,
    Statement,
    StatementLine,
    Subscription,
    UsageEvent,
    UsageReport,
)
from .pricing import format_micros

REPORT_DAYS = (1, 7, 30, 90)


class PlanPoolInline(admin.TabularInline[PlanPool, Plan]):
    model = PlanPool
    extra = 0
    fields = ["pool", "message_cap", "message_cap_window_seconds"]


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin[Plan]):
    list_display = [
        "name",
        "tier",
        "monthly_price",
        "requests_per_minute",
        "tokens_per_minute",
        "max_concurrent",
        "max_output_tokens",
        "message_cap",
        "message_cap_window_seconds",
        "is_default",
    ]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [PlanPoolInline]
    fieldsets = [
        (None, {"fields": ["name", "slug", "tier", "monthly_price_micros", "is_default"]}),
        (
            "Limits (per user)",
            {
                "fields": [
                    "requests_per_minute",
                    "tokens_per_minute",
                    "max_concurrent",
                    "max_output_tokens",
                    "message_cap",
                    "message_cap_window_seconds",
                ],
                "description": "Model pools listed below restrict the plan to them, each "
                "with its own cap; with none listed, the plan may use every pool of its tier.",
            },
        ),
        ("History", {"fields": ["history_retention_days"]}),
    ]

    @admin.display(description="Monthly price", ordering="monthly_price_micros")
    def monthly_price(self, plan: Plan) -> str:
        return format_micros(plan.monthly_price_micros, _currency())


def _currency() -> str:
    return str(settings.BILLING_CURRENCY)


@admin.register(Subscription)
class SubscriptionAdmin(admin.ModelAdmin[Subscription]):
    list_display = ["user", "plan", "started_at"]
    list_filter = ["plan"]
    search_fields = ["user__username", "user__email"]
    autocomplete_fields = ["user"]
    list_select_related = ["user", "plan"]
    readonly_fields = ["started_at", "updated_at"]


@admin.register(PoolPrice)
class PoolPriceAdmin(admin.ModelAdmin[PoolPrice]):
    list_display = ["pool", "input_micros_per_million", "output_micros_per_million", "updated_at"]
    list_select_related = ["pool"]


class _ReadOnly(admin.ModelAdmin[Any]):
    """Rows written only by the services: staff read them and act through actions."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(UsageEvent)
class UsageEventAdmin(_ReadOnly):
    list_display = [
        "occurred_at",
        "user",
        "pool",
        "status",
        "prompt_tokens",
        "output_tokens",
        "cached_tokens",
        "cost",
    ]
    list_filter = ["pool", "status", "tier"]
    search_fields = ["generation_id", "user__username"]
    date_hierarchy = "occurred_at"
    list_select_related = ["user", "pool"]
    show_full_result_count = False

    @admin.display(description="Cost", ordering="cost_micros")
    def cost(self, event: UsageEvent) -> str:
        return format_micros(event.cost_micros, _currency())


@admin.register(UsageReport)
class UsageReportAdmin(_ReadOnly):
    """Tokens and cost per pool per day, and the top users, over the last N days."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_active and request.user.is_staff)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        try:
            days = int(request.GET.get("days", "30"))
        except ValueError:
            days = 30
        days = days if days in REPORT_DAYS else 30
        end = timezone.now()
        start = end - timedelta(days=days)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Usage, last {days} day{'s' if days > 1 else ''}",
            "opts": self.model._meta,
            "days": days,
            "choices": REPORT_DAYS,
            "per_day": selectors.usage_per_pool_per_day(start=start, end=end),
            "top_users": selectors.top_users(start=start, end=end),
        }
        return TemplateResponse(request, "billing/admin_usage_report.html", context)


class StatementLineInline(admin.TabularInline[StatementLine, Statement]):
    model = StatementLine
    extra = 0
    fields = ["pool", "generations", "prompt_tokens", "output_tokens", "cost_micros"]
    readonly_fields = ["pool", "generations", "prompt_tokens", "output_tokens", "cost_micros"]
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Statement)
class StatementAdmin(_ReadOnly):
    list_display = [
        "period_start",
        "user",
        "plan_name",
        "plan_fee_micros",
        "usage_cost_micros",
        "total_micros",
        "generations",
    ]
    list_filter = ["period_start", "plan_name"]
    search_fields = ["user__username"]
    list_select_related = ["user"]
    inlines = [StatementLineInline]
    actions = ["issue_invoices"]

    def has_issue_permission(self, request: HttpRequest) -> bool:
        # Statements are read-only here; issuing one's invoice adds an invoice.
        return bool(request.user.has_perm("billing.add_invoice"))

    @admin.action(description="Issue invoices for the selected statements", permissions=["issue"])
    def issue_invoices(self, request: HttpRequest, queryset: QuerySet[Statement]) -> None:
        issued = 0
        for statement in queryset:
            try:
                services.invoice_issue(statement=statement)
            except ServiceError as exc:
                self.message_user(request, f"{statement}: {exc.message}", messages.WARNING)
            else:
                issued += 1
        self.message_user(request, f"Issued {issued} invoice(s).")


@admin.register(Invoice)
class InvoiceAdmin(_ReadOnly):
    list_display = [
        "id",
        "statement",
        "amount_minor",
        "currency",
        "status",
        "provider_reference",
        "issued_at",
        "paid_at",
        "paid_by",
    ]
    list_filter = ["status", "currency"]
    search_fields = ["statement__user__username", "provider_reference"]
    list_select_related = ["statement__user", "paid_by"]
    actions = ["mark_paid"]

    def has_mark_paid_permission(self, request: HttpRequest) -> bool:
        # Invoices are read-only here; marking one paid is the only change staff make to it.
        return bool(request.user.has_perm("billing.change_invoice"))

    @admin.action(description="Mark paid (payment received offline)", permissions=["mark_paid"])
    def mark_paid(self, request: HttpRequest, queryset: QuerySet[Invoice]) -> None:
        paid = 0
        for invoice in queryset:
            try:
                services.invoice_mark_paid(invoice=invoice, by=request_user(request))
            except ServiceError as exc:
                self.message_user(request, f"{invoice}: {exc.message}", messages.WARNING)
            else:
                paid += 1
        self.message_user(request, f"Marked {paid} invoice(s) paid.")
