"""Writes of billing: reservations, the usage ledger, reconciliation, statements, invoices,
idempotency keys and subscriptions happen only here.

A generation's life in billing: `reservation_create` (inside the transaction that creates
it) takes a request, its estimated prompt plus max output tokens, a message of the pool's cap
and a concurrency slot, all at once or not at all; `generation_settle` (once it is final)
writes its usage event and gives back what the reservation held beyond the real usage. The
reconciler (`usage_reconcile`, a Celery beat task) repairs whatever a crash left between.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from dataclasses import dataclass, fields
from datetime import date, datetime, timedelta
from typing import Any, cast

from django.conf import settings
from django.contrib.auth.models import User
from django.db.models import Exists, Max, OuterRef, Q
from django.utils import timezone
from django.utils.module_loading import import_string

from chatsite.errors import ServiceError
from chatsite.vanishing import unless_vanished
from inference.models import Generation, ModelPool
from inference.selectors import generation_in_flight
from inference.unkept import UnkeptGeneration

from . import quota
from .errors import ErrorCode
from .ledger import (
    charged,
    consumed_nothing,
    ledger_flush,
    settle_used,
    usage_event,
    usage_owe,
)
from .models import (
    Invoice,
    Plan,
    PlanPool,
    Statement,
    StatementLine,
    Subscription,
    UsageEvent,
)
from .pricing import micros_to_minor
from .providers import PaymentProvider
from .selectors import (
    period_bounds,
    plan_for_user,
    plan_forget,
    plan_of,
    pool_limits,
    pool_price,
    usage_by_pool,
)

logger = logging.getLogger(__name__)

_REFUSAL_CODES = {
    quota.SCOPE_REQUESTS: ErrorCode.RATE_LIMITED_REQUESTS,
    quota.SCOPE_TOKENS: ErrorCode.RATE_LIMITED_TOKENS,
    quota.SCOPE_MESSAGES: ErrorCode.MESSAGE_CAP_REACHED,
    quota.SCOPE_CONCURRENCY: ErrorCode.TOO_MANY_CONCURRENT,
}


def subscription_set(*, user: User, plan: Plan) -> Subscription:
    """Put `user` on `plan` from now on (staff, or a checkout)."""
    subscription, created = Subscription.objects.get_or_create(user=user, defaults={"plan": plan})
    if not created and subscription.plan_id != plan.pk:
        subscription.plan = plan
        subscription.started_at = timezone.now()
        subscription.save(update_fields=["plan", "started_at", "updated_at"])
    plan_forget(user=user)
    return subscription


# Reservations


def _seconds(milliseconds: int) -> int:
    return max(1, -(-milliseconds // 1000))


def _duration(seconds: int) -> str:
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 5400:
        return f"{-(-seconds // 60)} min"
    hours, rest = divmod(seconds, 3600)
    return f"{hours} h {rest // 60} min" if rest >= 60 else f"{hours} h"


def _refusal(
    outcome: quota.Outcome, *, limits: quota.Limits, pool: ModelPool, tokens: int
) -> ServiceError:
    """The 429 a refused reservation answers: the scope that frees last names the code."""
    worst = max(outcome.refusals, key=lambda refusal: refusal.retry_ms)
    retry = _seconds(worst.retry_ms)
    wait = _duration(retry)
    if worst.scope == quota.SCOPE_MESSAGES:
        window = _duration(limits.message_cap_window_ms // 1000)
        message = (
            f"You have reached your plan's limit of {limits.message_cap} messages to "
            f"{pool.name} per {window}; you can send again in {wait}."
        )
        limit: int | None = limits.message_cap
    elif worst.scope == quota.SCOPE_CONCURRENCY:
        message = (
            f"Your plan allows {limits.max_concurrent} answers in progress at once; "
            "wait for one to finish."
        )
        limit = limits.max_concurrent
    elif worst.scope == quota.SCOPE_TOKENS:
        message = (
            f"This message needs {tokens} tokens of your {limits.tokens_per_minute} per minute; "
            f"try again in {wait}."
        )
        limit = limits.tokens_per_minute
    else:
        message = (
            f"Your plan allows {limits.requests_per_minute} requests per minute; "
            f"try again in {wait}."
        )
        limit = limits.requests_per_minute
    return ServiceError(
        _REFUSAL_CODES[worst.scope],
        message,
        status=429,
        detail={
            "scope": worst.scope,
            "limit": limit,
            "retry_after": retry,
            "refused": [
                {"scope": refusal.scope, "retry_after": _seconds(refusal.retry_ms)}
                for refusal in outcome.refusals
            ],
        },
    )


def reservation_create(
    *,
    generation: Generation | UnkeptGeneration,
    prompt_tokens: int,
    limits: quota.Limits,
    now: int | None = None,
) -> quota.Outcome:
    """Reserve what `generation` may consume against every scope of the user's plan, at once.

    `limits` are the plan's on the generation's pool (`selectors.pool_limits`, which judged
    that the plan may use it). Reserves `prompt_tokens` (the estimate) plus its max output
    tokens. Raises 413 `request_too_large` (more tokens than the plan allows in a minute), or
    429 with the refusing scope's code and `detail.retry_after` (seconds).
    """
    tokens = prompt_tokens + generation.max_tokens
    if tokens > limits.tokens_per_minute:
        raise ServiceError(
            ErrorCode.REQUEST_TOO_LARGE,
            f"This message needs {tokens} tokens; your plan allows "
            f"{limits.tokens_per_minute} per minute. Start a new conversation or shorten it.",
            status=413,
            detail={"limit": limits.tokens_per_minute, "requested": tokens},
        )
    outcome = quota.reserve(
        user_id=generation.user_id,
        pool_id=generation.pool_id,
        reservation_id=str(generation.id),
        prompt_tokens=prompt_tokens,
        tokens=tokens,
        limits=limits,
        now=quota.now_ms() if now is None else now,
    )
    if not outcome.admitted:
        raise _refusal(outcome, limits=limits, pool=generation.pool, tokens=tokens)
    return outcome


def reservation_release(
    *, user_id: int, reservation_id: str, pool_id: int | None = None, now: int | None = None
) -> bool:
    """Give back everything a reservation holds: its generation never came to be (the
    transaction rolled back, or the conversation was deleted). False if nothing was held."""
    held = quota.held(user_id=user_id, reservation_id=reservation_id)
    if held is None:
        quota.forget_open(user_id=user_id, reservation_id=reservation_id)
        return False
    user = User.objects.filter(pk=user_id).first()
    # A deleted user's bucket is never read again: any capacity will do.
    tokens_per_minute = plan_for_user(user=user).tokens_per_minute if user else held.tokens
    return (
        quota.settle(
            user_id=user_id,
            pool_id=pool_id or held.pool_id,
            reservation_id=reservation_id,
            tokens_per_minute=tokens_per_minute,
            charged_tokens=0,
            refund_message=True,
            now=quota.now_ms() if now is None else now,
        )
        is not None
    )


# The ledger


def usage_record(*, generation: Generation, now: int | None = None) -> bool:
    """Write the usage event of a final generation (once: its id is the dedup key) and settle
    its reservation with the real usage: unused tokens back, overruns charged, slot freed.

    False, writing nothing, if the user's account was deleted meanwhile (nobody is charged).
    """
    if not generation.is_final:
        raise ValueError("usage is recorded once a generation is final")
    held = quota.held(user_id=generation.user_id, reservation_id=str(generation.id))
    prompt, output = charged(generation, held)
    price = pool_price(pool_id=generation.served_pool_id or generation.pool_id)
    plan = plan_of(user_id=generation.user_id)
    # Recorded, or already there: INSERT ... ON CONFLICT DO NOTHING (in a transaction of its
    # own, three statements), where a read and then an insert in its own transaction took
    # four on every answer. Nothing, if the user's account was deleted since the answer.
    with unless_vanished(
        UsageEvent,
        still_there=lambda: User.objects.filter(pk=generation.user_id).exists(),
        what=f"usage of generation {generation.id}",
    ) as write:
        UsageEvent.objects.bulk_create(
            [
                usage_event(
                    generation_id=generation.id,
                    user_id=generation.user_id,
                    pool_id=generation.pool_id,
                    price=price,
                    plan=plan,
                    tier=generation.tier,
                    status=generation.status,
                    prompt_tokens=prompt,
                    output_tokens=output,
                    cached_tokens=generation.cached_tokens or 0,
                    occurred_at=generation.finished_at or timezone.now(),
                )
            ],
            ignore_conflicts=True,
        )
    if write.vanished:
        return False
    if held is not None:
        settle_used(
            generation, used=prompt + output, tokens_per_minute=plan.tokens_per_minute, now=now
        )
    return True


def generation_settle(*, generation: Generation | UnkeptGeneration, batched: bool = False) -> None:
    """`usage_record` for the inference plane's finish hook (`usage_owe` for an answer
    without a row, or `batched` when a flush follows: its event is written by the next
    `ledger_flush`): the answer is already final, so a failure here is logged, not raised;
    the reconciler records it on its next run."""
    try:
        if batched or isinstance(generation, UnkeptGeneration):
            usage_owe(generation=generation)
        else:
            usage_record(generation=generation)
    except Exception:
        logger.exception("could not record the usage of generation %s", generation.id)


@dataclass
class ReconcileReport:
    """What one reconciliation repaired."""

    events_flushed: int = 0
    events_recorded: int = 0
    reservations_settled: int = 0
    reservations_released: int = 0
    slots_kept: int = 0
    cap_entries_added: int = 0
    cap_entries_removed: int = 0

    def as_dict(self) -> dict[str, int]:
        return {field.name: getattr(self, field.name) for field in fields(self)}


def usage_reconcile(*, now: datetime | None = None) -> ReconcileReport:
    """Make the ledger and the Redis counters agree with the generations, and repair drift.

    1. The ledger's outbox is written (answers without a row whose replica died before it
       flushed them), and final generations without a usage event (a process died after the
       answer) get one.
    2. Reservations still open after the grace period: settled if their generation is final,
       released if it never came to be (or, without a row, is no longer in flight), and
       their slot kept while it is still in flight.
    3. Each message-cap window holds exactly the messages that count in it: missing ones are
       put back (Redis lost them), stray ones taken out.
    """
    now = now or timezone.now()
    now_ms = int(now.timestamp() * 1000)
    grace = timedelta(seconds=settings.BILLING_RECONCILE_GRACE_SECONDS)
    report = ReconcileReport()
    report.events_flushed = ledger_flush()

    unrecorded = (
        Generation.objects.filter(
            status__in=Generation.FINAL_STATUSES,
            finished_at__lt=now - grace,
            finished_at__gte=now - timedelta(days=settings.BILLING_RECONCILE_LOOKBACK_DAYS),
        )
        .filter(~Exists(UsageEvent.objects.filter(generation_id=OuterRef("pk"))))
        .select_related("pool", "user")
    )
    for unrecorded_generation in unrecorded.iterator():
        if usage_record(generation=unrecorded_generation, now=now_ms):
            report.events_recorded += 1

    cutoff_ms = now_ms - int(grace.total_seconds() * 1000)
    for user_id, reservation_id in quota.open_reservations(before=cutoff_ms):
        generation = _generation_or_none(reservation_id)
        if generation is None and generation_in_flight(generation_id=reservation_id):
            # An answer without a row, still running.
            if quota.slot_extend(user_id=user_id, reservation_id=reservation_id, now=now_ms):
                report.slots_kept += 1
        elif generation is None:
            if reservation_release(user_id=user_id, reservation_id=reservation_id, now=now_ms):
                report.reservations_released += 1
        elif generation.is_final:
            if usage_record(generation=generation, now=now_ms):
                report.reservations_settled += 1
        elif quota.slot_extend(user_id=user_id, reservation_id=reservation_id, now=now_ms):
            report.slots_kept += 1

    added, removed = _caps_repair(now=now, grace=grace)
    report.cap_entries_added, report.cap_entries_removed = added, removed
    return report


def _generation_or_none(reservation_id: str) -> Generation | None:
    try:
        generation_id = uuid.UUID(reservation_id)
    except ValueError:
        return None
    return Generation.objects.select_related("pool", "user").filter(pk=generation_id).first()


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _caps_repair(*, now: datetime, grace: timedelta) -> tuple[int, int]:
    longest = max(
        Plan.objects.aggregate(longest=Max("message_cap_window_seconds"))["longest"] or 0,
        PlanPool.objects.aggregate(longest=Max("message_cap_window_seconds"))["longest"] or 0,
    )
    if not longest:
        return 0, 0
    since = now - timedelta(seconds=longest)
    # Every message that counts: generations in the window, and the ledger's, which outlive
    # their generation when a conversation is deleted (deleting must not give a cap back).
    counted: dict[tuple[int, int], dict[str, int]] = {}
    generations = Generation.objects.filter(enqueued_at__gte=since).values_list(
        "id", "user_id", "pool_id", "enqueued_at", "status", "prompt_tokens", "output_tokens"
    )
    for gid, user_id, pool_id, enqueued_at, status, prompt, output in generations:
        final = status in Generation.FINAL_STATUSES
        if not (final and consumed_nothing(status, (prompt or 0) + (output or 0))):
            counted.setdefault((user_id, pool_id), {})[str(gid)] = _ms(enqueued_at)
    events = UsageEvent.objects.filter(occurred_at__gte=since).values_list(
        "generation_id",
        "user_id",
        "pool_id",
        "occurred_at",
        "status",
        "prompt_tokens",
        "output_tokens",
    )
    for gid, user_id, pool_id, occurred_at, status, prompt, output in events:
        if not consumed_nothing(status, prompt + output):
            counted.setdefault((user_id, pool_id), {}).setdefault(str(gid), _ms(occurred_at))

    now_ms = _ms(now)
    stray_before = now_ms - int(grace.total_seconds() * 1000)
    plans: dict[int, Plan | None] = {}
    pools = {pool.pk: pool for pool in ModelPool.objects.all()}
    added = removed = 0
    for (user_id, pool_id), expected in counted.items():
        if user_id not in plans:
            user = User.objects.filter(pk=user_id).first()
            plans[user_id] = plan_for_user(user=user) if user else None
        plan = plans[user_id]
        if plan is None:
            continue
        try:
            limits = pool_limits(plan=plan, pool=pools[pool_id])
        except ServiceError:
            continue
        if limits.message_cap is None:
            continue
        window_start = now_ms - limits.message_cap_window_ms
        in_window = {gid: at for gid, at in expected.items() if at >= window_start}
        actual = quota.cap_window(
            user_id=user_id, pool_id=pool_id, window_ms=limits.message_cap_window_ms, now=now_ms
        )
        missing = {gid: at for gid, at in in_window.items() if gid not in actual}
        stray = [
            gid
            for gid, at in actual.items()
            if gid not in expected
            and at < stray_before
            # An answer without a row counts from its ledger event, once it has ended.
            and not generation_in_flight(generation_id=gid)
        ]
        if missing or stray:
            quota.cap_repair(
                user_id=user_id,
                pool_id=pool_id,
                window_ms=limits.message_cap_window_ms,
                add=missing,
                remove=stray,
            )
            added += len(missing)
            removed += len(stray)
    return added, removed


# Statements and invoices


def statement_close(*, user: User, period_start: date) -> Statement:
    """The user's statement of the month starting `period_start`, made once from the ledger.

    The plan fee is that of the plan the user is on when the month is closed (no proration).
    Closing again returns the statement already made. Raises 404 `account_deleted` if the
    account is deleted meanwhile (nothing is written).
    """
    statement = _statement_close(user=user, period_start=period_start)
    if statement is None:
        raise _account_deleted()
    return statement


def _statement_close(*, user: User, period_start: date) -> Statement | None:
    existing = Statement.objects.filter(user=user, period_start=period_start).first()
    if existing is not None:
        return existing
    start, end = period_bounds(period_start)
    plan = plan_for_user(user=user)
    pools = usage_by_pool(user=user, start=start, end=end)
    usage_cost = sum(line.cost_micros for line in pools)
    with unless_vanished(
        Statement,
        StatementLine,
        still_there=lambda: User.objects.filter(pk=user.pk).exists(),
        what=f"statement of user {user.pk} for {period_start}",
    ) as write:
        statement, created = Statement.objects.get_or_create(
            user=user,
            period_start=period_start,
            defaults={
                "period_end": end.date(),
                "plan": plan,
                "plan_name": plan.name,
                "plan_fee_micros": plan.monthly_price_micros,
                "usage_cost_micros": usage_cost,
                "total_micros": usage_cost + plan.monthly_price_micros,
                "generations": sum(line.generations for line in pools),
                "prompt_tokens": sum(line.prompt_tokens for line in pools),
                "output_tokens": sum(line.output_tokens for line in pools),
            },
        )
        if created:
            StatementLine.objects.bulk_create(
                StatementLine(
                    statement=statement,
                    pool_id=line.pool_id,
                    generations=line.generations,
                    prompt_tokens=line.prompt_tokens,
                    output_tokens=line.output_tokens,
                    cost_micros=line.cost_micros,
                )
                for line in pools
            )
    return None if write.vanished else statement


def statements_close(*, period_start: date) -> list[Statement]:
    """Close the month for every user with usage in it or a plan with a fee (but those whose
    account is deleted meanwhile)."""
    start, end = period_bounds(period_start)
    users = (
        User.objects.filter(
            Q(usage_events__occurred_at__gte=start, usage_events__occurred_at__lt=end)
            | Q(subscription__plan__monthly_price_micros__gt=0)
        )
        .exclude(statements__period_start=period_start)
        .distinct()
    )
    closed = (_statement_close(user=user, period_start=period_start) for user in users.iterator())
    return [statement for statement in closed if statement is not None]


def payment_provider() -> PaymentProvider:
    """The provider named by `settings.BILLING_PAYMENT_PROVIDER` (a dotted path)."""
    provider_class = import_string(settings.BILLING_PAYMENT_PROVIDER)
    return cast(PaymentProvider, provider_class())


def invoice_issue(*, statement: Statement) -> Invoice:
    """Invoice a statement (once) and hand it to the payment provider.

    Raises 404 `account_deleted` if the statement goes with its account meanwhile (nothing is
    written, nothing is sent to the provider).
    """
    invoice = _invoice_issue(statement=statement)
    if invoice is None:
        raise _account_deleted()
    return invoice


def _invoice_issue(*, statement: Statement) -> Invoice | None:
    amount = micros_to_minor(statement.total_micros, minor_digits=settings.BILLING_MINOR_DIGITS)
    if amount == 0:
        raise ServiceError(ErrorCode.NOTHING_TO_INVOICE, "This statement has nothing to pay.")
    with unless_vanished(
        Invoice,
        still_there=lambda: Statement.objects.filter(pk=statement.pk).exists(),
        what=f"invoice of statement {statement.pk}",
    ) as write:
        invoice, created = Invoice.objects.get_or_create(
            statement=statement,
            defaults={
                "amount_minor": amount,
                "currency": settings.BILLING_CURRENCY,
                "provider": settings.BILLING_PAYMENT_PROVIDER,
            },
        )
    if write.vanished:
        return None
    if created or not invoice.provider_reference:
        # Outside any transaction of ours: a provider may be a remote service.
        invoice.provider_reference = payment_provider().invoice_issue(invoice=invoice)
        invoice.save(update_fields=["provider_reference"])
    return invoice


def invoices_issue(*, period_start: date) -> list[Invoice]:
    """Invoice every statement of the month that has something to pay and no invoice yet
    (but those whose account is deleted meanwhile)."""
    half_minor = 10 ** (6 - settings.BILLING_MINOR_DIGITS) // 2
    due = Statement.objects.filter(
        period_start=period_start, invoice__isnull=True, total_micros__gte=half_minor
    )
    issued = (_invoice_issue(statement=statement) for statement in due.iterator())
    return [invoice for invoice in issued if invoice is not None]


def _account_deleted() -> ServiceError:
    return ServiceError(ErrorCode.ACCOUNT_DELETED, "The account was deleted meanwhile.", status=404)


def invoice_mark_paid(*, invoice: Invoice, by: User) -> Invoice:
    """Record a payment received outside the service (the offline provider's staff action)."""
    if not payment_provider().accepts_manual_payments:
        raise ServiceError(
            ErrorCode.MANUAL_PAYMENT_UNSUPPORTED,
            "The payment provider records payments itself.",
            status=409,
        )
    now = timezone.now()
    changed = Invoice.objects.filter(pk=invoice.pk, status=Invoice.Status.OPEN).update(
        status=Invoice.Status.PAID, paid_at=now, paid_by=by
    )
    if not changed:
        raise ServiceError(ErrorCode.INVOICE_NOT_OPEN, "This invoice is not open.", status=409)
    invoice.refresh_from_db()
    return invoice


# Idempotency keys


def idempotency_fingerprint(request: dict[str, Any]) -> str:
    """A digest of what a request asks for: the same key must come with the same request."""
    return hashlib.sha256(json.dumps(request, sort_keys=True, default=str).encode()).hexdigest()


def _idempotency_slot(user: User, key: str) -> str:
    if not key or len(key) > 255 or not key.isascii() or not key.isprintable():
        raise ServiceError(
            ErrorCode.INVALID_IDEMPOTENCY_KEY,
            "An Idempotency-Key is 1 to 255 printable ASCII characters.",
        )
    return quota.idempotency_key(user.pk, hashlib.sha256(key.encode()).hexdigest())


def _pending(fingerprint: str) -> str:
    return json.dumps({"fingerprint": fingerprint, "state": "pending"})


def idempotency_claim(*, user: User, key: str, fingerprint: str) -> dict[str, Any] | None:
    """Take `key` for a request, or find what it already produced.

    None: the key is now held by the caller, which must `idempotency_complete` or
    `idempotency_release` it. A dict: the result stored by the first request, to replay.
    Raises 422 `idempotency_key_reused` for the same key with another request, and 409
    `idempotency_key_in_use` while the first request with this key is still running.
    """
    slot = _idempotency_slot(user, key)
    previous = quota.client().set(
        slot,
        _pending(fingerprint),
        nx=True,
        get=True,
        px=settings.BILLING_IDEMPOTENCY_PENDING_SECONDS * 1000,
    )
    if previous is None:
        return None
    stored = json.loads(cast(str, previous))
    if stored["fingerprint"] != fingerprint:
        raise ServiceError(
            ErrorCode.IDEMPOTENCY_KEY_REUSED,
            "This Idempotency-Key was used for a different request.",
            status=422,
        )
    if stored["state"] != "done":
        raise ServiceError(
            ErrorCode.IDEMPOTENCY_KEY_IN_USE,
            "A request with this Idempotency-Key is still being processed.",
            status=409,
            detail={"retry_after": 1},
        )
    return cast(dict[str, Any], stored["result"])


def idempotency_complete(*, user: User, key: str, fingerprint: str, result: dict[str, Any]) -> None:
    """Store what the request produced under its key, for a day of retries."""
    value = json.dumps({"fingerprint": fingerprint, "state": "done", "result": result})
    quota.client().set(
        _idempotency_slot(user, key), value, px=settings.BILLING_IDEMPOTENCY_TTL_SECONDS * 1000
    )


def idempotency_release(*, user: User, key: str, fingerprint: str) -> None:
    """Let the key go after the request failed, so that a retry runs it again."""
    quota.script(quota.DELETE_IF_EQUAL)(
        keys=[_idempotency_slot(user, key)], args=[_pending(fingerprint)]
    )
