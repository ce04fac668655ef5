"""Background writes whose rows may vanish under them.

A Celery task is handed ids, and whatever they name may be deleted before it runs or while it
runs: a `/v1` conversation is removed the moment its answer is final, a user deletes a chat,
retention purges it, an account goes. Every task follows one pattern, so that a vanished row
is a quiet no-op (a log line at info), never a traceback, a retry or half a write:

1. Read with `.filter(...).first()` (never `.get()`), and return when the row is gone.
2. Write so that a vanished row writes nothing, in one of three ways:
   - an UPDATE whose WHERE names the row (`.filter(pk=..., ...).update(...)`): no row, no
     write (titles);
   - under the parent's row lock, `select_for_update().filter(...).exists()` first, where
     every deletion of that parent locks it first as well (summaries: a conversation's
     removal locks the conversation before it deletes anything);
   - an insert inside `unless_vanished`: it is its own transaction (or savepoint), and an
     integrity error there, once the caller's `still_there` says a row it points at is gone,
     means nothing was written and is reported as `vanished`; any other is raised as before
     (the search index, the usage ledger, statements, invoices).

Why nested blocks check their foreign keys at once: Django creates them `DEFERRABLE
INITIALLY DEFERRED`, so inside an outer transaction an insert that points at a deleted row
fails only at the outer commit, past the savepoint that could have undone just that write.
Checked at the statement, the check also takes its share lock on the parent right away: a
deletion that holds the parent locked is waited for and seen, rather than raced.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

from django.db import IntegrityError, connection, models, transaction

logger = logging.getLogger(__name__)


@dataclass
class Write:
    """The outcome of one `unless_vanished` block: `vanished` once it wrote nothing because
    a row it hangs on was deleted."""

    vanished: bool = False


@contextmanager
def unless_vanished(
    *written: type[models.Model], still_there: Callable[[], bool], what: str
) -> Iterator[Write]:
    """Run the block's writes to the `written` models as one savepoint that a vanished
    parent turns into a no-op.

    `still_there` is asked only after an integrity error, with the savepoint rolled back: True
    (the parents exist, so the error is a real one) re-raises it; False swallows it, logs `what`
    at info and sets `vanished` on the yielded `Write`.
    """
    outcome = Write()
    # Outermost, the block's commit (and so every deferred check) happens inside the `try`;
    # only nested in a transaction must its foreign keys be checked before the savepoint ends.
    constraints = _foreign_keys(written) if connection.in_atomic_block else ()
    try:
        with transaction.atomic():
            _set_constraints(constraints, "IMMEDIATE")
            yield outcome
            # A released savepoint keeps the mode: the rest of the transaction is as it was.
            _set_constraints(constraints, "DEFERRED")
    except IntegrityError:
        if still_there():
            raise
        outcome.vanished = True
        logger.info("%s: gone before it was written, nothing written", what)


def _foreign_keys(written: tuple[type[models.Model], ...]) -> tuple[str, ...]:
    if connection.vendor != "postgresql":
        return ()  # the others check as they write
    return tuple(
        name for model in written for name in _deferrable_foreign_keys(model._meta.db_table)
    )


@functools.cache
def _deferrable_foreign_keys(table: str) -> tuple[str, ...]:
    """The names of `table`'s deferrable foreign keys (every one Django creates)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname FROM pg_constraint"
            " WHERE conrelid = %s::regclass AND contype = 'f' AND condeferrable"
            " ORDER BY conname",
            [connection.ops.quote_name(table)],
        )
        return tuple(row[0] for row in cursor.fetchall())


def _set_constraints(names: tuple[str, ...], mode: Literal["IMMEDIATE", "DEFERRED"]) -> None:
    if not names:
        return
    quoted = ", ".join(connection.ops.quote_name(name) for name in names)
    with connection.cursor() as cursor:
        # Names from the catalog, quoted; the mode is one of two literals of this module.
        cursor.execute(f"SET CONSTRAINTS {quoted} {mode}")
