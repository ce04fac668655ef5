"""Writes of moderation: checks that refuse content, flags, staff actions on them, sanctions,
the strikes policy, and the thresholds and rules staff edit. Every staff (and automatic)
action writes an `AuditEntry`.

The input check runs in `conversations.turns` before anything is written or reserved: a
refused message costs nothing and never reaches a worker, but its flag is committed on its
own, so it survives the refusal.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from chatsite.errors import NotFound, ServiceError
from inference.models import Generation

from . import engine, metrics, selectors
from .categories import label
from .engine import Verdict
from .errors import ErrorCode
from .models import AuditEntry, CategoryThreshold, Flag, Rule, Sanction

logger = logging.getLogger(__name__)

EXCERPT_MAX_CHARS = 8000


def moderation_ensure_can_send(*, user: User) -> None:
    """Refuse a suspended or banned account (403), saying until when."""
    sanction = selectors.sanction_blocking(user_id=user.pk)
    if sanction is None:
        return
    if sanction.kind == Sanction.Kind.BAN:
        raise ServiceError(
            ErrorCode.ACCOUNT_BANNED,
            "This account is banned from sending messages.",
            status=403,
            detail={"until": None, "reason": sanction.reason},
        )
    until = sanction.ends_at
    raise ServiceError(
        ErrorCode.ACCOUNT_SUSPENDED,
        f"This account is suspended until {until:%Y-%m-%d %H:%M} UTC." if until else "",
        status=403,
        detail={"until": until.isoformat() if until else None, "reason": sanction.reason},
    )


def moderation_check_input(
    *, user: User, conversation: Any, content: str, parts: Sequence[str] = ()
) -> Verdict | None:
    """Check a user's new text. Blocked: a flag is recorded and `content_blocked` raised with
    the categories. Returns the verdict (it may ask for review) or None when input checks
    are off.

    `parts`, when given, are what `content` is made of (a `/v1` request's system prompt and
    messages): each is checked on its own (`engine.evaluate_parts`), and the flag of a
    blocked text quotes the part that decided (`Verdict.part`)."""
    if not settings.MODERATION_INPUT_ENABLED:
        return None
    if parts:
        verdict = engine.evaluate_parts(parts, engine.policy())
        content = parts[verdict.part]
    else:
        verdict = engine.evaluate(content, engine.policy())
    metrics.verdict_taken(metrics.INPUT, verdict)
    if verdict.is_blocked:
        flag_record(
            user=user,
            conversation=conversation,
            message=None,
            direction=Flag.Direction.INPUT,
            excerpt=content,
            verdict=verdict,
            action=Flag.Action.BLOCKED,
        )
        raise ServiceError(
            ErrorCode.CONTENT_BLOCKED,
            "This message was not sent: it breaks the content policy ("
            + ", ".join(label(category) for category in verdict.blocked)
            + ").",
            detail={
                "categories": verdict.blocked,
                "labels": [label(category) for category in verdict.blocked],
            },
        )
    if verdict.unavailable:
        raise ServiceError(
            ErrorCode.MODERATION_UNAVAILABLE,
            "Messages cannot be checked right now; please try again shortly.",
            status=503,
            detail={"failed": verdict.failed},
        )
    return verdict


def flag_record(
    *,
    user: User | Any,
    conversation: Any,
    message: Any,
    direction: str,
    excerpt: str,
    verdict: Verdict,
    action: str,
) -> Flag:
    """Record what a check found, for the review queue."""
    user_id: Any = user.pk if hasattr(user, "pk") else user
    return Flag.objects.create(
        user_id=user_id,
        conversation_id=getattr(conversation, "pk", conversation),
        message_id=getattr(message, "pk", message),
        direction=direction,
        excerpt=excerpt[:EXCERPT_MAX_CHARS],
        categories=verdict.categories,
        scores=verdict.scores,
        backend=verdict.backend_label() or "none",
        action=action,
    )


def output_flag_record(
    *, generation_id: Any, user_id: int, excerpt: str, verdict: Verdict, retracted: bool
) -> Flag:
    """Record a streamed answer's flag against its message (the scheduler calls this); the
    answer of a `/v1` key that keeps nothing has none, and is flagged against its user."""
    where = (
        Generation.objects.filter(pk=generation_id).values("conversation_id", "message_id").first()
    ) or {"conversation_id": None, "message_id": None}
    return flag_record(
        user=user_id,
        conversation=where["conversation_id"],
        message=where["message_id"],
        direction=Flag.Direction.OUTPUT,
        excerpt=excerpt,
        verdict=verdict,
        action=Flag.Action.RETRACTED if retracted else Flag.Action.REVIEW,
    )


def _audit(
    *,
    actor: User | None,
    action: str,
    target_user: Any = None,
    flag: Flag | None = None,
    sanction: Sanction | None = None,
    detail: dict[str, Any] | None = None,
) -> AuditEntry:
    return AuditEntry.objects.create(
        actor=actor,
        action=action,
        target_user_id=getattr(target_user, "pk", target_user),
        flag=flag,
        sanction=sanction,
        detail=detail or {},
    )


def _review(flag: Flag, *, reviewer: User, status: str) -> Flag:
    flag.status = status
    flag.reviewer = reviewer
    flag.reviewed_at = timezone.now()
    flag.save(update_fields=["status", "reviewer", "reviewed_at"])
    return flag


def flag_dismiss(*, flag: Flag, reviewer: User) -> Flag:
    """Staff found nothing wrong: the flag counts toward no strike."""
    with transaction.atomic():
        _review(flag, reviewer=reviewer, status=Flag.Status.DISMISSED)
        _audit(
            actor=reviewer,
            action=AuditEntry.Action.FLAG_DISMISSED,
            target_user=flag.user_id,
            flag=flag,
        )
    return flag


def flag_confirm(*, flag: Flag, reviewer: User) -> Flag:
    """Staff agree the content broke the policy: a strike, which may suspend the account."""
    with transaction.atomic():
        _review(flag, reviewer=reviewer, status=Flag.Status.CONFIRMED)
        _audit(
            actor=reviewer,
            action=AuditEntry.Action.FLAG_CONFIRMED,
            target_user=flag.user_id,
            flag=flag,
        )
        strikes_apply(user_id=flag.user_id)
    return flag


def user_warn(*, flag: Flag, by: User, reason: str = "") -> Sanction:
    """Confirm the flag and warn its author (a warning refuses nothing)."""
    with transaction.atomic():
        # A warning is the confirmed flag's only outcome: it counts as a strike.
        flag_confirm(flag=flag, reviewer=by)
        return _sanction_impose(
            user_id=flag.user_id,
            kind=Sanction.Kind.WARNING,
            action=AuditEntry.Action.USER_WARNED,
            by=by,
            flag=flag,
            reason=reason,
        )


def warning_acknowledge(*, user: Any, sanction_id: int) -> Sanction:
    """The user has read a warning on their account: stop showing it. Another user's
    warning, or one already acknowledged, is NotFound."""
    updated = Sanction.objects.filter(
        pk=sanction_id, user=user, kind=Sanction.Kind.WARNING, seen_at__isnull=True
    ).update(seen_at=timezone.now())
    if not updated:
        raise NotFound("Warning not found.")
    return Sanction.objects.get(pk=sanction_id)


def _sanction_impose(
    *,
    user_id: Any,
    kind: str,
    action: str,
    by: User | None,
    flag: Flag | None,
    reason: str,
    ends_at: Any = None,
    detail: dict[str, Any] | None = None,
) -> Sanction:
    """Confirm `flag` if staff have not yet (no strike counted: the sanction is the outcome),
    then impose and audit the sanction. Runs inside the caller's transaction."""
    if flag is not None and by is not None and flag.status != Flag.Status.CONFIRMED:
        _review(flag, reviewer=by, status=Flag.Status.CONFIRMED)
        _audit(
            actor=by, action=AuditEntry.Action.FLAG_CONFIRMED, target_user=flag.user_id, flag=flag
        )
    sanction = Sanction.objects.create(
        user_id=user_id, kind=kind, reason=reason, flag=flag, created_by=by, ends_at=ends_at
    )
    _audit(
        actor=by,
        action=action,
        target_user=user_id,
        flag=flag,
        sanction=sanction,
        detail={**(detail or {}), "reason": reason},
    )
    return sanction


def user_suspend(
    *, user: Any, by: User | None, hours: int, flag: Flag | None = None, reason: str = ""
) -> Sanction:
    """Refuse every send of `user` for `hours` (`by` None: the system). With a flag, the
    flag is confirmed first."""
    if hours <= 0:
        raise ValueError("a suspension lasts at least an hour")
    ends_at = timezone.now() + timedelta(hours=hours)
    with transaction.atomic():
        return _sanction_impose(
            user_id=getattr(user, "pk", user),
            kind=Sanction.Kind.SUSPENSION,
            action=AuditEntry.Action.USER_SUSPENDED,
            by=by,
            flag=flag,
            reason=reason,
            ends_at=ends_at,
            detail={"hours": hours, "until": ends_at.isoformat()},
        )


def user_ban(*, user: Any, by: User, flag: Flag | None = None, reason: str = "") -> Sanction:
    """Refuse every send of `user` until staff lift the ban."""
    with transaction.atomic():
        return _sanction_impose(
            user_id=getattr(user, "pk", user),
            kind=Sanction.Kind.BAN,
            action=AuditEntry.Action.USER_BANNED,
            by=by,
            flag=flag,
            reason=reason,
        )


def sanction_lift(*, sanction: Sanction, by: User) -> Sanction:
    """End a suspension or ban now; the user may send again."""
    with transaction.atomic():
        locked = Sanction.objects.select_for_update().get(pk=sanction.pk)
        if locked.lifted_at is not None or locked.kind == Sanction.Kind.WARNING:
            raise ServiceError(ErrorCode.NOT_SUSPENDED, "There is nothing to lift.")
        locked.lifted_at = timezone.now()
        locked.lifted_by = by
        locked.save(update_fields=["lifted_at", "lifted_by"])
        _audit(
            actor=by,
            action=AuditEntry.Action.SANCTION_LIFTED,
            target_user=locked.user_id,
            sanction=locked,
            detail={"kind": locked.kind},
        )
    return locked


def strikes_apply(*, user_id: Any) -> Sanction | None:
    """Suspend `user_id` automatically once they have `MODERATION_STRIKES_COUNT` confirmed
    flags within the window, counting only flags confirmed since their last suspension or
    ban (a sanction wipes the slate). Audited as the system (no actor)."""
    now = timezone.now()
    since = now - timedelta(days=settings.MODERATION_STRIKES_WINDOW_DAYS)
    last = (
        Sanction.objects.filter(
            user_id=user_id, kind__in=[Sanction.Kind.SUSPENSION, Sanction.Kind.BAN]
        )
        .order_by("-created_at")
        .values_list("created_at", flat=True)
        .first()
    )
    if last is not None and last > since:
        since = last
    if selectors.sanction_in_force(user_id=user_id) is not None:
        return None
    strikes = Flag.objects.filter(
        user_id=user_id, status=Flag.Status.CONFIRMED, reviewed_at__gt=since
    ).count()
    if strikes < settings.MODERATION_STRIKES_COUNT:
        return None
    logger.info("user %s reached %d strikes; suspending", user_id, strikes)
    return user_suspend(
        user=user_id,
        by=None,
        hours=settings.MODERATION_STRIKES_SUSPEND_HOURS,
        reason=f"{strikes} confirmed flags within {settings.MODERATION_STRIKES_WINDOW_DAYS} days",
    )


def threshold_set(
    *, category: str, block_at: float | None, review_at: float | None, by: User
) -> CategoryThreshold:
    """Set a category's thresholds; every process sees them at its next check."""
    with transaction.atomic():
        row, _ = CategoryThreshold.objects.update_or_create(
            category=category,
            defaults={"block_at": block_at, "review_at": review_at, "updated_by": by},
        )
        _audit(
            actor=by,
            action=AuditEntry.Action.THRESHOLD_CHANGED,
            detail={"category": category, "block_at": block_at, "review_at": review_at},
        )
    return row


def rule_save(*, rule: Rule, by: User) -> Rule:
    """Create or change a staff rule; every process reloads the rules at its next check."""
    with transaction.atomic():
        rule.save()
        _audit(
            actor=by,
            action=AuditEntry.Action.RULE_CHANGED,
            detail={
                "rule": rule.pk,
                "category": rule.category,
                "kind": rule.kind,
                "pattern": rule.pattern,
                "score": rule.score,
                "is_active": rule.is_active,
            },
        )
    return rule


def rule_delete(*, rule: Rule, by: User) -> None:
    """Delete a staff rule."""
    with transaction.atomic():
        _audit(
            actor=by,
            action=AuditEntry.Action.RULE_DELETED,
            detail={"rule": rule.pk, "category": rule.category, "pattern": rule.pattern},
        )
        rule.delete()
