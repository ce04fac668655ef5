"""The one way to a Redis client: every process and app reaches `settings.REDIS_URL` here.

Replies are decoded to `str`. `sync_redis()` and `shared_redis()` give the process's one
pooled client (thread-safe; a command borrows a connection and gives it back), so a request
that calls Redis several times opens no new connection for any of them; `sync_redis` with
options (a socket timeout, say) and `async_redis` give a client of the caller's own (close
it when done).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from django.conf import settings
from redis import BlockingConnectionPool, Redis
from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

# What a Redis that paused or went away raises (OSError: a socket's own failure): an outage
# to ride out or to answer 503 for, not a bug.
REDIS_FAULTS = (RedisConnectionError, RedisTimeoutError, OSError)

# Connections the shared pool opens at most; a thread that finds them all busy waits for one
# (up to POOL_TIMEOUT_SECONDS) instead of failing.
POOL_MAX_CONNECTIONS = 64
POOL_TIMEOUT_SECONDS = 10


def sync_redis(**options: Any) -> Redis:
    """The shared pooled client; with `options` (for redis-py, e.g. `socket_timeout`), a
    client of the caller's own. Closing the shared one releases only what it holds."""
    if not options:
        return shared_redis()
    return Redis.from_url(settings.REDIS_URL, decode_responses=True, **options)


def async_redis(**options: Any) -> AsyncRedis:
    """An asyncio client of the caller's own; close it with `aclose()`."""
    return AsyncRedis.from_url(settings.REDIS_URL, decode_responses=True, **options)


def shared_redis(url: str | None = None) -> Redis:
    """The process's pooled client of `url` (by default `settings.REDIS_URL`); never closed."""
    return _pooled(url or settings.REDIS_URL)


@lru_cache(maxsize=4)
def _pooled(url: str) -> Redis:
    # One pool per process and URL; redis-py resets it in a forked child.
    pool = BlockingConnectionPool.from_url(
        url,
        decode_responses=True,
        max_connections=POOL_MAX_CONNECTIONS,
        timeout=POOL_TIMEOUT_SECONDS,
    )
    return Redis(connection_pool=pool)
