"""The multiplexed reader: one connection reads every tailed stream, each subscriber gets
exactly the entries after its own position, a new stream is read at once, and a subscriber
far behind is let go rather than held in memory. The streams share a hash tag, as the
service's streams share theirs: on a Redis Cluster (`--redis-cluster`) one reader serves them."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis as AsyncRedis

from chatsite import sse, stream_hub
from chatsite.redis import async_redis, node_redis
from chatsite.stream_events import StreamEvent, entry_fields
from chatsite.testing import budget, wait_for


@pytest.fixture
async def redis() -> AsyncIterator[AsyncRedis]:
    client = async_redis()
    yield client
    await client.aclose()


async def add(redis: AsyncRedis, stream: str, text: str) -> str:
    return str(await redis.xadd(stream, entry_fields(StreamEvent.DELTA, {"text": text})))


async def texts(entries: Any, count: int) -> list[str]:
    got: list[str] = []
    while len(got) < count:
        entry = await asyncio.wait_for(anext(entries), timeout=budget(30))
        if entry is not None:
            got.append(entry.payload()["text"])
    return got


def own_ports() -> set[int]:
    """The local ports of this process's TCP sockets (Linux's /proc)."""
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


async def connections(redis: AsyncRedis) -> int:
    """This process's connections to Redis: other processes (a live edge, another run) share
    the server and open and close theirs meanwhile."""
    ports = own_ports()
    return sum(1 for c in await redis.client_list() if int(c["addr"].rsplit(":", 1)[1]) in ports)


def reading_hub() -> stream_hub.StreamHub:
    """What reads the `{hub}` streams: the hub, or on a cluster its one lane."""
    found = stream_hub.hub()
    if isinstance(found, stream_hub.ClusterStreamHub):
        (lane,) = found._lanes.values()
        return lane
    return found


@contextlib.asynccontextmanager
async def reader_node(redis: AsyncRedis) -> AsyncIterator[AsyncRedis]:
    """A client of the node the `{hub}` streams are read from (`redis` itself off a cluster)."""
    node = reading_hub().node
    if node is None:
        yield redis
        return
    client = node_redis(*node)
    try:
        yield client
    finally:
        await client.aclose()


async def client_ids(redis: AsyncRedis) -> set[str]:
    async with reader_node(redis) as node:
        return {str(c["id"]) for c in await node.client_list()}


def reads_block_until_woken(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the hub's XREAD wait for as long as nothing interrupts it (`BLOCK 0`), and its
    socket as long: only an entry or a wake ends it, never the machine being slow."""
    head = list(stream_hub.XREAD_HEAD)
    head[head.index("BLOCK") + 1] = "0"
    monkeypatch.setattr(stream_hub, "XREAD_PACKED", b"".join(stream_hub._bulk(p) for p in head))
    monkeypatch.setattr(stream_hub, "BLOCK_MS", 3_600_000)  # the socket's timeout


async def reading(redis: AsyncRedis, positions: dict[str, str]) -> bool:
    """Whether the hub's reader is blocked in Redis in an XREAD of exactly these streams, each
    from the given position."""
    try:
        hub = reading_hub()
    except ValueError:  # a cluster hub without its lane yet
        return False
    pieces = {stream: piece[1] for stream, piece in hub._pieces.items()}
    if not hub._blocked or hub._reader_id is None or pieces != positions:
        return False
    async with reader_node(redis) as node:
        for client in await node.client_list():
            if str(client["id"]) == str(hub._reader_id):
                return client["cmd"] == "xread" and "b" in client["flags"]
    return False


async def run_ended() -> bool:
    """Whether the hub's read loop has ended (nobody tails a stream), its reader kept."""
    task = reading_hub()._task
    return task is not None and task.done()


async def test_many_streams_share_one_reading_connection(redis: AsyncRedis) -> None:
    await add(redis, "{hub}:warm", "w")
    warm = sse.read("{hub}:warm", "0-0", until=())
    assert await texts(warm, 1) == ["w"]
    before = await connections(redis)
    readers = [sse.read(f"{{hub}}:{index}", "0-0", until=()) for index in range(50)]
    waiting = [asyncio.ensure_future(texts(reader, 1)) for reader in readers]

    async def all_subscribed() -> bool:
        return stream_hub.hub().streams() == 51

    await wait_for(all_subscribed, what="the 50 readers subscribed")
    for index in range(50):
        await add(redis, f"{{hub}}:{index}", str(index))
    done = await asyncio.wait_for(asyncio.gather(*waiting), timeout=budget(60))
    assert done == [[str(index)] for index in range(50)]
    # The hub's reader and its command pool, not a connection per stream.
    assert await connections(redis) - before <= 2
    assert stream_hub.hub().streams() == 51
    for reader in [*readers, warm]:
        await reader.aclose()
    assert stream_hub.hub().streams() == 0


async def test_a_new_stream_is_read_without_waiting_out_the_current_read(
    redis: AsyncRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A read that nothing interrupts never ends; the new subscription cuts it short.
    reads_block_until_woken(monkeypatch)
    first = sse.read("{hub}:first", "0-0", until=())
    pending = asyncio.ensure_future(anext(first))
    await wait_for(
        lambda: reading(redis, {"{hub}:first": "0-0"}), what="the hub blocked on hub:first only"
    )
    await add(redis, "{hub}:second", "now")
    second = sse.read("{hub}:second", "0-0", until=())
    assert await texts(second, 1) == ["now"]
    pending.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await pending
    await first.aclose()
    await second.aclose()


async def test_subscribers_of_one_stream_each_get_what_follows_their_position(
    redis: AsyncRedis,
) -> None:
    a = await add(redis, "{hub}:shared", "a")
    await add(redis, "{hub}:shared", "b")
    ahead = sse.read("{hub}:shared", a, until=())
    assert await texts(ahead, 1) == ["b"]
    behind = sse.read("{hub}:shared", "0-0", until=())
    assert await texts(behind, 2) == ["a", "b"]
    await add(redis, "{hub}:shared", "c")
    assert await texts(ahead, 1) == ["c"]
    assert await texts(behind, 1) == ["c"]
    await ahead.aclose()
    await behind.aclose()


async def test_a_subscriber_far_behind_is_let_go(
    redis: AsyncRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stream_hub, "MAX_BACKLOG", 3)
    for index in range(10):
        await add(redis, "{hub}:fast", str(index))
    subscription = await stream_hub.hub().subscribe("{hub}:fast", "0-0")
    entries = stream_hub.stream_entries(subscription, idle_seconds=5)
    with pytest.raises(stream_hub.Lagging):
        async for _ in entries:
            pass
    assert stream_hub.hub().streams() == 0


async def test_a_subscription_made_while_the_last_reader_closes_is_read(
    redis: AsyncRedis,
) -> None:
    await add(redis, "{hub}:once", "x")
    once = sse.read("{hub}:once", "0-0", until=())
    assert await texts(once, 1) == ["x"]
    await once.aclose()  # the hub has nobody left and winds down
    await add(redis, "{hub}:again", "y")
    again = sse.read("{hub}:again", "0-0", until=())
    assert await texts(again, 1) == ["y"]
    await again.aclose()


async def test_a_subscriber_from_further_back_misses_nothing_the_current_read_returns(
    redis: AsyncRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def no_wake(self: stream_hub.StreamHub) -> None:
        return None

    # The current read is not cut short (nor ends by itself): it returns entry 5, read from
    # after entry 4, while the resumed subscriber still needs 2, 3 and 4 first.
    monkeypatch.setattr(stream_hub.StreamHub, "_wake", no_wake)
    reads_block_until_woken(monkeypatch)
    ids = [await add(redis, "{hub}:resume", str(index)) for index in range(5)]
    live = sse.read("{hub}:resume", ids[-1], until=())
    pending = asyncio.ensure_future(texts(live, 1))
    await wait_for(
        lambda: reading(redis, {"{hub}:resume": ids[-1]}), what="the hub reading after entry 4"
    )
    # A client comes back from entry 1 while that read waits, then entry 5 arrives.
    resumed = sse.read("{hub}:resume", ids[1], until=())
    first = asyncio.ensure_future(texts(resumed, 4))

    async def both_subscribed() -> bool:
        return len(reading_hub()._subscriptions.get("{hub}:resume", ())) == 2

    await wait_for(both_subscribed, what="the resumed client subscribed")
    await add(redis, "{hub}:resume", "5")
    assert await asyncio.wait_for(first, timeout=budget(30)) == ["2", "3", "4", "5"]
    assert await asyncio.wait_for(pending, timeout=budget(30)) == ["5"]
    await live.aclose()
    await resumed.aclose()


async def test_the_reader_outlives_its_last_stream_and_reads_the_next(
    redis: AsyncRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Kept however long the test takes to look (30 s in production).
    monkeypatch.setattr(stream_hub, "READER_LINGER_SECONDS", 3600.0)
    await add(redis, "{hub}:before", "x")
    before = sse.read("{hub}:before", "0-0", until=())
    assert await texts(before, 1) == ["x"]
    reader_id = reading_hub()._reader_id
    await before.aclose()
    # The hub has nobody left: its run ends (at the end of the read under way), the
    # connection stays.
    await wait_for(run_ended, what="the hub's run ended")
    assert reader_id is not None and reading_hub()._reader_id == reader_id
    assert str(reader_id) in await client_ids(redis)
    await add(redis, "{hub}:after", "y")
    after = sse.read("{hub}:after", "0-0", until=())
    assert await texts(after, 1) == ["y"]
    assert reading_hub()._reader_id == reader_id
    await after.aclose()


async def test_a_kept_reader_closed_meanwhile_is_replaced_and_nothing_is_lost(
    redis: AsyncRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stream_hub, "READER_LINGER_SECONDS", 3600.0)
    await add(redis, "{hub}:first", "x")
    first = sse.read("{hub}:first", "0-0", until=())
    assert await texts(first, 1) == ["x"]
    await first.aclose()
    await wait_for(run_ended, what="the hub's run ended")  # the reader is kept, idle
    reader_id = reading_hub()._reader_id
    assert reader_id is not None
    async with reader_node(redis) as node:  # as a restarted Redis or a proxy would
        await node.client_kill_filter(_id=str(reader_id))
    await add(redis, "{hub}:second", "y")
    second = sse.read("{hub}:second", "0-0", until=())
    assert await texts(second, 1) == ["y"]  # no error reached the subscriber
    assert reading_hub()._reader_id not in (None, reader_id)
    await second.aclose()


async def test_an_idle_reader_is_closed_after_a_while(
    redis: AsyncRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stream_hub, "READER_LINGER_SECONDS", 0.2)
    await add(redis, "{hub}:brief", "x")
    brief = sse.read("{hub}:brief", "0-0", until=())
    assert await texts(brief, 1) == ["x"]
    reader_id = reading_hub()._reader_id
    assert reader_id is not None
    await brief.aclose()

    async def closed() -> bool:
        return reading_hub()._reader_id is None and str(reader_id) not in await client_ids(redis)

    # Its run ends with the read under way, then 0.2 s later the reader goes.
    await wait_for(closed, what="the idle reader closed")


async def test_a_mailbox_hands_on_entries_in_order_and_times_out_when_idle() -> None:
    mailbox = stream_hub.Mailbox()
    # Nothing is ever put: it times out, however long 0.01 s takes here.
    assert not await mailbox.wait(0.01)  # nothing came: the caller sends a heartbeat
    assert len(mailbox) == 0

    # Waits of an hour: only the put ends them within the budget, not their timeout.
    waiting = asyncio.ensure_future(mailbox.wait(3600))
    await asyncio.sleep(0)  # one turn of the loop (no time): the task parks on the mailbox
    assert mailbox._waiter is not None
    mailbox.put(("1-1", {"event": "delta"}))
    mailbox.put(("1-2", {"event": "done"}))
    assert await asyncio.wait_for(waiting, timeout=budget(30))  # woken, not at its timeout
    assert [mailbox.pop(), mailbox.pop()] == [
        ("1-1", {"event": "delta"}),
        ("1-2", {"event": "done"}),
    ]
    with pytest.raises(IndexError):
        mailbox.pop()

    # A reader cancelled while it waits leaves nothing behind; the next one is woken.
    cancelled = asyncio.ensure_future(mailbox.wait(3600))
    await asyncio.sleep(0)
    cancelled.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await cancelled
    later = asyncio.ensure_future(mailbox.wait(3600))
    await asyncio.sleep(0)
    assert mailbox._waiter is not None
    mailbox.put(("1-3", {"event": "delta"}))
    assert await asyncio.wait_for(later, timeout=budget(30))
    assert mailbox.pop() == ("1-3", {"event": "delta"})
