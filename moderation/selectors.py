"""Reads of moderation that services, the scheduler and admin share: thresholds and staff
rules (kept per process in the catalog, read again after any change to them), an account's
standing."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import Case, Q, Value, When
from django.utils import timezone

from chatsite.catalog import CATALOG

from .categories import CATEGORIES
from .models import CategoryThreshold, Rule, Sanction
from .rules import CompiledRule, compile_rule

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Threshold:
    """Scores at or above which a category blocks, and is queued for review (None: never)."""

    block: float | None
    review: float | None


def _default(category: str) -> Threshold:
    table: dict[str, dict[str, Any]] = settings.MODERATION_THRESHOLDS
    entry = table.get(category, table.get("default", {}))
    return Threshold(block=entry.get("block"), review=entry.get("review"))


def thresholds() -> dict[str, Threshold]:
    """Every category's thresholds: staff's rows over the settings' defaults. The rows are
    kept per process in the catalog (`chatsite.catalog`): a staff change is seen by every
    process at its next check."""
    rows = CATALOG.get(("moderation-thresholds",), _threshold_rows)
    table = {category: _default(category) for category in CATEGORIES}
    for category, (block, review) in rows.items():
        table[category] = Threshold(block=block, review=review)
    return table


def _threshold_rows() -> dict[str, tuple[float | None, float | None]]:
    return {row.category: (row.block_at, row.review_at) for row in CategoryThreshold.objects.all()}


def staff_rules() -> tuple[CompiledRule, ...]:
    """Staff's active rules, compiled: kept per process in the catalog, so the same tuple
    comes back until a rule changes anywhere (then every process reads them again)."""
    return CATALOG.get(("moderation-rules",), lambda: tuple(compiled_staff_rules()))


def compiled_staff_rules() -> list[CompiledRule]:
    """Staff's active rules, compiled; a rule whose expression does not compile is skipped
    (admin refuses such a rule, so this only guards against rows written elsewhere)."""
    compiled = []
    for rule in Rule.objects.filter(is_active=True):
        try:
            compiled.append(
                compile_rule(
                    category=rule.category,
                    kind=rule.kind,
                    pattern=rule.pattern,
                    score=rule.score,
                    source=f"rule:{rule.pk}",
                )
            )
        except re.error:
            logger.warning("moderation rule %s does not compile; skipped", rule.pk)
    return compiled


def active_sanctions(*, now: datetime | None = None) -> Q:
    """The filter of sanctions that refuse sends now: a ban, or a suspension not yet over,
    neither lifted."""
    now = now or timezone.now()
    return Q(lifted_at__isnull=True) & (
        Q(kind=Sanction.Kind.BAN) | Q(kind=Sanction.Kind.SUSPENSION, ends_at__gt=now)
    )


def sanction_in_force(*, user_id: Any) -> Sanction | None:
    """The sanction that stops the user sending now (a ban before a suspension), if any."""
    # One statement on every send: bans first, then the suspension that ends last.
    return (
        Sanction.objects.filter(active_sanctions(), user_id=user_id)
        .annotate(not_a_ban=Case(When(kind=Sanction.Kind.BAN, then=Value(0)), default=Value(1)))
        .order_by("not_a_ban", "-ends_at", "pk")
        .first()
    )


def sanction_blocking(*, user_id: Any) -> Sanction | None:
    """`sanction_in_force`, for the send path: kept per process under the catalog
    (`chatsite.catalog`), so a send reads no sanction; any change to a sanction (imposed,
    lifted, a warning seen) drops what every process keeps. A suspension that ran out since
    it was read is read again, on each send until the next catalog change."""
    sanction = CATALOG.get(("sanction", user_id), lambda: sanction_in_force(user_id=user_id))
    if sanction is not None and sanction.ends_at is not None and sanction.ends_at <= timezone.now():
        return sanction_in_force(user_id=user_id)
    return sanction


def warnings_unseen(*, user: Any) -> list[Sanction]:
    """Staff warnings on `user`'s account not yet acknowledged, oldest first."""
    return list(
        Sanction.objects.filter(
            user=user, kind=Sanction.Kind.WARNING, seen_at__isnull=True, lifted_at__isnull=True
        ).order_by("created_at", "id")
    )
