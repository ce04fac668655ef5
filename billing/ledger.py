"""The usage ledger's rows, and its outbox: what answers owe it, written in batches.

An answer a scheduler replica finishes (and every answer of a `/v1` key that keeps nothing,
which has no `Generation` row: inference/unkept.py) owes its usage to the outbox. As it
ends, `usage_owe` settles its reservation in Redis at once (the unused tokens back, its
concurrency slot freed) and appends its usage event to the outbox, a Redis Stream. That is
all its finish costs billing: no statement. (A finish elsewhere, such as a cancel of a
queued answer at the edge, writes its event at once with `services.usage_record`.) A kept
answer whose entry was lost (Redis lost the stream, or its process died between the answer's
final state and the entry) is recorded by the reconciler from its row.

`ledger_flush` writes the outbox to Postgres in batches of up to `LEDGER_BATCH` events, one
`INSERT ... ON CONFLICT DO NOTHING` each (the generation id is the ledger's dedup key), and
deletes the entries it wrote only after that commits. A process that dies anywhere in
between loses nothing and charges nothing twice: the entries stay for a later flush, which
inserts what is missing and skips what is there.

One writer at a time (a short Redis lock): the scheduler replica that finished answers
flushes about a second after them (the `generations_flush` hook, so a second of answers is
one statement, and an idle replica flushes nothing); the usage reconciler (Celery beat)
flushes what a replica that died left behind.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from django.conf import settings
from django.contrib.auth.models import User
from django.utils import timezone

from inference.models import Generation
from inference.unkept import UnkeptGeneration

from . import quota
from .models import Plan, PoolPrice, UsageEvent
from .pricing import generation_cost_micros
from .selectors import plan_of, pool_price

logger = logging.getLogger(__name__)

LEDGER_BATCH = 500
# The outbox's entries as the (decoding) client reads them: (id, fields).
Entries = list[tuple[str, dict[str, str]]]
# A writer that died holding the lock holds it no longer than this.
LOCK_MS = 30_000


def outbox_key() -> str:
    return f"{settings.BILLING_REDIS_PREFIX}:ledger:outbox"


def _lock_key() -> str:
    return f"{settings.BILLING_REDIS_PREFIX}:ledger:lock"


def charged(generation: Generation | UnkeptGeneration, held: quota.Held | None) -> tuple[int, int]:
    """(prompt, output) tokens a final generation is charged for.

    What `generation_finish` recorded; a generation that produced text but reported no prompt
    usage (swept after its scheduler died) is charged the prompt estimate it reserved.
    """
    output = generation.output_tokens or 0
    prompt = generation.prompt_tokens
    if prompt is None:
        prompt = held.prompt_tokens if held is not None and output > 0 else 0
    return prompt, output


def consumed_nothing(status: str, charged_tokens: int) -> bool:
    """An answer that never reached a model (rejected, cancelled in the queue): it does not
    count against the message cap."""
    return status != Generation.Status.COMPLETE and charged_tokens == 0


def usage_event(
    *,
    generation_id: Any,
    user_id: int,
    pool_id: int,
    price: PoolPrice | None,
    plan: Plan | None,
    tier: str,
    status: str,
    prompt_tokens: int,
    output_tokens: int,
    cached_tokens: int,
    occurred_at: datetime,
) -> UsageEvent:
    """The ledger row of one generation, at `price` (the answering pool's: a fallback's when
    the overload policy sent it there), counted against the pool asked for (`pool_id`)."""
    input_price = price.input_micros_per_million if price else 0
    output_price = price.output_micros_per_million if price else 0
    return UsageEvent(
        generation_id=generation_id,
        user_id=user_id,
        pool_id=pool_id,
        plan=plan,
        tier=tier,
        status=status,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        cached_tokens=cached_tokens,
        input_micros_per_million=input_price,
        output_micros_per_million=output_price,
        cost_micros=generation_cost_micros(
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            input_price=input_price,
            output_price=output_price,
        ),
        occurred_at=occurred_at,
    )


def usage_owe(*, generation: Generation | UnkeptGeneration, now: int | None = None) -> None:
    """A final generation's usage event into the outbox, then its reservation settled with
    the real usage (`usage_record` writes the event at once instead)."""
    if not generation.is_final:
        raise ValueError("usage is owed once a generation is final")
    held = quota.held(user_id=generation.user_id, reservation_id=str(generation.id))
    prompt, output = charged(generation, held)
    finished = generation.finished_at or timezone.now()
    # First the debt, then the settlement: a crash between the two leaves the reservation
    # open, and the reconciler settles it; never a settlement without its event.
    quota.client().xadd(
        outbox_key(),
        {
            "generation_id": str(generation.id),
            "user_id": str(generation.user_id),
            "pool_id": str(generation.pool_id),
            # Priced at the pool that answered (a fallback's, where the overload policy
            # sent it), counted against the one asked for.
            "price_pool_id": str(generation.served_pool_id or generation.pool_id),
            "tier": generation.tier,
            "status": generation.status,
            "prompt_tokens": str(prompt),
            "output_tokens": str(output),
            "cached_tokens": str(generation.cached_tokens or 0),
            # To the microsecond, as the generation's row has it.
            "occurred_us": str(_epoch_us(finished)),
        },
    )
    if held is not None:
        settle_used(
            generation,
            used=prompt + output,
            tokens_per_minute=plan_of(user_id=generation.user_id).tokens_per_minute,
            now=now,
        )


def settle_used(
    generation: Generation | UnkeptGeneration,
    *,
    used: int,
    tokens_per_minute: int,
    now: int | None = None,
) -> None:
    """Replace the generation's reservation by the `used` tokens: unused ones back, overruns
    charged, its slot freed."""
    quota.settle(
        user_id=generation.user_id,
        pool_id=generation.pool_id,
        reservation_id=str(generation.id),
        tokens_per_minute=tokens_per_minute,
        charged_tokens=used,
        # An answer that never reached a model (rejected, cancelled in the queue) does not
        # count against the message cap.
        refund_message=consumed_nothing(generation.status, used),
        now=quota.now_ms() if now is None else now,
    )


def ledger_flush(*, batch: int = LEDGER_BATCH) -> int:
    """Write the outbox's events to the ledger, `batch` at a time, until it is empty; returns
    how many were taken from it (0 if another writer holds the lock)."""
    taken = 0
    with _writer() as holding:
        if not holding:
            return 0
        redis = quota.client()
        while entries := cast(Entries, redis.xrange(outbox_key(), count=batch)):
            _write(entries)
            redis.xdel(outbox_key(), *(entry_id for entry_id, _ in entries))
            taken += len(entries)
    return taken


def outbox_size() -> int:
    """How many usage events wait to be written."""
    return int(quota.client().xlen(outbox_key()))


@contextmanager
def _writer() -> Iterator[bool]:
    redis = quota.client()
    token = uuid.uuid4().hex
    holding = bool(redis.set(_lock_key(), token, nx=True, px=LOCK_MS))
    try:
        yield holding
    finally:
        if holding:  # only while it is still ours (it may have lapsed and been taken)
            quota.script(quota.DELETE_IF_EQUAL)(keys=[_lock_key()], args=[token])


def _write(entries: Entries) -> None:
    """One INSERT for the batch; the events of users deleted since are dropped (nobody is
    charged), and events already in the ledger are skipped."""
    owed = [fields for _, fields in entries]
    users = {int(fields["user_id"]) for fields in owed}
    existing = set(User.objects.filter(pk__in=users).values_list("pk", flat=True))
    rows = []
    for fields in owed:
        user_id = int(fields["user_id"])
        if user_id not in existing:
            logger.info("usage of generation %s: its user is gone", fields["generation_id"])
            continue
        pool_id = int(fields["pool_id"])
        rows.append(
            usage_event(
                generation_id=uuid.UUID(fields["generation_id"]),
                user_id=user_id,
                pool_id=pool_id,
                price=pool_price(pool_id=int(fields.get("price_pool_id") or pool_id)),
                plan=plan_of(user_id=user_id),
                tier=fields["tier"],
                status=fields["status"],
                prompt_tokens=int(fields["prompt_tokens"]),
                output_tokens=int(fields["output_tokens"]),
                cached_tokens=int(fields["cached_tokens"]),
                occurred_at=_occurred_at(fields),
            )
        )
    UsageEvent.objects.bulk_create(rows, ignore_conflicts=True)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _epoch_us(moment: datetime) -> int:
    return (moment - _EPOCH) // timedelta(microseconds=1)


def _occurred_at(fields: dict[str, str]) -> datetime:
    """When an owed event happened (an entry an older release wrote has milliseconds)."""
    if "occurred_us" in fields:
        return _EPOCH + timedelta(microseconds=int(fields["occurred_us"]))
    return _EPOCH + timedelta(milliseconds=int(fields["occurred_ms"]))
