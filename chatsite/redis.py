"""The one way to a Redis client: every process and app reaches `settings.REDIS_URL` here.

Replies are decoded to `str`. `sync_redis()` and `shared_redis()` give the process's one
pooled client (thread-safe; a command borrows a connection and gives it back), so a request
that calls Redis several times opens no new connection for any of them; `sync_redis` with
options (a socket timeout, say) and `async_redis` give a client of the caller's own (close
it when done).

With `REDIS_CLUSTER` on, `REDIS_URL` names any node of a Redis Cluster and these clients are
redis-py's `RedisCluster`, which routes each command to the node serving its key's slot. They
take the same commands as the plain clients for everything this project sends: every script
and multi-key command names keys of one slot (hash tags: README, "Redis Cluster"), pipelines
are split by node, and `DEL` of keys in several slots is split by slot. What must reach one
node's own connection (the edge's blocking stream reads, `CLIENT UNBLOCK`) gets `node_redis`.
"""

from __future__ import annotations

import zlib
from functools import lru_cache
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings
from redis import BlockingConnectionPool, Redis, RedisCluster
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio import RedisCluster as AsyncRedisCluster
from redis.asyncio.client import PubSub as AsyncPubSub
from redis.exceptions import ClusterDownError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

# What a Redis that paused or went away raises (OSError: a socket's own failure; a cluster
# with slots unserved: ClusterDownError): an outage to ride out or to answer 503 for, not a
# bug.
REDIS_FAULTS = (RedisConnectionError, RedisTimeoutError, ClusterDownError, OSError)

# Connections the shared pool opens at most; a thread that finds them all busy waits for one
# (up to POOL_TIMEOUT_SECONDS) instead of failing.
POOL_MAX_CONNECTIONS = 64
POOL_TIMEOUT_SECONDS = 10

# The hash tags the streams that edges tail are spread over (`stream_tag`). A Redis Cluster
# serves a command only on keys of one slot, so an edge reads its streams with one blocking
# XREAD per tag it tails: with a tag per stream that would be a connection per stream. 16
# tags spread the streams over the cluster's masters and bound an edge process's readers.
# Changing the number renames the streams of answers under way.
STREAM_SHARDS = 16


def cluster_mode() -> bool:
    """Whether `REDIS_URL` names a node of a Redis Cluster (`REDIS_CLUSTER`)."""
    return bool(getattr(settings, "REDIS_CLUSTER", False))


def stream_tag(name: object) -> str:
    """The hash tag of the stream named after `name` (a generation or user id): one of
    `STREAM_SHARDS`, the same in every process."""
    return f"{{s{zlib.crc32(str(name).encode()) % STREAM_SHARDS}}}"


def sync_redis(**options: Any) -> Redis:
    """The shared pooled client; with `options` (for redis-py, e.g. `socket_timeout`), a
    client of the caller's own. Closing the shared one releases only what it holds."""
    if not options:
        return shared_redis()
    if cluster_mode():
        return _as_redis(RedisCluster.from_url(_cluster_url(), decode_responses=True, **options))
    return Redis.from_url(settings.REDIS_URL, decode_responses=True, **options)


def async_redis(**options: Any) -> AsyncRedis:
    """An asyncio client of the caller's own; close it with `aclose()`."""
    if cluster_mode():
        client = AsyncRedisCluster.from_url(_cluster_url(), decode_responses=True, **options)
        return cast(AsyncRedis, client)
    return AsyncRedis.from_url(settings.REDIS_URL, decode_responses=True, **options)


def shared_async_redis() -> AsyncRedis:
    """In cluster mode, an asyncio cluster client that the callers of one event loop share:
    its `aclose()` closes nothing, since a cluster client's would close every node's
    connections under the others' feet (a plain client on a shared pool gives back only
    what it holds, which is what callers that close it expect)."""
    return cast(AsyncRedis, _SharedAsyncCluster.from_url(_cluster_url(), decode_responses=True))


class _SharedAsyncCluster(AsyncRedisCluster):
    async def aclose(self) -> None:
        return None


class _SharedCluster(RedisCluster):
    """The process's shared cluster client: callers close it when done, as they do the plain
    shared client, whose `close()` keeps its pool; this one's would forget its default node
    under the other threads' feet."""

    def close(self) -> None:
        return None


async def async_pubsub(client: AsyncRedis) -> AsyncPubSub:
    """A pub/sub of `client` (close it with `aclose()`). A cluster client's is connected to
    one node, which is enough: a cluster delivers a PUBLISH to subscribers on every node. It
    needs the client's map of slots first, which redis-py does not load for it."""
    if isinstance(client, AsyncRedisCluster):
        await client.initialize()
    return client.pubsub()


def node_redis(host: str, port: int, **options: Any) -> AsyncRedis:
    """An asyncio client of one cluster node (the credentials and options of `REDIS_URL`),
    for what must stay on that node's own connection: a blocking read of its streams and the
    `CLIENT UNBLOCK` that cuts it short."""
    parts = urlsplit(settings.REDIS_URL)
    credentials = parts.netloc.rpartition("@")[0]
    netloc = f"{credentials}@{host}:{port}" if credentials else f"{host}:{port}"
    url = urlunsplit((parts.scheme, netloc, "/0", parts.query, ""))
    return AsyncRedis.from_url(url, decode_responses=True, **options)


def shared_redis(url: str | None = None) -> Redis:
    """The process's pooled client of `url` (by default `settings.REDIS_URL`); never closed."""
    return _pooled(url or settings.REDIS_URL, cluster_mode())


@lru_cache(maxsize=4)
def _pooled(url: str, cluster: bool) -> Redis:
    # One pool per process and URL; redis-py resets it in a forked child.
    if cluster:
        # A pool per node, each bounded like the plain one (a thread waits for a connection).
        return _as_redis(
            _SharedCluster.from_url(
                _cluster_url(url),
                decode_responses=True,
                connection_pool_class=BlockingConnectionPool,
                max_connections=POOL_MAX_CONNECTIONS,
            )
        )
    pool = BlockingConnectionPool.from_url(
        url,
        decode_responses=True,
        max_connections=POOL_MAX_CONNECTIONS,
        timeout=POOL_TIMEOUT_SECONDS,
    )
    return Redis(connection_pool=pool)


def _cluster_url(url: str | None = None) -> str:
    """`url` without its database: a cluster has only database 0, and redis-py's cluster
    client refuses any `db` argument."""
    parts = urlsplit(url or settings.REDIS_URL)
    return urlunsplit((parts.scheme, parts.netloc, "", parts.query, ""))


def _as_redis(client: RedisCluster) -> Redis:
    # The cluster client takes the commands the project sends as the plain one does (see the
    # module's docstring); callers are typed against the plain client.
    return cast(Redis, client)
