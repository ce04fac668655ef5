"""Writes to accounts: API keys are created, used and revoked only here."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterable
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone
from redis.exceptions import RedisError

from chatsite.catalog import Catalog
from chatsite.errors import ServiceError
from chatsite.redis import sync_redis

from .errors import ErrorCode
from .models import ApiKey
from .selectors import api_key_for_user

logger = logging.getLogger(__name__)

KEY_PREFIX = "csk_"
MAX_ACTIVE_KEYS_PER_USER = 50
# Writing last-use on every request would turn reads into writes; a minute is precise enough.
LAST_USED_RESOLUTION = timedelta(minutes=1)
# A revoked key's mark, for the streams it opened before (`api_key_revoked`): they look at
# least once a heartbeat period, so a day outlasts any look by far.
REVOKED_MARK_SECONDS = 24 * 3600
# Active API keys with their users, kept per process (`api_key_authenticate`); every save or
# delete of a key or a user changes its version (`AccountsConfig.ready`).
CREDENTIALS = Catalog("credentials:version")


def hash_key(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode()).hexdigest()


def api_key_create(
    *,
    user: User,
    name: str,
    scope: str = ApiKey.Scope.CHAT,
    store_conversations: bool = True,
    created_with: ApiKey | None = None,
) -> tuple[ApiKey, str]:
    """Create a key for `user` and return it with the raw key, which is never stored.

    `scope` is what the key may do (`ApiKey.Scope`; chat only unless asked). A key made with
    another key (`created_with`) never gets a wider scope than that one has: 403
    `insufficient_scope`. `store_conversations` decides whether what the OpenAI-compatible
    API gets with this key is kept as conversations.
    """
    scope = ApiKey.Scope(scope)  # a scope that does not exist is a caller's bug: ValueError
    if created_with is not None and not created_with.has_scope(scope):
        raise ServiceError(
            ErrorCode.INSUFFICIENT_SCOPE,
            f"A {created_with.scope} API key cannot create a {scope} key.",
            status=403,
            detail={"key_scope": created_with.scope, "required_scope": scope},
        )
    with transaction.atomic():
        active = ApiKey.objects.select_for_update().filter(user=user, revoked_at__isnull=True)
        if active.count() >= MAX_ACTIVE_KEYS_PER_USER:
            raise ServiceError(
                ErrorCode.API_KEY_LIMIT,
                f"A user may hold at most {MAX_ACTIVE_KEYS_PER_USER} active API keys.",
            )
        raw_key = KEY_PREFIX + secrets.token_urlsafe(30)
        key = ApiKey.objects.create(
            user=user,
            name=name.strip() or "API key",
            prefix=raw_key[:12],
            key_hash=hash_key(raw_key),
            scope=scope,
            store_conversations=store_conversations,
        )
    return key, raw_key


def api_key_update(*, user: User, key_id: int, store_conversations: bool) -> ApiKey:
    """Change whether the OpenAI-compatible API keeps conversations made with one of
    `user`'s keys; requests already answered are not touched."""
    key = api_key_for_user(user=user, key_id=key_id)
    if key.store_conversations != store_conversations:
        key.store_conversations = store_conversations
        key.save(update_fields=["store_conversations"])
    return key


def api_key_revoke(*, user: User, key_id: int) -> ApiKey:
    """Revoke one of `user`'s keys; revoking twice is harmless. Its requests are refused from
    the next on, and the streams it holds open end (`api_key_revoked`)."""
    key = api_key_for_user(user=user, key_id=key_id)
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
        _mark_revoked([key.key_hash])
    return key


def api_keys_revoke(*, keys: QuerySet[ApiKey]) -> int:
    """Revoke every active key in `keys` (staff action); returns how many were revoked."""
    with transaction.atomic():
        active = keys.filter(revoked_at__isnull=True).select_for_update()
        hashes = list(active.values_list("key_hash", flat=True))
        revoked = active.update(revoked_at=timezone.now())
        CREDENTIALS.changed()  # an update sends no signal
        _mark_revoked(hashes)
    return revoked


def revoked_mark_key(key_hash: str) -> str:
    return f"apikey:revoked:{key_hash}"


def _mark_revoked(key_hashes: Iterable[str]) -> None:
    """Once the revocation commits, mark the keys in Redis for the streams they hold open. A
    mark that Redis misses leaves such a stream to end with its answer, as before; every new
    request is refused by the database all the same."""
    marks = [revoked_mark_key(key_hash) for key_hash in key_hashes]

    def mark() -> None:
        try:
            with sync_redis().pipeline(transaction=False) as pipe:
                for name in marks:
                    pipe.set(name, "1", ex=REVOKED_MARK_SECONDS)
                pipe.execute()
        except RedisError:
            logger.warning("could not mark %d revoked key(s) for open streams", len(marks))

    if marks:
        transaction.on_commit(mark)


def api_key_revocation_check(redis: Any, raw_key: str) -> Callable[[], Awaitable[bool]]:
    """For a stream that the key `raw_key` opened: a check, for as long as the stream lasts,
    that the key has not been revoked since (one Redis EXISTS)."""
    mark = revoked_mark_key(hash_key(raw_key))

    async def still_valid() -> bool:
        # Shielded: a client leaving cancels the stream while it may be here, and a redis-py
        # command cancelled mid-way can swallow the cancel (the stream then never ended).
        return not await asyncio.shield(redis.exists(mark))

    return still_valid


def api_key_authenticate(*, raw_key: str) -> ApiKey | None:
    """The active key matching `raw_key`, with last-use recorded; None if there is none.

    Active keys are kept per process with their users (`CREDENTIALS`): a request's key costs
    one Redis GET, not a statement. Every change to a key or a user (a revocation, a
    deactivation, a deletion) replaces the credentials' version, so a revoked key is refused
    from its next request on in every process, as when each request read the database. Each
    caller gets its own copies: a request may cache permissions on its user."""
    if not raw_key.startswith(KEY_PREFIX):
        return None
    digest = hash_key(raw_key)
    kept = CREDENTIALS.get(
        ("api-key", digest), lambda: _active_key(digest), keep=lambda key: key is not None
    )
    if kept is None or not kept.user.is_active:
        return None
    now = timezone.now()
    if kept.last_used_at is None or now - kept.last_used_at >= LAST_USED_RESOLUTION:
        ApiKey.objects.filter(pk=kept.pk).update(last_used_at=now)
        kept.last_used_at = now  # the kept key too: one write a period, not one a request
    key = copy.copy(kept)
    key.user = copy.copy(kept.user)
    return key


def _active_key(digest: str) -> ApiKey | None:
    return (
        ApiKey.objects.select_related("user")
        .filter(key_hash=digest, revoked_at__isnull=True)
        .first()
    )
