"""Redis standing still or going away mid-answer: no answer fails.

A Redis server of the test's own (the suite's is shared by every test), paused with
`CLIENT PAUSE` as a failover pauses clients, or killed and started again on its append-only
file. The scheduler keeps reading from the workers, holds the events, and appends them in
order when Redis answers again.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from redis import Redis

from accounts.tests.factories import UserFactory
from chatsite import redis as chatsite_redis
from chatsite.testing import budget, wait_until
from inference import queue
from inference.models import Generation

from .fake_worker import FakeWorker
from .fixtures import finished, register_pool, running_schedulers, send_turn, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


class RedisServer:
    """A redis-server process on a free port, with an append-only file in `folder`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary is not None, "redis-server is not installed"
        self.process = subprocess.Popen(  # noqa: S603 (our own command line)
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.folder),
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ],
            stdout=(self.folder / "redis.log").open("ab"),
            stderr=subprocess.STDOUT,
        )
        wait_until(self._answers, within=30, what="the Redis server answering")

    def _answers(self) -> bool:
        try:
            return bool(Redis(port=self.port, socket_timeout=budget(5)).ping())
        except Exception:
            return False

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def client(self) -> Redis:
        return Redis(port=self.port, decode_responses=True)


@pytest.fixture
def own_redis(tmp_path: Path, settings: Any) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    settings.REDIS_URL = server.url
    # Django's cache too (moderation's thresholds, the rate limits): one Redis, as deployed.
    settings.CACHES = {
        "default": {**settings.CACHES["default"], "LOCATION": server.url},
    }
    chatsite_redis._pooled.cache_clear()
    yield server
    chatsite_redis._pooled.cache_clear()
    if server.process is not None and server.process.poll() is None:
        server.kill()


TOKENS = 40


async def _answers(fake_workers: Any, count: int) -> tuple[FakeWorker, list[str]]:
    fake = fake_workers(tokens=TOKENS, token_delay=0.1)
    await sync_to_async(register_pool)(fake)
    users = [await sync_to_async(UserFactory)() for _ in range(count)]
    turns = [await sync_to_async(send_turn)(who) for who in users]
    return fake, [str(turn.generation.id) for turn in turns]


def _events(server: RedisServer, gid: str) -> list[tuple[str, str]]:
    entries: Any = server.client().xrange(queue.stream_key(gid))
    return [(fields["event"], fields["data"]) for _, fields in entries]


async def _wait_mid_answer(server: RedisServer, ids: list[str]) -> None:
    async def all_mid_answer() -> bool:
        return all(
            [
                any(name == "delta" for name, _ in await sync_to_async(_events)(server, g))
                for g in ids
            ]
        )

    await wait_for(all_mid_answer)


async def _assert_whole(server: RedisServer, ids: list[str]) -> None:
    answer = "".join(f"tok{i} " for i in range(TOKENS))
    for gid in ids:
        generation = await Generation.objects.select_related("message").aget(pk=gid)
        assert generation.status == Generation.Status.COMPLETE, (gid, generation.error_message)
        assert generation.message.content == answer
        events = await sync_to_async(_events)(server, gid)
        names = [name for name, _ in events]
        assert names[-1] == "done" and "error" not in names and "restart" not in names
        streamed = "".join(json.loads(data)["text"] for name, data in events if name == "delta")
        assert streamed == answer  # every piece once, in order


async def test_a_paused_redis_fails_no_answer(
    db: Any, fake_workers: Any, own_redis: RedisServer
) -> None:
    _, ids = await _answers(fake_workers, 4)
    async with running_schedulers():
        await _wait_mid_answer(own_redis, ids)
        # Redis's own pause, as a failover's; the answers (under 4 s to go) go on reading
        # meanwhile, and the scheduler's outage limit (30 s) is far off.
        own_redis.client().execute_command("CLIENT", "PAUSE", "8000", "ALL")
        await wait_for(lambda: _all_finished(ids))
    await _assert_whole(own_redis, ids)


async def test_a_restarted_redis_fails_no_answer(
    db: Any, fake_workers: Any, own_redis: RedisServer
) -> None:
    fake, ids = await _answers(fake_workers, 4)
    async with running_schedulers():
        await _wait_mid_answer(own_redis, ids)
        own_redis.kill()

        # The answers end while Redis is away: the worker has sent every one of them whole.
        async def all_sent() -> bool:
            return len(fake.requests) == len(ids) and fake.running == 0

        await wait_for(all_sent, what="the worker done with every answer")
        own_redis.start()
        await wait_for(lambda: _all_finished(ids))
    await _assert_whole(own_redis, ids)


async def _all_finished(ids: list[str]) -> bool:
    return all([await finished(gid) for gid in ids])
