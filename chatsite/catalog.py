"""Rows that every turn reads and staff rarely change (plans, pools, prices), kept per process.

What a process loads is kept under the catalog's version, a token in Redis. Any change to such
a row replaces the token (`catalog_changed`): at once, and again when the change's transaction
commits, so a process that read the old rows meanwhile drops them too. A later read in any
process sees a new token and loads afresh; flushing Redis makes a new token as well. Each read
costs one Redis GET instead of the statements it saves (a send read its plan, the plan's pools
and its pool: three; a finish its user, plan and price: four).

The apps whose rows these are name their models with `catalog_rows` (in `ready()`), which
calls `catalog_changed` on their `post_save` and `post_delete` signals (a queryset's `delete()`
sends them too). A queryset's `update()` sends none: code that changes such rows that way
calls `catalog_changed()` itself.

Another kind of row with the same pattern (read on every request, rarely changed) may keep a
catalog of its own, with its own version key (`Catalog("...")`, `catalog_rows(..., catalog=)`,
`changed()`), so that its changes do not drop this one: the accounts' API keys do.

Values are shared by every thread of the process: treat them as read-only.

Within a request of the edge (`request_scope`, entered by its first middleware) each version
is read once and trusted for `REQUEST_MEMO_SECONDS` (a send read it four times; a stream that
lasts longer reads it again); a change the request makes itself is seen at once. Elsewhere (the
scheduler, Celery) every read asks Redis.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from django.db import models, transaction
from django.db.models.signals import post_delete, post_save
from redis.exceptions import RedisError

from .redis import sync_redis

logger = logging.getLogger(__name__)

T = TypeVar("T")

VERSION_KEY = "catalog:version"
# Entries one process keeps at most (a user's plan is one each); past it, all are dropped.
MAX_ENTRIES = 20_000
# How long a request trusts a version it has read (`request_scope`).
REQUEST_MEMO_SECONDS = 1.0

# The versions the current request has read, by key, with when (None outside a request).
_request_versions: ContextVar[dict[str, tuple[str, float]] | None] = ContextVar(
    "catalog_request_versions", default=None
)


@contextmanager
def request_scope() -> Iterator[None]:
    """A request of the edge: each catalog's version is read once inside (for at most
    `REQUEST_MEMO_SECONDS`); after it, every read asks Redis again."""
    token = _request_versions.set({})
    try:
        yield
    finally:
        _request_versions.reset(token)


class Catalog:
    """A process's cache of catalog rows, valid while the version it was filled under is."""

    def __init__(self, version_key: str = VERSION_KEY) -> None:
        # The Redis key of this catalog's version: each catalog is dropped on its own rows'
        # changes alone.
        self.version_key = version_key
        self._lock = threading.Lock()
        self._version: str | None = None
        self._entries: dict[Hashable, Any] = {}

    def get(
        self, key: Hashable, load: Callable[[], T], *, keep: Callable[[T], bool] | None = None
    ) -> T:
        """The value kept under `key`, or `load()`'s, kept for later reads (unless `keep`
        says otherwise of it: a lookup that found nothing, say, which anyone can make)."""
        version = _version(self.version_key)
        if version is None:
            return load()  # Redis is unreachable: straight from the database, keep nothing
        with self._lock:
            if version != self._version:
                self._entries.clear()
                self._version = version
            elif key in self._entries:
                value: T = self._entries[key]
                return value
        value = load()
        if keep is not None and not keep(value):
            return value
        with self._lock:
            # Kept only if no newer version was seen while it loaded.
            if self._version == version:
                if len(self._entries) >= MAX_ENTRIES:
                    self._entries.clear()
                self._entries[key] = value
        return value

    def forget(self) -> None:
        """Drop everything this process keeps."""
        with self._lock:
            self._entries.clear()
            self._version = None

    def changed(self, **_: Any) -> None:
        """This catalog's rows changed: every process reloads them (also a signal receiver)."""
        self.forget()
        if (memo := _request_versions.get()) is not None:
            memo.pop(self.version_key, None)
        _new_version(self.version_key)
        transaction.on_commit(functools.partial(_new_version, self.version_key), robust=True)


CATALOG = Catalog()


def catalog_changed(**_: Any) -> None:
    """Catalog rows changed: every process reloads them (also a signal receiver)."""
    CATALOG.changed()


def catalog_rows(*kept: type[models.Model], catalog: Catalog = CATALOG) -> None:
    """Every save or delete of a row of these models is a change of `catalog`."""
    for model in kept:
        for signal in (post_save, post_delete):
            signal.connect(
                catalog.changed,
                sender=model,
                weak=False,
                dispatch_uid=f"{catalog.version_key}-{model._meta.label}",
            )


def _new_version(version_key: str = VERSION_KEY) -> None:
    try:
        sync_redis().set(version_key, uuid.uuid4().hex)
    except RedisError:
        # Every process reads Redis before trusting what it keeps: none trusts it now.
        logger.warning("could not publish a catalog change", exc_info=True)


def _version(version_key: str) -> str | None:
    """The catalog's version: the one the current request read lately, else Redis's."""
    memo = _request_versions.get()
    if memo is not None and (known := memo.get(version_key)) is not None:
        kept, read_at = known
        if time.monotonic() - read_at < REQUEST_MEMO_SECONDS:
            return kept
    version = _current_version(version_key)
    if memo is not None and version is not None:
        memo[version_key] = (version, time.monotonic())
    return version


def _current_version(version_key: str = VERSION_KEY) -> str | None:
    redis = sync_redis()
    try:
        version = redis.get(version_key)
        if version is None:
            # First read since Redis was emptied: a new token, whoever sets it first.
            redis.set(version_key, uuid.uuid4().hex, nx=True)
            version = redis.get(version_key)
    except RedisError:
        logger.warning("could not read the catalog version", exc_info=True)
        return None
    return None if version is None else str(version)
