"""Reads of billing that views and other apps share: plans, limits, usage, reports."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, NoReturn

from django.conf import settings
from django.contrib.auth.models import User
from django.db.models import Count, Exists, OuterRef, Q, QuerySet, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from chatsite.catalog import CATALOG
from chatsite.errors import ServiceError
from inference.models import ModelPool

from . import quota
from .defaults import FREE_PLAN
from .errors import ErrorCode
from .models import Plan, PlanPool, PoolPrice, Statement, Subscription, UsageEvent


def default_plan() -> Plan:
    """The plan of every user without a subscription.

    A data migration creates it; should the row be gone (a database emptied by hand or by a
    test), it is put back from `billing.defaults.FREE_PLAN` rather than refusing everyone.
    """
    plan = Plan.objects.prefetch_related("plan_pools").filter(is_default=True).first()
    if plan is None:
        plan, _ = Plan.objects.get_or_create(slug=FREE_PLAN["slug"], defaults=FREE_PLAN)
    return plan


_PLAN_CACHE = "_billing_plan"


def plan_for_user(*, user: User) -> Plan:
    """The user's plan: their subscription's, or the default plan.

    Kept on the user object once read: a request asks several times (the plan check, the
    reservation, the headers) and all of them must see the same plan.
    """
    cached: Plan | None = getattr(user, _PLAN_CACHE, None)
    if cached is not None:
        return cached
    plan = plan_of(user_id=user.pk)
    setattr(user, _PLAN_CACHE, plan)
    return plan


def plan_of(*, user_id: Any) -> Plan:
    """The plan of the user `user_id`, from the process's catalog (`chatsite.catalog`: a
    subscription, plan or plan pool saved anywhere makes every process read it again).
    Shared by every request of the process: read-only."""
    return CATALOG.get(("plan-of-user", user_id), lambda: _load_plan(user_id))


def _load_plan(user_id: Any) -> Plan:
    # One statement for both cases (and one for the plan's pools): the subscription's plan
    # if there is one, else the default.
    subscribed = Subscription.objects.filter(user_id=user_id, plan=OuterRef("pk"))
    return (
        Plan.objects.prefetch_related("plan_pools")
        .annotate(subscribed=Exists(subscribed))
        .filter(Q(subscribed=True) | Q(is_default=True))
        .order_by("-subscribed", "pk")
        .first()
    ) or default_plan()


def pool_price(*, pool_id: Any) -> PoolPrice | None:
    """What the pool's tokens cost (None: nothing), from the process's catalog."""
    return CATALOG.get(
        ("pool-price", pool_id), lambda: PoolPrice.objects.filter(pool_id=pool_id).first()
    )


def plan_forget(*, user: User) -> None:
    """Drop the plan kept on `user` (after it changed)."""
    user.__dict__.pop(_PLAN_CACHE, None)


def user_tier(*, user: User) -> str:
    """The priority tier of the user's plan."""
    return plan_for_user(user=user).tier


def plan_pool(*, plan: Plan, pool: ModelPool) -> PlanPool | None:
    """The plan's entry for `pool`, or None when the plan lists no pools (every pool of its
    tier). Raises 403 `model_not_in_plan` when the plan may not use the pool."""
    if plan.tier not in pool.tiers:
        _not_in_plan(pool)
    entries = list(plan.plan_pools.all())
    if not entries:
        return None
    for entry in entries:
        if entry.pool_id == pool.pk:
            return entry
    _not_in_plan(pool)


def _not_in_plan(pool: ModelPool) -> NoReturn:
    raise ServiceError(
        ErrorCode.MODEL_NOT_IN_PLAN, f"Your plan does not include {pool.name!r}.", status=403
    )


def pools_for_plan(*, plan: Plan) -> list[ModelPool]:
    """The active pools the plan may use, for a model picker."""
    listed = {entry.pool_id for entry in plan.plan_pools.all()}
    return [
        pool
        for pool in ModelPool.objects.filter(is_active=True)
        if plan.tier in pool.tiers and (not listed or pool.pk in listed)
    ]


def pool_limits(*, plan: Plan, pool: ModelPool) -> quota.Limits:
    """The limits that apply to the plan's users on `pool` (403 if the plan lacks it)."""
    entry = plan_pool(plan=plan, pool=pool)
    cap = plan.message_cap
    window = plan.message_cap_window_seconds
    if entry is not None:
        cap = entry.message_cap if entry.message_cap is not None else cap
        window = entry.message_cap_window_seconds or window
    return quota.Limits(
        requests_per_minute=plan.requests_per_minute,
        tokens_per_minute=plan.tokens_per_minute,
        max_concurrent=plan.max_concurrent,
        message_cap=cap,
        message_cap_window_ms=window * 1000,
    )


@dataclass(frozen=True)
class RateLimitState:
    """The request and token buckets of a user, as the `x-ratelimit-*` headers show them."""

    requests: quota.BucketState
    tokens: quota.BucketState


def rate_limit_state(*, user: User, now: int | None = None) -> RateLimitState:
    plan = plan_for_user(user=user)
    requests, tokens = quota.peek(
        user_id=user.pk,
        requests_per_minute=plan.requests_per_minute,
        tokens_per_minute=plan.tokens_per_minute,
        now=quota.now_ms() if now is None else now,
    )
    return RateLimitState(requests=requests, tokens=tokens)


def format_reset(milliseconds: int) -> str:
    """A duration as OpenAI's headers write it: `0s`, `120ms`, `1.5s`, `6m0s`, `2h5m0s`."""
    if milliseconds <= 0:
        return "0s"
    if milliseconds < 1000:
        return f"{milliseconds}ms"
    seconds, millis = divmod(milliseconds, 1000)
    if seconds < 60:
        return f"{seconds}.{millis // 100}s" if millis >= 100 else f"{seconds}s"
    minutes, seconds = divmod(seconds + (1 if millis else 0), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes}m{seconds}s" if hours else f"{minutes}m{seconds}s"


def rate_limit_headers(*, user: User, now: int | None = None) -> dict[str, str]:
    """The six `x-ratelimit-*` headers for `user`."""
    state = rate_limit_state(user=user, now=now)
    headers = {}
    for name, bucket in (("requests", state.requests), ("tokens", state.tokens)):
        headers[f"x-ratelimit-limit-{name}"] = str(bucket.limit)
        headers[f"x-ratelimit-remaining-{name}"] = str(bucket.remaining)
        headers[f"x-ratelimit-reset-{name}"] = format_reset(bucket.reset_ms)
    return headers


def month_start(moment: datetime | date) -> date:
    return date(moment.year, moment.month, 1)


def next_month(day: date) -> date:
    return date(day.year + day.month // 12, day.month % 12 + 1, 1)


def period_bounds(period_start: date) -> tuple[datetime, datetime]:
    """The UTC instants a statement month covers, [start, end)."""
    start = datetime(period_start.year, period_start.month, 1, tzinfo=UTC)
    end_day = next_month(period_start)
    return start, datetime(end_day.year, end_day.month, 1, tzinfo=UTC)


@dataclass(frozen=True)
class PoolUsage:
    pool_id: int
    pool_name: str
    generations: int
    prompt_tokens: int
    output_tokens: int
    cost_micros: int


def usage_by_pool(*, user: User, start: datetime, end: datetime) -> list[PoolUsage]:
    """The user's ledger in [start, end), one row per pool."""
    rows = (
        UsageEvent.objects.filter(user=user, occurred_at__gte=start, occurred_at__lt=end)
        .values("pool_id", "pool__name")
        .annotate(
            generations=Count("id"),
            prompt=Sum("prompt_tokens"),
            output=Sum("output_tokens"),
            cost=Sum("cost_micros"),
        )
        .order_by("pool__name")
    )
    return [
        PoolUsage(
            pool_id=row["pool_id"],
            pool_name=row["pool__name"],
            generations=row["generations"],
            prompt_tokens=row["prompt"] or 0,
            output_tokens=row["output"] or 0,
            cost_micros=row["cost"] or 0,
        )
        for row in rows
    ]


@dataclass(frozen=True)
class CapState:
    pool_name: str
    limit: int | None
    window_seconds: int
    used: int
    remaining: int | None
    resets_at: datetime | None


@dataclass(frozen=True)
class UsageOverview:
    """The usage page: this period's usage and cost, and what is left of each limit."""

    plan: Plan
    period_start: date
    period_end: date
    pools: list[PoolUsage]
    prompt_tokens: int
    output_tokens: int
    usage_cost_micros: int
    caps: list[CapState]
    requests: quota.BucketState
    tokens: quota.BucketState
    concurrent_in_use: int
    currency: str

    @property
    def concurrent_remaining(self) -> int:
        return max(0, self.plan.max_concurrent - self.concurrent_in_use)

    @property
    def requests_reset_at(self) -> datetime:
        return _at(self.requests.reset_ms)

    @property
    def tokens_reset_at(self) -> datetime:
        return _at(self.tokens.reset_ms)


def _at(milliseconds_from_now: int) -> datetime:
    return timezone.now() + timedelta(milliseconds=milliseconds_from_now)


def usage_overview(*, user: User) -> UsageOverview:
    """What the usage page and `GET /api/v1/billing/usage` show."""
    plan = plan_for_user(user=user)
    # One clock for every figure of the page: the quota's (buckets, caps and slots read it).
    now_ms = quota.now_ms()
    now = datetime.fromtimestamp(now_ms / 1000, tz=UTC)
    period_start = month_start(now)
    start, end = period_bounds(period_start)
    pools = usage_by_pool(user=user, start=start, end=end)
    caps = []
    for pool in pools_for_plan(plan=plan):
        limits = pool_limits(plan=plan, pool=pool)
        window = quota.cap_window(
            user_id=user.pk, pool_id=pool.pk, window_ms=limits.message_cap_window_ms, now=now_ms
        )
        used = len(window)
        resets_at = None
        if limits.message_cap is not None and used:
            # The cap has room again when the oldest counted message leaves the window.
            oldest = sorted(window.values())[max(0, used - limits.message_cap)]
            resets_at = datetime.fromtimestamp(
                (oldest + limits.message_cap_window_ms) / 1000, tz=UTC
            )
        caps.append(
            CapState(
                pool_name=pool.name,
                limit=limits.message_cap,
                window_seconds=limits.message_cap_window_ms // 1000,
                used=used,
                remaining=None if limits.message_cap is None else max(0, limits.message_cap - used),
                resets_at=resets_at,
            )
        )
    requests, tokens = quota.peek(
        user_id=user.pk,
        requests_per_minute=plan.requests_per_minute,
        tokens_per_minute=plan.tokens_per_minute,
        now=now_ms,
    )
    return UsageOverview(
        plan=plan,
        period_start=period_start,
        period_end=next_month(period_start),
        pools=pools,
        prompt_tokens=sum(p.prompt_tokens for p in pools),
        output_tokens=sum(p.output_tokens for p in pools),
        usage_cost_micros=sum(p.cost_micros for p in pools),
        caps=caps,
        requests=requests,
        tokens=tokens,
        concurrent_in_use=quota.concurrency_in_use(user_id=user.pk, now=now_ms),
        currency=settings.BILLING_CURRENCY,
    )


def statements_for_user(*, user: User) -> QuerySet[Statement]:
    return (
        Statement.objects.filter(user=user)
        .select_related("invoice")
        .prefetch_related("lines__pool")
        .order_by("-period_start")
    )


def usage_per_pool_per_day(*, start: datetime, end: datetime) -> list[Mapping[str, Any]]:
    """Staff report: tokens and cost per pool per day (UTC) in [start, end)."""
    rows: Iterable[Mapping[str, Any]] = (
        UsageEvent.objects.filter(occurred_at__gte=start, occurred_at__lt=end)
        .annotate(day=TruncDate("occurred_at", tzinfo=UTC))
        .values("day", "pool__name")
        .annotate(
            generations=Count("id"),
            prompt_tokens=Sum("prompt_tokens"),
            output_tokens=Sum("output_tokens"),
            cost_micros=Sum("cost_micros"),
        )
        .order_by("-day", "pool__name")
    )
    return list(rows)


def top_users(*, start: datetime, end: datetime, limit: int = 20) -> list[Mapping[str, Any]]:
    """Staff report: the users who cost most in [start, end)."""
    rows: Iterable[Mapping[str, Any]] = (
        UsageEvent.objects.filter(occurred_at__gte=start, occurred_at__lt=end)
        .values("user_id", "user__username")
        .annotate(
            generations=Count("id"),
            prompt_tokens=Sum("prompt_tokens"),
            output_tokens=Sum("output_tokens"),
            cost_micros=Sum("cost_micros"),
        )
        .order_by("-cost_micros", "-output_tokens", "user_id")[:limit]
    )
    return list(rows)
