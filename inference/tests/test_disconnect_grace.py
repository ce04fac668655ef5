"""Disconnects before the first token: a client that drops while its answer waits in the queue
or on a worker gets `STREAM_FIRST_TOKEN_GRACE_SECONDS` to come back before the answer is
cancelled; Stop cancels at once; a page going away says so with a beacon, which stops a closed
tab's answer at once and leaves a reloaded page's its grace. Served by a real
edge process, with a real scheduler in this process and stand-in workers."""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.test import Client

from accounts.tests.factories import UserFactory
from billing import quota
from chatsite.testing import budget
from inference import queue
from inference.models import Generation, ModelPool, Worker

from .fake_worker import FakeWorker
from .fixtures import (
    LiveEdge,
    finished,
    housekeeping_past,
    register_pool,
    running_schedulers,
    send,
    send_turn,
    stream_events,
    unwatched_since,
    wait_for,
    watchers,
)
from .test_stream import Event, bearer, collect, read_events, read_until, stream_url

pytestmark = pytest.mark.django_db(transaction=True)


def running(event: Event) -> bool:
    return event.event == "meta" and (event.data or {}).get("status") == "running"


def last_id(events: list[Event]) -> str:
    return str([e.id for e in events if e.id][-1])


async def add_worker(pool: ModelPool, fake: FakeWorker, *, max_concurrency: int = 256) -> None:
    await Worker.objects.acreate(
        pool=pool,
        name=f"fake-{fake.url.rsplit(':', 1)[-1]}",
        url=fake.url,
        state=Worker.State.HEALTHY,
        max_concurrency=max_concurrency,
    )


def cancel_url(stream: str) -> str:
    return stream.removesuffix("/stream") + "/cancel"


def aborted(fake: FakeWorker) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return fake.aborted == 1

    return check


async def started(generation_id: Any) -> bool:
    """Whether the generation's stream says it runs on a worker."""
    events = await sync_to_async(stream_events)(generation_id)
    return any(name == "meta" and data.get("status") == "running" for name, data in events)


async def streaming(generation_id: Any) -> bool:
    """Whether the generation's stream carries text."""
    events = await sync_to_async(stream_events)(generation_id)
    return any(name == "delta" for name, _ in events)


def in_use(user: User) -> int:
    """The user's answers holding a concurrency slot of their plan (queued or streaming)."""
    return quota.concurrency_in_use(user_id=user.pk, now=quota.now_ms())


def reading(generation_id: Any, count: int) -> Callable[[], Awaitable[bool]]:
    """Whether the edge has noted `count` clients reading the generation's stream."""

    async def check() -> bool:
        return await watchers(generation_id) == count

    return check


# The grace a test's client comes back within: one or two local requests take far less, on
# a slow machine too. Whether the answer outlived it is not judged by sleeping through it:
# the test waits for housekeeping's first look past it (`housekeeping_past`).
BACK_WITHIN = 3.0


# Coming back in time


async def test_a_queued_answer_whose_client_comes_back_in_time_is_answered(
    user: User,
    fake_workers: Any,
    live_edge: LiveEdge,
    settings: Any,
    housekeeping_passes: list[int],
) -> None:
    settings.STREAM_FIRST_TOKEN_GRACE_SECONDS = BACK_WITHIN
    pool = await sync_to_async(register_pool)()  # no worker yet: the answer waits in line
    turn = await send(user)
    headers = await sync_to_async(bearer)(user)
    url = stream_url(live_edge, turn.generation.id)
    async with running_schedulers():
        first = await collect(url, headers, until="meta")
        since = await unwatched_since(turn.generation.id)
        back = asyncio.create_task(collect(url, {**headers, "Last-Event-ID": last_id(first)}))
        try:
            await wait_for(reading(turn.generation.id, 1), what="the client back")
            # Left alone, it would have been cancelled by now (housekeeping's look past the
            # grace).
            await housekeeping_past(housekeeping_passes, since + int(BACK_WITHIN * 1000))
            assert not await finished(turn.generation.id)
            await add_worker(pool, fake_workers(tokens=5))
            rest = await asyncio.wait_for(back, timeout=budget(60))
        finally:
            back.cancel()
            await asyncio.gather(back, return_exceptions=True)
    generation = await Generation.objects.select_related("message").aget(pk=turn.generation.id)
    assert generation.status == Generation.Status.COMPLETE
    assert rest[-1].event == "done"
    assert generation.message.content == "tok0 tok1 tok2 tok3 tok4 "


async def test_an_answer_on_a_worker_whose_client_comes_back_before_its_first_token_completes(
    user: User,
    fake_workers: Any,
    live_edge: LiveEdge,
    settings: Any,
    housekeeping_passes: list[int],
) -> None:
    settings.STREAM_FIRST_TOKEN_GRACE_SECONDS = BACK_WITHIN
    # The worker holds the first token until the grace is past (`release`).
    fake = fake_workers(tokens=5, first_token_delay=3600)
    await sync_to_async(register_pool)(fake)
    turn = await send(user)
    headers = await sync_to_async(bearer)(user)
    url = stream_url(live_edge, turn.generation.id)
    async with running_schedulers():
        first, _ = await read_until(url, headers, running)
        since = await unwatched_since(turn.generation.id)
        back = asyncio.create_task(collect(url, {**headers, "Last-Event-ID": last_id(first)}))
        try:
            await wait_for(reading(turn.generation.id, 1), what="the client back")
            await housekeeping_past(housekeeping_passes, since + int(BACK_WITHIN * 1000))
            assert not await finished(turn.generation.id)
            fake.release()
            rest = await asyncio.wait_for(back, timeout=budget(60))
        finally:
            back.cancel()
            await asyncio.gather(back, return_exceptions=True)
    generation = await Generation.objects.select_related("message").aget(pk=turn.generation.id)
    assert generation.status == Generation.Status.COMPLETE
    assert fake.aborted == 0
    text = "".join(e.data["text"] for e in rest if e.event == "delta" and e.data)
    assert text == generation.message.content == "tok0 tok1 tok2 tok3 tok4 "


# Nobody comes back


async def test_a_queued_answer_nobody_comes_back_for_is_cancelled_after_the_grace(
    user: User, live_edge: LiveEdge, settings: Any
) -> None:
    settings.STREAM_FIRST_TOKEN_GRACE_SECONDS = 1.0
    pool = await sync_to_async(register_pool)()  # no worker: it would wait in line
    turn = await send(user)
    headers = await sync_to_async(bearer)(user)
    assert await sync_to_async(in_use)(user) == 1
    async with running_schedulers():
        _, left_at = await read_until(
            stream_url(live_edge, turn.generation.id), headers, lambda e: e.event == "meta"
        )
        await wait_for(lambda: finished(turn.generation.id))
    generation = await Generation.objects.aget(pk=turn.generation.id)
    assert generation.status == Generation.Status.CANCELLED
    assert generation.finished_at is not None
    assert generation.finished_at.timestamp() >= left_at + 1.0, "cancelled before the grace"
    redis = queue.async_redis()
    assert await redis.zcard(queue.queue_key(pool.name, turn.generation.tier)) == 0
    assert await redis.zcard(queue.detached_key()) == 0
    events = [name for name, _ in await sync_to_async(stream_events)(turn.generation.id)]
    assert events[-1] == "done"
    # Its place in the plan's concurrency is given back, as a Stop's is.
    assert await sync_to_async(in_use)(user) == 0


async def test_an_answer_on_a_worker_left_before_its_first_token_is_aborted_after_the_grace(
    user: User, fake_workers: Any, live_edge: LiveEdge, settings: Any
) -> None:
    settings.STREAM_FIRST_TOKEN_GRACE_SECONDS = 1.0
    settings.STREAM_GRACE_SECONDS = 3600  # the first token comes meanwhile: still the short one
    # The first token is held until the edge has noted the client gone (`release`).
    fake = fake_workers(tokens=2000, token_delay=0.01, first_token_delay=3600)
    await sync_to_async(register_pool)(fake)
    turn = await send(user)
    headers = await sync_to_async(bearer)(user)
    async with running_schedulers():
        _, left_at = await read_until(stream_url(live_edge, turn.generation.id), headers, running)
        await unwatched_since(turn.generation.id)
        fake.release()
        await wait_for(lambda: finished(turn.generation.id))
        # The worker's request was closed (vLLM aborts it).
        await wait_for(aborted(fake))
    generation = await Generation.objects.aget(pk=turn.generation.id)
    assert generation.status == Generation.Status.CANCELLED
    assert generation.finished_at is not None
    assert generation.finished_at.timestamp() >= left_at + 1.0, "cancelled before the grace"
    assert await sync_to_async(in_use)(user) == 0


# Stop, and a page that goes away


async def test_stop_cancels_at_once_within_the_grace(
    user: User, fake_workers: Any, live_edge: LiveEdge, settings: Any
) -> None:
    # Graces, and a first token (released when the worker stops), that never come within
    # the test: only the Stop can end the answer.
    settings.STREAM_FIRST_TOKEN_GRACE_SECONDS = 3600.0
    settings.STREAM_GRACE_SECONDS = 3600
    fake = fake_workers(tokens=5, first_token_delay=3600)
    pool = await sync_to_async(register_pool)()
    waiting = await send(user)
    headers = await sync_to_async(bearer)(user)
    client = httpx.AsyncClient(base_url=live_edge.url, headers=headers, timeout=budget(30))
    async with client:
        # Queued, its client gone a moment ago: Stop takes it out of line there and then.
        await collect(stream_url(live_edge, waiting.generation.id), headers, until="meta")
        stopped = await client.post(f"/api/v1/generations/{waiting.generation.id}/cancel")
        assert stopped.status_code == 200
        assert stopped.json()["status"] == Generation.Status.CANCELLED

        await add_worker(pool, fake)
        turn = await send(user)
        async with running_schedulers():
            watching = asyncio.create_task(
                collect(stream_url(live_edge, turn.generation.id), headers)
            )
            try:
                await wait_for(lambda: started(turn.generation.id))
                stopped = await client.post(f"/api/v1/generations/{turn.generation.id}/cancel")
                assert stopped.status_code == 200
                # Long before either grace, and with its client still reading.
                events = await asyncio.wait_for(watching, timeout=budget(60))
            finally:
                watching.cancel()
                await asyncio.gather(watching, return_exceptions=True)
    assert events[-1].event == "done"
    assert events[-1].data is not None and events[-1].data["status"] == "cancelled"
    assert await sync_to_async(in_use)(user) == 0


async def test_a_closing_page_stops_its_answer_at_once(
    user: User, fake_workers: Any, live_edge: LiveEdge, settings: Any
) -> None:
    # Graces far longer than the test: only the beacon itself may stop the answer.
    settings.STREAM_FIRST_TOKEN_GRACE_SECONDS = 3600
    settings.STREAM_GRACE_SECONDS = 3600
    fake = fake_workers(tokens=2000, token_delay=0.01)
    await sync_to_async(register_pool)(fake)
    turn = await send(user)
    headers = await sync_to_async(bearer)(user)
    url = stream_url(live_edge, turn.generation.id)
    async with running_schedulers(), httpx.AsyncClient(timeout=budget(30)) as client:
        # As a closing tab does: the beacon while the page still reads the stream, then the
        # stream closes with the page.
        watching = asyncio.create_task(collect(f"{url}?page=closing", headers))
        try:
            await wait_for(lambda: streaming(turn.generation.id))
            left = await client.post(
                cancel_url(url), headers=headers, data={"leaving": "1", "page": "closing"}
            )
            assert left.status_code == 200
            await wait_for(lambda: finished(turn.generation.id))
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
        await wait_for(aborted(fake))
    generation = await Generation.objects.select_related("message").aget(pk=turn.generation.id)
    assert generation.status == Generation.Status.CANCELLED
    assert generation.message.content.startswith("tok0 ")


async def test_a_closing_page_takes_its_queued_answer_out_of_line_at_once(
    user: User, live_edge: LiveEdge, settings: Any
) -> None:
    settings.STREAM_FIRST_TOKEN_GRACE_SECONDS = 3600
    await sync_to_async(register_pool)()  # no worker: the answer waits in line
    turn = await send(user)
    headers = await sync_to_async(bearer)(user)
    url = stream_url(live_edge, turn.generation.id)
    # The page's stream closed first (a tab going away closes its connections in any order).
    await collect(f"{url}?page=closing", headers, until="meta")
    async with httpx.AsyncClient(timeout=budget(30)) as client:
        left = await client.post(
            cancel_url(url), headers=headers, data={"leaving": "1", "page": "closing"}
        )
    assert left.status_code == 200
    assert left.json()["status"] == "cancelled"
    assert await sync_to_async(in_use)(user) == 0


async def test_a_reloaded_page_keeps_its_answer(
    user: User,
    fake_workers: Any,
    live_edge: LiveEdge,
    settings: Any,
    housekeeping_passes: list[int],
) -> None:
    settings.STREAM_FIRST_TOKEN_GRACE_SECONDS = BACK_WITHIN
    settings.SCHEDULER_STALL_SECONDS = 3600  # the worker pauses for as long as the test needs
    # The answer pauses after its third token until the grace is past: still running when
    # housekeeping would have cancelled it.
    fake = fake_workers(tokens=150, token_delay=0.02, pause_trigger="Hello")
    await sync_to_async(register_pool)(fake)
    turn = await send(user)
    headers = await sync_to_async(bearer)(user)
    url = stream_url(live_edge, turn.generation.id)
    async with running_schedulers(), httpx.AsyncClient(timeout=budget(30)) as client:
        first = await collect(f"{url}?page=old", headers, until="delta")
        # A reload: the browser asks for the new page, then the old one sends its beacon.
        cookies = await sync_to_async(session_cookies)(user)
        async with httpx.AsyncClient(timeout=budget(30), cookies=cookies) as browser:
            assert (await browser.get(f"{live_edge.url}/")).status_code == 200
        left = await client.post(
            cancel_url(url), headers=headers, data={"leaving": "1", "page": "old"}
        )
        assert left.status_code == 200
        since = await unwatched_since(turn.generation.id)
        # The reloaded page opens the stream again where it was.
        new = asyncio.create_task(
            collect(f"{url}?page=new", {**headers, "Last-Event-ID": last_id(first)})
        )
        try:
            await wait_for(reading(turn.generation.id, 1), what="the reloaded page reading")
            await housekeeping_past(housekeeping_passes, since + int(BACK_WITHIN * 1000))
            assert not await finished(turn.generation.id)
            fake.resume.set()
            rest = await asyncio.wait_for(new, timeout=budget(60))
        finally:
            new.cancel()
            await asyncio.gather(new, return_exceptions=True)
    assert rest[-1].data is not None and rest[-1].data["status"] == "complete"
    text = "".join(e.data["text"] for e in first + rest if e.event == "delta" and e.data)
    assert text == "".join(f"tok{i} " for i in range(150))


async def test_a_page_going_away_leaves_the_answer_to_another_tab_still_reading(
    user: User,
    fake_workers: Any,
    live_edge: LiveEdge,
    settings: Any,
    housekeeping_passes: list[int],
) -> None:
    settings.STREAM_FIRST_TOKEN_GRACE_SECONDS = 1.0
    settings.SCHEDULER_STALL_SECONDS = 3600  # the worker pauses for as long as the test needs
    # The answer pauses after its third token until the grace is past: still running when
    # housekeeping would have cancelled it.
    fake = fake_workers(tokens=150, token_delay=0.02, pause_trigger="Hello")
    await sync_to_async(register_pool)(fake)
    turn = await send(user)
    headers = await sync_to_async(bearer)(user)
    url = stream_url(live_edge, turn.generation.id)
    async with running_schedulers(), httpx.AsyncClient(timeout=budget(30)) as client:
        staying = asyncio.create_task(collect(f"{url}?page=staying", headers))
        try:
            # The other tab reads before this one goes away.
            await wait_for(reading(turn.generation.id, 1), what="the staying tab reading")
            await collect(f"{url}?page=closing", headers, until="delta")
            left = await client.post(
                cancel_url(url), headers=headers, data={"leaving": "1", "page": "closing"}
            )
            assert left.status_code == 200
            await wait_for(reading(turn.generation.id, 1), what="the closing tab's stream gone")
            gone = queue.now_ms()
            # Past the short grace, the other tab still holds the answer.
            await housekeeping_past(housekeeping_passes, gone + 1 * 1000)  # the grace
            assert not await finished(turn.generation.id)
            fake.resume.set()
            full = await asyncio.wait_for(staying, timeout=budget(60))
        finally:
            staying.cancel()
            await asyncio.gather(staying, return_exceptions=True)
    assert full[-1].data is not None and full[-1].data["status"] == "complete"
    text = "".join(e.data["text"] for e in full if e.event == "delta" and e.data)
    assert text == "".join(f"tok{i} " for i in range(150))


async def test_a_stream_with_a_malformed_page_id_is_refused(
    user: User, live_edge: LiveEdge
) -> None:
    await sync_to_async(register_pool)()
    turn = await send(user)
    headers = await sync_to_async(bearer)(user)
    url = stream_url(live_edge, turn.generation.id)
    async with httpx.AsyncClient(timeout=budget(30)) as client:
        refused = await client.get(f"{url}?page=no%20spaces", headers=headers)
        beacon = await client.post(
            cancel_url(url), headers=headers, data={"leaving": "1", "page": "a/b"}
        )
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "invalid_page_id"
    assert beacon.status_code == 400
    assert (await Generation.objects.aget(pk=turn.generation.id)).status == "queued"


def session_cookies(user: User) -> dict[str, str]:
    """A logged-in browser's cookies for `user` (the session is in the shared database)."""
    browser = Client()
    browser.force_login(user)
    return {name: morsel.value for name, morsel in browser.cookies.items()}


def test_the_beacon_is_a_form_post_with_the_csrf_token_in_its_body(user: User) -> None:
    register_pool()  # no worker: the answer waits
    turn = send_turn(user)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(user)
    assert browser.get("/").status_code == 200
    token = browser.cookies["csrftoken"].value
    url = f"/api/v1/generations/{turn.generation.id}/cancel"

    def beacon(body: str) -> Any:
        """What `navigator.sendBeacon(url, new URLSearchParams(...))` sends: a same-origin
        form POST with the session cookie and no custom header."""
        return browser.post(
            url,
            body,
            content_type="application/x-www-form-urlencoded;charset=UTF-8",
            headers={"Origin": "http://testserver"},
        )

    job = queue.job_key(turn.generation.id)
    redis = queue.sync_redis()

    refused = beacon("leaving=1")
    assert refused.status_code == 403
    assert "CSRF" in refused.json()["error"]["message"], refused.json()
    assert not redis.hexists(job, "leaving")

    accepted = beacon(f"csrfmiddlewaretoken={token}&leaving=1")
    assert accepted.status_code == 200, accepted.content
    assert accepted.json()["status"] == Generation.Status.QUEUED
    assert redis.hget(job, "leaving") == "1"
    # Nobody watches it: its unwatched spell starts now, for housekeeping's short grace.
    assert redis.zscore(queue.detached_key(), str(turn.generation.id)) is not None


# The test: many drops, each followed by an immediate reconnect


ANSWERS = 20
TOKENS = 40


@dataclass
class Reader:
    """One client of one answer that hangs up at random and comes straight back with
    Last-Event-ID, as EventSource does after a network blip."""

    url: str
    headers: dict[str, str]
    rng: random.Random
    ids: list[str] = field(default_factory=list)
    text: str = ""
    # As the client has seen it: queued, then on a worker (`meta` running), then streaming.
    phase: str = "queued"
    drops: Counter[str] = field(default_factory=Counter)
    done: bool = False

    def take(self, event: Event) -> None:
        if event.event == "comment":
            return
        assert event.id is not None
        self.ids.append(event.id)
        if running(event) and self.phase == "queued":
            self.phase = "running"
        elif event.event == "delta" and event.data:
            self.phase = "streaming"
            self.text += event.data["text"]
        elif event.event == "restart":
            self.text = ""
        self.done = event.event == "done"

    async def read(self, client: httpx.AsyncClient) -> None:
        while not self.done:
            headers = dict(self.headers)
            if self.ids:
                headers["Last-Event-ID"] = self.ids[-1]
            # Hang up after a few events or heartbeats, or at any moment, mid-event included.
            keep = self.rng.randint(1, 3) if self.rng.random() < 0.5 else None
            after = None if keep is not None else self.rng.uniform(0.02, 0.4)
            phase = self.phase
            try:
                async with asyncio.timeout(after):
                    await self._connection(client, headers, keep)
            except TimeoutError:
                pass
            if not self.done:
                self.drops[phase] += 1

    async def _connection(
        self, client: httpx.AsyncClient, headers: dict[str, str], keep: int | None
    ) -> None:
        seen = 0
        async with client.stream("GET", self.url, headers=headers) as response:
            assert response.status_code == 200
            lines: list[str] = []
            async for line in response.aiter_lines():
                lines.append(line)
                if line != "":
                    continue
                for event in read_events(iter(lines)):
                    self.take(event)
                    seen += 1
                lines = []
                if self.done or (keep is not None and seen >= keep):
                    return


async def test_random_drops_with_immediate_reconnects_cancel_nothing_and_lose_nothing(
    fake_workers: Any, live_edge: LiveEdge, settings: Any
) -> None:
    settings.SCHEDULER_COALESCE_MS = 0  # one event per token: many places to drop at
    settings.SCHEDULER_TIER_SHARE = {"free": 1.0}
    settings.SCHEDULER_MAX_QUEUE_SECONDS = 300  # the test is about drops, not the queue limit
    settings.SCHEDULER_PRESSURE_QUEUED = 0
    settings.STREAM_FIRST_TOKEN_GRACE_SECONDS = 5.0
    settings.STREAM_GRACE_SECONDS = 30
    # Two answers at a time, each a moment on the worker before its first token: the others
    # wait in line, so clients drop while queued, on the worker, and streaming. The first two
    # stay before their first token until the clients have dropped often enough in line and
    # on the worker (however fast they reconnect), then each answer's moment is 0.4 s.
    dropped_enough = threading.Event()
    fake = fake_workers(
        tokens=TOKENS, token_delay=0.02, first_token_delay=0.4, first_token_gate=dropped_enough
    )
    pool = await sync_to_async(register_pool)()
    await add_worker(pool, fake, max_concurrency=2)
    users: list[User] = [await sync_to_async(UserFactory.create)() for _ in range(ANSWERS)]
    turns = [await send(each) for each in users]
    readers = [
        Reader(
            url=stream_url(live_edge, turn.generation.id),
            headers=await sync_to_async(bearer)(each),
            rng=random.Random(20261204 + index),
        )
        for index, (each, turn) in enumerate(zip(users, turns, strict=True))
    ]

    def all_drops() -> Counter[str]:
        return sum((reader.drops for reader in readers), Counter[str]())

    async def enough() -> bool:
        drops = all_drops()
        return drops.total() >= 200 and drops["queued"] >= 20 and drops["running"] >= 5

    async def release_when_dropped_enough() -> None:
        try:
            await wait_for(enough, what="enough drops in line and on the worker")
        finally:
            dropped_enough.set()

    async with running_schedulers(), httpx.AsyncClient(timeout=budget(30)) as client:
        tasks = [asyncio.create_task(reader.read(client)) for reader in readers]
        tasks.append(asyncio.create_task(release_when_dropped_enough()))
        try:
            async with asyncio.timeout(budget(300)):
                await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    drops = all_drops()
    statuses = Counter(
        [status async for status in Generation.objects.values_list("status", flat=True)]
    )
    lost = repeated = 0
    out_of_order = wrong_text = 0
    expected = "".join(f"tok{i} " for i in range(TOKENS))
    for reader, turn in zip(readers, turns, strict=True):
        stored = [entry_id for entry_id, _ in await _stream_entries(turn.generation.id)]
        lost += len(set(stored) - set(reader.ids))
        repeated += len(reader.ids) - len(set(reader.ids))
        out_of_order += reader.ids != stored
        generation = await Generation.objects.select_related("message").aget(pk=turn.generation.id)
        wrong_text += not reader.text == generation.message.content == expected
    report = (
        f"drops {dict(drops)} ({drops.total()}), answers {dict(statuses)}, chunks lost {lost}, "
        f"repeated {repeated}"
    )
    print(report)
    assert statuses == {Generation.Status.COMPLETE: ANSWERS}, report
    assert lost == repeated == out_of_order == wrong_text == 0, report
    assert drops.total() >= 200, report
    assert drops["queued"] >= 20 and drops["running"] >= 5, report


@sync_to_async
def _stream_entries(generation_id: Any) -> list[tuple[str, dict[str, str]]]:
    entries: list[tuple[str, dict[str, str]]] = queue.sync_redis().xrange(  # type: ignore[assignment]
        queue.stream_key(generation_id)
    )
    return entries
