"""Plans, subscriptions, prices, the usage ledger, statements and invoices.

Money is integer micro-units of `settings.BILLING_CURRENCY` (1 USD = 1_000_000 micros)
everywhere except on invoices, which carry the amount to pay in minor units (cents); the
rounding rules live in `billing.pricing`.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from inference.models import ModelPool


def tier_choices() -> list[tuple[str, str]]:
    """The priority tiers the scheduler knows, best first."""
    priorities: dict[str, int] = settings.INFERENCE_TIER_PRIORITY
    return [(tier, tier) for tier in sorted(priorities, key=lambda tier: priorities[tier])]


class Plan(models.Model):
    """What a subscriber may use and how fast: limits, caps, priority tier and monthly fee.

    A plan with no pools listed may use every pool its tier may (`ModelPool.tiers`), capped
    by its default message cap; listing pools restricts the plan to them, each with its own
    cap. Every limit applies per user.
    """

    slug = models.SlugField(max_length=50, unique=True)
    name = models.CharField(max_length=100)
    tier = models.CharField(
        max_length=32,
        choices=tier_choices,
        help_text="Priority tier: sets the scheduler's priority and the degradation order.",
    )
    monthly_price_micros = models.PositiveBigIntegerField(
        default=0, help_text="Monthly fee in micro-units of the currency (1.00 = 1000000)."
    )
    requests_per_minute = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    tokens_per_minute = models.PositiveIntegerField(
        validators=[MinValueValidator(1)],
        help_text="Prompt plus output tokens; a request reserves its prompt and max output.",
    )
    max_concurrent = models.PositiveIntegerField(
        validators=[MinValueValidator(1)], help_text="Answers queued or streaming at once."
    )
    max_output_tokens = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    message_cap = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Messages per model pool per rolling window; empty means no cap.",
    )
    message_cap_window_seconds = models.PositiveIntegerField(
        default=3 * 3600, validators=[MinValueValidator(1)]
    )
    pools = models.ManyToManyField(ModelPool, through="PlanPool", blank=True, related_name="+")
    is_default = models.BooleanField(
        default=False, help_text="The plan of every user without a subscription (exactly one)."
    )
    history_retention_days = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Conversations idle longer than this many days are deleted; empty: kept.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["monthly_price_micros", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["is_default"], condition=Q(is_default=True), name="billing_one_default_plan"
            )
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if self.tier not in settings.INFERENCE_TIER_PRIORITY:
            raise ValidationError({"tier": f"Unknown tier {self.tier!r}."})


class PlanPool(models.Model):
    """A pool a plan may use, with its own message cap (empty: the plan's default)."""

    plan = models.ForeignKey(Plan, on_delete=models.CASCADE, related_name="plan_pools")
    pool = models.ForeignKey(ModelPool, on_delete=models.CASCADE, related_name="plan_pools")
    message_cap = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)]
    )
    message_cap_window_seconds = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)]
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["plan", "pool"], name="billing_plan_pool_unique")
        ]

    def __str__(self) -> str:
        return f"{self.plan} · {self.pool}"


class Subscription(models.Model):
    """The plan a user is on; a user without one is on the default plan."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="subscription"
    )
    plan = models.ForeignKey(Plan, on_delete=models.PROTECT, related_name="subscriptions")
    started_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.user} on {self.plan}"


class PoolPrice(models.Model):
    """What a pool's tokens cost, per million, in micro-units (0.15 per million = 150000)."""

    pool = models.OneToOneField(ModelPool, on_delete=models.CASCADE, related_name="price")
    input_micros_per_million = models.PositiveBigIntegerField(default=0)
    output_micros_per_million = models.PositiveBigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"Price of {self.pool}"


class UsageEvent(models.Model):
    """What one generation consumed and cost: written once, its generation id the dedup key.

    The generation id is not a foreign key: the ledger outlives deleted conversations.
    """

    generation_id = models.UUIDField(unique=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="usage_events"
    )
    pool = models.ForeignKey(ModelPool, on_delete=models.PROTECT, related_name="usage_events")
    plan = models.ForeignKey(
        Plan, null=True, blank=True, on_delete=models.SET_NULL, related_name="usage_events"
    )
    tier = models.CharField(max_length=32)
    status = models.CharField(max_length=16)
    prompt_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    cached_tokens = models.PositiveIntegerField(default=0)
    input_micros_per_million = models.PositiveBigIntegerField(default=0)
    output_micros_per_million = models.PositiveBigIntegerField(default=0)
    cost_micros = models.PositiveBigIntegerField(default=0)
    occurred_at = models.DateTimeField(help_text="When the generation finished.")
    recorded_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-occurred_at"]
        indexes = [
            models.Index(fields=["user", "occurred_at"], name="usage_user_time_idx"),
            models.Index(fields=["pool", "occurred_at"], name="usage_pool_time_idx"),
            models.Index(fields=["occurred_at"], name="usage_time_idx"),
        ]

    def __str__(self) -> str:
        return f"Usage of {self.generation_id}"


class UsageReport(UsageEvent):
    """The staff reports (per pool per day, top users): a menu entry over the ledger."""

    class Meta:
        proxy = True
        verbose_name = "usage report"
        verbose_name_plural = "usage reports"


class Statement(models.Model):
    """A user's month: usage by pool, its cost and the plan fee. Closed once, never edited."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="statements"
    )
    period_start = models.DateField(help_text="First day of the month (UTC).")
    period_end = models.DateField(help_text="First day of the next month (exclusive).")
    plan = models.ForeignKey(
        Plan, null=True, blank=True, on_delete=models.SET_NULL, related_name="statements"
    )
    plan_name = models.CharField(max_length=100)
    plan_fee_micros = models.PositiveBigIntegerField(default=0)
    usage_cost_micros = models.PositiveBigIntegerField(default=0)
    total_micros = models.PositiveBigIntegerField(default=0)
    generations = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-period_start", "user_id"]
        constraints = [
            models.UniqueConstraint(fields=["user", "period_start"], name="billing_statement_once")
        ]

    def __str__(self) -> str:
        return f"{self.user} {self.period_start:%Y-%m}"


class StatementLine(models.Model):
    """One pool's share of a statement."""

    statement = models.ForeignKey(Statement, on_delete=models.CASCADE, related_name="lines")
    pool = models.ForeignKey(ModelPool, on_delete=models.PROTECT, related_name="+")
    generations = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    cost_micros = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["pool__name"]
        constraints = [
            models.UniqueConstraint(fields=["statement", "pool"], name="billing_line_per_pool")
        ]

    def __str__(self) -> str:
        return f"{self.statement} · {self.pool}"


class Invoice(models.Model):
    """A statement's amount due, handed to the payment provider."""

    class Status(models.TextChoices):
        OPEN = "open"
        PAID = "paid"
        VOID = "void"

    statement = models.OneToOneField(Statement, on_delete=models.PROTECT, related_name="invoice")
    amount_minor = models.PositiveBigIntegerField(help_text="In minor units (cents).")
    currency = models.CharField(max_length=3)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.OPEN)
    provider = models.CharField(max_length=200, help_text="Dotted path of the provider class.")
    provider_reference = models.CharField(max_length=200, blank=True)
    issued_at = models.DateTimeField(auto_now_add=True)
    paid_at = models.DateTimeField(null=True, blank=True)
    paid_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The staff member who recorded an offline payment.",
    )

    class Meta:
        ordering = ["-issued_at"]

    def __str__(self) -> str:
        return f"Invoice {self.pk} ({self.status})"
