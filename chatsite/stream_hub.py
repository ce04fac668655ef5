"""One reader per process of every Redis Stream the process's responses tail.

Each response that relays a stream (a generation's events, a user's events, a streamed `/v1`
answer) subscribes here with the id of the last entry it holds. The hub keeps one connection
and one blocking `XREAD` over every stream somebody tails, each from the oldest position a
subscriber of it still needs, and hands each entry to the subscribers that have not had it.
A subscription to a stream not in the current read wakes it (`CLIENT UNBLOCK`), so the next
read includes it at once. So a process holds one Redis connection for its streams however
many clients it serves (and a bounded pool for the responses' other commands), and an idle
stream costs a queue, not a connection and a pending read.

Once nobody tails a stream, the reading connection stays open a while
(`READER_LINGER_SECONDS`) for the next one, and one found closed meanwhile is replaced.

A subscriber that falls far behind (its client reads slower than the answer streams) is let
go with `Lagging`: its response ends and the client comes back with Last-Event-ID, which Redis
still holds. A Redis failure ends every subscription with the error, the same way.

There is one hub per event loop (`hub()`): an edge process runs one; tests run one per test.

On a Redis Cluster a command may name keys of one slot only, so the hub there
(`ClusterStreamHub`) is a set of lanes, one per slot tailed, each a `StreamHub` reading with
its own connection to the node serving that slot. Streams share `STREAM_SHARDS` hash tags
(`chatsite.redis.stream_tag`), so an edge process holds at most that many readers. A slot
that moved (a resharding, a failover) fails its lane's read with a redirection: its
subscribers end, their clients come back with Last-Event-ID, and the next subscription to the
slot opens a lane on the node that serves it now.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import weakref
from dataclasses import dataclass, field
from typing import Any, cast

from django.conf import settings
from redis.asyncio import BlockingConnectionPool
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio import RedisCluster as AsyncRedisCluster
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError

from chatsite import metrics
from chatsite.redis import async_redis, cluster_mode, node_redis, shared_async_redis

logger = logging.getLogger(__name__)

# Entries read per stream and round trip.
READ_BATCH = 64
# How long one XREAD waits when nothing happens; a new subscription cuts it short.
BLOCK_MS = 5_000
# After a read that returned entries, how long the next one waits to be sent.
GATHER_SECONDS = 0.005
# How long the reading connection stays open once nobody tails a stream, so that the next
# stream's first read does not wait for a new connection (redis-py's connect, its hello and
# `CLIENT ID`: at one answer at a time, every answer paid for it).
READER_LINGER_SECONDS = 30.0
# Entries a subscriber may have waiting before it is let go (its client reconnects).
MAX_BACKLOG = 2_048
# The loop's pool for responses' own commands (watchers, clean-up): bounded, so connections
# do not grow with the streams served either.
COMMAND_CONNECTIONS = 16
COMMAND_WAIT_SECONDS = 10


class Lagging(Exception):
    """The subscriber fell too far behind; its client should reconnect and catch up."""


def entry_key(entry_id: str) -> tuple[int, int]:
    milliseconds, _, sequence = entry_id.partition("-")
    return int(milliseconds), int(sequence or 0)


Item = tuple[str, dict[str, str]] | BaseException


class Mailbox:
    """The entries waiting for one subscription: what an `asyncio.Queue` did here, for the
    one reader and the hub on the event loop, without the queue's four deques and its event
    (3 KiB a stream, held by every idle stream) or its bookkeeping on each entry. The deque
    comes with the first entry."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: collections.deque[Item] | None = None
        self._waiter: asyncio.Future[None] | None = None

    def __len__(self) -> int:
        return len(self._items) if self._items is not None else 0

    def put(self, item: Item) -> None:
        if self._items is None:
            self._items = collections.deque()
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def pop(self) -> Item:
        """The oldest entry (IndexError if none is: call after `wait` said one is there)."""
        if not self._items:
            raise IndexError("no entry is waiting")
        return self._items.popleft()

    async def wait(self, seconds: float) -> bool:
        """Until an entry is waiting (True) or `seconds` pass without one (False)."""
        if self._items:
            return True
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(seconds, _wake_up, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None
        return bool(self._items)


def _wake_up(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


@dataclass(eq=False)
class Subscription:
    """One response's place in one stream, and the entries waiting for it."""

    stream: str
    last_id: str
    mailbox: Mailbox = field(default_factory=Mailbox)
    # `last_id` as a comparable key, kept beside it (every read compares every stream's).
    position: tuple[int, int] = (0, 0)

    def __post_init__(self) -> None:
        self.position = entry_key(self.last_id)


def _position(subscription: Subscription) -> tuple[int, int]:
    return subscription.position


class StreamHub:
    """The multiplexed reader of one event loop (see the module's docstring); with `node`
    (host, port), one lane of a `ClusterStreamHub`, reading from that cluster node."""

    def __init__(self, node: tuple[str, int] | None = None) -> None:
        self.node = node
        self._control: AsyncRedis | None = None
        self._subscriptions: dict[str, set[Subscription]] = {}
        # Per tailed stream, its piece of the XREAD command: [name, position, position's].
        self._pieces: dict[str, list[Any]] = {}
        self._task: asyncio.Task[None] | None = None
        self._reader: AsyncRedis | None = None
        self._reader_id: int | None = None
        self._pool: BlockingConnectionPool | None = None
        self._commands: AsyncRedis | None = None
        # Bumped by every read; `_blocked` while one waits in Redis.
        self._round = 0
        self._blocked = False
        self._waking: asyncio.Task[None] | None = None
        self._waking_round = 0
        self._stopping = False
        # The idle reader's closing, due `READER_LINGER_SECONDS` after the last read, and
        # the close once under way.
        self._linger: asyncio.TimerHandle | None = None
        self._closing: asyncio.Task[None] | None = None

    @property
    def commands(self) -> AsyncRedis:
        """The loop's one client for the responses' other commands, on a shared pool (at
        most `COMMAND_CONNECTIONS`; a command waits for a free one); its `aclose()` gives
        back what it holds and leaves the pool open. One client, not one per response: a
        redis-py client carries its own table of reply parsers, 13 KiB a stream."""
        if self._commands is None and cluster_mode():
            self._commands = shared_async_redis()
        if self._commands is None:
            self._pool = BlockingConnectionPool.from_url(
                settings.REDIS_URL,
                decode_responses=True,
                max_connections=COMMAND_CONNECTIONS,
                timeout=COMMAND_WAIT_SECONDS,
            )
            self._commands = AsyncRedis(connection_pool=self._pool)
        return self._commands

    def streams(self) -> int:
        return len(self._subscriptions)

    @property
    def control(self) -> AsyncRedis:
        """What sends `CLIENT UNBLOCK` to the reader's node: `commands`, or a lane's own
        client of its node."""
        if self.node is None:
            return self.commands
        if self._control is None:
            self._control = node_redis(*self.node, max_connections=2)
        return self._control

    async def subscribe(self, stream: str, last_id: str) -> Subscription:
        """Entries of `stream` after `last_id` (an entry id) go to the subscription's queue."""
        subscription = Subscription(stream, last_id)
        subscribers = self._subscriptions.setdefault(stream, set())
        subscribers.add(subscription)
        if self._task is None or self._task.done() or self._stopping:
            # No read is running, or the last one is closing: start one.
            self._stopping = False
            self._task = asyncio.ensure_future(self._run())
            return subscription
        unread = len(subscribers) == 1 or subscription.position < min(
            s.position for s in subscribers if s is not subscription
        )
        # One wake per read, however many subscribe meanwhile: the next read has them all.
        waking = self._waking is not None and not self._waking.done()
        if unread and not (waking and self._waking_round == self._round):
            self._waking_round = self._round
            self._waking = asyncio.ensure_future(self._wake())
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        subscribers = self._subscriptions.get(subscription.stream)
        if subscribers is None:
            return
        subscribers.discard(subscription)
        if not subscribers:
            # Left out of the next read; the current one may still return its entries.
            del self._subscriptions[subscription.stream]
            self._pieces.pop(subscription.stream, None)

    async def _wake(self) -> None:
        """Cut the current read short so that the next one includes the new subscription.
        The read may not have reached Redis yet: try again until it has, or has ended."""
        started = self._round
        while self._blocked and self._round == started and self._reader_id is not None:
            try:
                if await self.control.client_unblock(self._reader_id):
                    return
            except RedisError:
                return  # the reader fails too, and tells its subscribers
            await asyncio.sleep(0.001)

    async def _run(self) -> None:
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        # A connection kept from an earlier run may have been closed meanwhile (a restarted
        # Redis, a proxy's idle timeout): its failure is retried once on a new one, since
        # nothing was delivered from it.
        kept = self._reader is not None
        failed = False
        try:
            while self._subscriptions:
                try:
                    await self._read_once()
                    kept = False
                except RedisError as exc:
                    if kept:
                        kept = False
                        await self._close_reader()
                        continue
                    logger.warning("reading the tailed streams failed: %s", exc)
                    self._fail_all(exc)
                    await self._close_reader()
        except BaseException:  # cancelled with the loop, say: nothing is kept
            failed = True
            raise
        finally:
            # Before anything here awaits: a subscription from now on starts a new run.
            self._stopping = True
            self._blocked = False
            if failed or self._reader is None:
                await self._close_reader()
            else:
                self._linger = asyncio.get_running_loop().call_later(
                    READER_LINGER_SECONDS, self._close_idle_reader
                )

    def _close_idle_reader(self) -> None:
        """Close the reader kept after the last stream, unless a read has begun since."""
        self._linger = None
        if self._task is None or self._task.done():
            self._closing = asyncio.ensure_future(self._close_reader())

    async def _read_once(self) -> None:
        if self._reader is None:
            # Its blocking read must not outlast the socket's own timeout.
            options: dict[str, Any] = {
                "single_connection_client": True,
                "socket_timeout": BLOCK_MS / 1000 + 10,
            }
            self._reader = (
                node_redis(*self.node, **options) if self.node else async_redis(**options)
            )
            self._reader_id = int(await self._reader.client_id())
        furthest_back = {
            stream: min(subscribers, key=_position)
            for stream, subscribers in self._subscriptions.items()
        }
        command = self._xread(furthest_back)
        connection = self._reader.connection  # a single-connection client, connected above
        if connection is None:
            raise RedisConnectionError("the stream reader has no connection")
        self._round += 1
        self._blocked = True
        try:
            await connection.send_packed_command(command, check_health=False)
            reply = await connection.read_response()
        finally:
            self._blocked = False
        delivered = 0
        for stream, entries in _entries(reply):
            delivered += self._deliver(stream, furthest_back[stream].position, entries)
        if delivered:
            # Counted once a read: the multiprocess counter locks and writes a file's page.
            metrics.EDGE_EVENTS.inc(delivered)
        if reply:
            # Busy: let a few milliseconds of entries gather, so that one read of every
            # tailed stream carries many of them rather than one (the scheduler sends a
            # stream's tokens every 50 ms anyway).
            await asyncio.sleep(GATHER_SECONDS)

    def _xread(self, furthest_back: dict[str, Subscription]) -> bytes:
        """The XREAD of every tailed stream from its furthest-back subscriber, as the bytes
        Redis reads: built from pieces kept per stream (a stream's name, and its position
        until it moves), since every read names every stream. Packing 2,000 arguments
        anew through redis-py cost 3 ms of CPU per read at 1,000 streams."""
        keys = []
        ids = []
        pieces = self._pieces
        for stream, subscription in furthest_back.items():
            kept = pieces.get(stream)
            if kept is None:
                kept = pieces[stream] = [_bulk(stream), "", b""]
            if kept[1] != subscription.last_id:
                kept[1], kept[2] = subscription.last_id, _bulk(subscription.last_id)
            keys.append(kept[0])
            ids.append(kept[2])
        return b"".join([b"*%d\r\n" % (len(XREAD_HEAD) + 2 * len(keys)), XREAD_PACKED, *keys, *ids])

    def _deliver(
        self, stream: str, read_from: tuple[int, int], entries: list[tuple[str, list[str]]]
    ) -> int:
        """Entries read after `read_from` go to the subscribers at or past that position; one
        that subscribed meanwhile from further back waits for the next read, which starts at
        its position, so that it gets every entry in order and none is skipped."""
        keyed = [(entry_key(entry_id), entry_id, _fields(values)) for entry_id, values in entries]
        delivered = 0
        for subscription in list(self._subscriptions.get(stream, ())):
            if subscription.position < read_from:
                continue
            for key, entry_id, fields in keyed:
                if key <= subscription.position:
                    continue
                if len(subscription.mailbox) >= MAX_BACKLOG:
                    self.unsubscribe(subscription)
                    subscription.mailbox.put(Lagging(stream))
                    break
                subscription.mailbox.put((entry_id, fields))
                subscription.last_id, subscription.position = entry_id, key
                delivered += 1
        return delivered

    def _fail_all(self, exc: BaseException) -> None:
        subscriptions = [s for group in self._subscriptions.values() for s in group]
        self._subscriptions.clear()
        self._pieces.clear()
        for subscription in subscriptions:
            subscription.mailbox.put(exc)

    async def _close_reader(self) -> None:
        reader, self._reader, self._reader_id = self._reader, None, None
        if reader is not None:
            with contextlib.suppress(RedisError, OSError):
                await reader.aclose()


def _bulk(text: str) -> bytes:
    """One argument of a command in Redis' protocol (RESP)."""
    data = text.encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


XREAD_HEAD = ("XREAD", "COUNT", str(READ_BATCH), "BLOCK", str(BLOCK_MS), "STREAMS")
XREAD_PACKED = b"".join(_bulk(part) for part in XREAD_HEAD)


def _fields(values: list[str] | None) -> dict[str, str]:
    """An entry's [field, value, ...] as a dict; an entry deleted since (XDEL) has none."""
    return dict(zip(values[::2], values[1::2], strict=True)) if values else {}


def _entries(reply: Any) -> Any:
    """(stream, [(entry id, [field, value, ...]), ...]) for each stream of an XREAD reply:
    a map under RESP3, a list of pairs under RESP2, None when the read timed out."""
    if not reply:
        return ()
    return reply.items() if isinstance(reply, dict) else reply


class ClusterStreamHub:
    """The hub of an event loop on a Redis Cluster: a lane per slot tailed (see the module's
    docstring), and the cluster client for the responses' other commands."""

    def __init__(self) -> None:
        self._lanes: dict[int, StreamHub] = {}
        self._lane_of: weakref.WeakKeyDictionary[Subscription, StreamHub] = (
            weakref.WeakKeyDictionary()
        )
        self._commands: AsyncRedis | None = None

    @property
    def commands(self) -> AsyncRedis:
        """The loop's cluster client, shared by its responses (closing it closes nothing)."""
        if self._commands is None:
            self._commands = shared_async_redis()
        return self._commands

    def streams(self) -> int:
        return sum(lane.streams() for lane in self._lanes.values())

    async def subscribe(self, stream: str, last_id: str) -> Subscription:
        """As `StreamHub.subscribe`, in the lane of the stream's slot."""
        cluster = cast(AsyncRedisCluster, self.commands)
        try:
            await cluster.initialize()  # the slots' map, once
        except RedisClusterException as exc:  # no node answers: an outage, as a plain one's
            raise RedisConnectionError(str(exc)) from exc
        slot = key_slot(stream.encode())
        serving = cluster.nodes_manager.get_node_from_slot(slot)
        node = (str(serving.host), int(serving.port))
        lane = self._lanes.get(slot)
        if lane is None or lane.node != node:
            # A lane on a node that no longer serves the slot ends with its failed read.
            lane = self._lanes[slot] = StreamHub(node)
        subscription = await lane.subscribe(stream, last_id)
        self._lane_of[subscription] = lane
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        lane = self._lane_of.pop(subscription, None)
        if lane is not None:
            lane.unsubscribe(subscription)


Hub = StreamHub | ClusterStreamHub

_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Hub] = weakref.WeakKeyDictionary()


def hub() -> Hub:
    """The running event loop's hub."""
    loop = asyncio.get_running_loop()
    found = _hubs.get(loop)
    if found is None:
        found = _hubs[loop] = ClusterStreamHub() if cluster_mode() else StreamHub()
    return found


async def stream_entries(subscription: Subscription, *, idle_seconds: float) -> Any:
    """The subscription's entries as they come, None after each `idle_seconds` without one;
    raises what ended it (a Redis error, `Lagging`)."""
    mailbox = subscription.mailbox
    while True:
        if not await mailbox.wait(idle_seconds):
            yield None
            continue
        item = mailbox.pop()
        if isinstance(item, BaseException):
            raise item
        yield item
