"""The scheduler service: one replica's lifecycle and its loops.

One asyncio process (`python manage.py run_scheduler`); any number of replicas share the
queues. A replica claims a generation with an atomic pop (so none is served twice), places it
on a worker with room (`capacity.py`, by the policy of `placement.py`), and serves it
(`run.py`). Loops, each a task:

- health:       asks every worker's /health (and, when its counts matter, its /metrics);
                marks workers up and down
- dispatch:     claims and places generations while some worker has room
- listen:       pub/sub for new work and for cancels of running generations
- heartbeat:    tells the other replicas this one is alive (`adoption.py`)
- adoption:     adopts the answers of replicas that stopped beating; gives up those another
                replica adopted from this one while it stood still
- housekeeping: lease renewal, queue time limit, queue positions, stale sweep
- flush:        a second after this replica finished answers without a row (`/v1` keys that
                keep nothing), the hooks write what those left in one batch (`generations_flush`)

With a `metrics_port`, the replica also serves `/metrics`, `/healthz` and `/readyz` there
(`ops.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from asgiref.sync import sync_to_async
from django.conf import settings

from chatsite.redis import REDIS_FAULTS, async_pubsub, async_redis

from .. import hooks, metrics, queue, services
from ..client import OpenAICompatibleClient, WorkerLoad, get_client
from ..models import Worker
from ..tokens import warm_default_tokenizer
from .adoption import Liveness, beat_forever
from .capacity import Capacity, WorkerView, fleet_rows
from .guard import configured_guard
from .housekeeping import Housekeeping
from .kv_events import KVEventsApplier, KVEventsSubscriber
from .ops import OpsServer
from .placement import configured_policy
from .run import Run, Runs
from .tools import ToolLoop, configured_runner
from .writer import StreamWriter

logger = logging.getLogger(__name__)

# With nothing to admit, look again after this long at the latest. New work (the enqueue, a
# move to a fallback), a released lease (any replica's) and a worker coming up wake the
# dispatcher at once; the poll is for what announces itself to nobody: a dead replica's leases
# lapsing, which matters only to work waiting for room. So when the last look found every
# queue with room empty, or the replica is idle, it looks after its idle interval instead.
IDLE_POLL_SECONDS = 1.0
# The pace of the chores (housekeeping) and of adoption while the replica has work.
CHORES_SECONDS = 1.0
# The pub/sub reader wakes at least this often with nothing said (to see it is stopping, and
# so that redis-py's health check of the connection gets its turn).
LISTEN_SECONDS = 5.0
# What answers without a row leave to write (their usage events) is written this long after
# this replica finished one: a second of answers is one batch.
FLUSH_DELAY_SECONDS = 1.0


class Scheduler:
    """A scheduler replica. `await run()` until `stop()`."""

    def __init__(
        self,
        *,
        replica_id: str | None = None,
        client: OpenAICompatibleClient | None = None,
        health_interval: float | None = None,
        metrics_port: int = 0,
    ) -> None:
        self.replica_id = (
            replica_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        )
        self.client = client or get_client()
        self.redis = async_redis()
        self.health_interval = (
            health_interval
            if health_interval is not None
            else settings.SCHEDULER_HEALTH_INTERVAL_MS / 1000
        )
        # Idle (nothing of its own running, no work announced lately, every worker up), a
        # replica reads its workers' load less often: see `health_loop`.
        self.idle_health_interval = max(
            self.health_interval, settings.SCHEDULER_IDLE_HEALTH_INTERVAL_MS / 1000
        )
        self._last_announced = -math.inf  # loop time; none yet
        # When the workers' /metrics were last read (loop time), and whether the next health
        # pass must read them (`_reads_load`).
        self._load_read_at = -math.inf
        self._load_due = True
        # Loops pausing at the idle pace (`_pause`): announced work wakes each.
        self._pausing: set[asyncio.Event] = set()
        self.running: dict[str, asyncio.Task[None]] = {}
        # Set when this replica finished a generation; the flush loop writes a batch after.
        self.flush_due = asyncio.Event()
        # Workers that refused tools (started without a tool-call parser): answer without.
        self.no_tool_workers: set[int] = set()
        self.capacity = Capacity(self.redis, configured_policy())
        self.guard = configured_guard()
        self.writer = StreamWriter(self.redis)
        self.tools = ToolLoop(configured_runner(), self.writer)
        self.liveness = Liveness(redis=self.redis, replica_id=self.replica_id)
        self.runs = Runs(
            redis=self.redis,
            replica_id=self.replica_id,
            client=self.client,
            capacity=self.capacity,
            writer=self.writer,
            guard=self.guard,
            tools=self.tools,
            no_tool_workers=self.no_tool_workers,
            finished=self.flush_due,
        )
        self.housekeeping = Housekeeping(
            redis=self.redis,
            replica_id=self.replica_id,
            capacity=self.capacity,
            writer=self.writer,
            running=self.running,
            finished=self.flush_due,
        )
        # Per worker that publishes KV cache events: the subscriber following them.
        self.kv_subscribers: dict[int, _Following] = {}
        self._wake = asyncio.Event()
        # Whether the dispatcher's last look may have left work waiting for room.
        self._may_wait = True
        self._stopping = asyncio.Event()
        self._loops: list[asyncio.Task[None]] = []
        self.ops = (
            OpsServer(
                port=metrics_port,
                redis=self.redis,
                replica_id=self.replica_id,
                capacity=self.capacity,
                stopped_loops=self.stopped_loops,
            )
            if metrics_port
            else None
        )

    @property
    def workers(self) -> dict[int, WorkerView]:
        """The workers this replica knows, by id, with their last measured load."""
        return self.capacity.workers

    # Lifecycle

    async def run(self) -> None:
        await asyncio.to_thread(self._warm)
        await sync_to_async(services.workers_sync_from_settings)()
        await self.liveness.beat()
        await self.check_workers()
        self._loops = loops = [
            asyncio.create_task(beat_forever(self.liveness, self._stopping), name="heartbeat"),
            # Adoption keeps the busy pace, idle or not: it reads what the heartbeat read.
            asyncio.create_task(self._loop(self.adoption_step, idle_pace=False), name="adoption"),
            asyncio.create_task(self.health_loop(), name="health"),
            asyncio.create_task(self.dispatch_loop(), name="dispatch"),
            asyncio.create_task(self.listen_loop(), name="listen"),
            asyncio.create_task(self._loop(self.housekeeping.step), name="housekeeping"),
            asyncio.create_task(self.flush_loop(), name="flush"),
        ]
        logger.info(
            "scheduler %s started with %d worker(s)", self.replica_id, len(self.capacity.workers)
        )
        try:
            if self.ops is not None:
                await self.ops.start()
            await self._stopping.wait()
        finally:
            subscribers = [following.task for following in self.kv_subscribers.values()]
            for task in [*loops, *subscribers]:
                task.cancel()
            await asyncio.gather(*loops, *subscribers, return_exceptions=True)
            if self.ops is not None:
                await self.ops.stop()
            await self._drain()
            await self.flush()
            await self.liveness.leave()
            await self.redis.aclose()
            await self.client.aclose()
            self.tools.shutdown()
            logger.info("scheduler %s stopped", self.replica_id)

    def _warm(self) -> None:
        """What the first answer would load (the output classifiers, the tokenizer that
        counts a cancelled answer's tokens), loaded before the replica takes any."""
        self.guard.warm()
        warm_default_tokenizer()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    def stopped_loops(self) -> list[str]:
        """The names of the replica's loops that ended while it runs (none should)."""
        return [task.get_name() for task in self._loops if task.done()]

    async def _drain(self) -> None:
        """Let running answers finish for a while, then cancel what is left."""
        if self.running:
            _, pending = await asyncio.wait(list(self.running.values()), timeout=30)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def _loop(self, step: Callable[[], Awaitable[None]], *, idle_pace: bool = True) -> None:
        """`step` every `CHORES_SECONDS`; with `idle_pace`, at the replica's idle pace while
        it has no work (`_pause`)."""
        while not self._stopping.is_set():
            await self._step(step)
            if idle_pace:
                await self._pause(CHORES_SECONDS)
            else:
                await asyncio.sleep(CHORES_SECONDS)

    async def _pause(self, busy: float) -> None:
        """Wait `busy` seconds while the replica has work; while it is idle (`_idle`), until
        work is announced or `idle_health_interval` has passed. An idle replica's chores find
        nothing to do: a replica with work does them for the pool at the busy pace, and what
        waits in a queue was announced."""
        if not self._idle():
            await asyncio.sleep(busy)
            return
        woken = asyncio.Event()
        self._pausing.add(woken)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), timeout=self.idle_health_interval)
        finally:
            self._pausing.discard(woken)

    async def _step(self, step: Callable[[], Awaitable[None]]) -> None:
        """One pass of a loop's `step`; a failure is logged, and the loop goes on."""
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except REDIS_FAULTS as exc:
            logger.warning("scheduler loop %s: Redis does not answer (%r)", step.__name__, exc)
        except Exception:
            logger.exception("scheduler loop %s failed; retrying", step.__name__)

    # Other replicas

    async def adoption_step(self) -> None:
        """Adopt what replicas that stopped beating held; give up what another replica
        adopted from this one (it stood still past the TTL, and the adopter answers now)."""
        await self.liveness.adopt(list(self.capacity.workers), silent=self.liveness.silent)
        await self.runs.disown_left()
        running = list(self.running.items())
        if not running:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for generation_id, _ in running:
                pipe.hget(queue.job_key(generation_id), "owner")
            owners = await pipe.execute()
        for (generation_id, task), owner in zip(running, owners, strict=True):
            if owner is not None and owner != self.replica_id:
                logger.warning("%s was adopted by %s; giving it up", generation_id, owner)
                self.runs.give_up(generation_id)
                task.cancel()

    # Health

    async def health_loop(self) -> None:
        """`check_workers` every `health_interval` while the replica has work, every
        `idle_health_interval` while it has none (an idle replica's loops are most of its CPU);
        announced work makes a reading older than `health_interval` due at once."""
        loop = asyncio.get_running_loop()
        while not self._stopping.is_set():
            checked = loop.time()
            await self._step(self.check_workers)
            # The first reading after an idle spell is a whole one: the work that ended it is
            # placed on loads as they are now.
            self._load_due = self._idle()
            await self._pause(self.health_interval)
            # Woken early by announced work: still no two readings within `health_interval`.
            await asyncio.sleep(max(0.0, checked + self.health_interval - loop.time()))

    def _idle(self) -> bool:
        """Nothing running here, no work announced within the idle interval, every worker
        up (a down one is watched for its return at the busy pace)."""
        return (
            not self.running
            and asyncio.get_running_loop().time() - self._last_announced > self.idle_health_interval
            and all(view.state != Worker.State.DOWN for view in self.capacity.workers.values())
        )

    def _announce(self) -> None:
        """Work was announced (new, or room for it): the dispatcher looks at once, and the
        workers' load is read at the busy pace again."""
        self._last_announced = asyncio.get_running_loop().time()
        self._wake.set()
        for woken in self._pausing:
            woken.set()

    def _reads_load(self, views: dict[int, WorkerView]) -> bool:
        """Whether this health pass reads the workers' /metrics, or only asks each whether it
        is up. The counts vLLM keeps (running, waiting, its cache's size, the counters that
        show a restart) change placements only where work waits for room: a pass reads them
        then, at the busy pace, and otherwise at the idle pace, after an idle spell and for a
        worker it has none of yet. Rendering /metrics costs a vLLM server milliseconds of the
        CPU it streams tokens with; /health, next to nothing."""
        return (
            self._load_due
            or self._may_wait
            or asyncio.get_running_loop().time() - self._load_read_at >= self.idle_health_interval
            or any(view.load is None for view in views.values())
        )

    async def check_workers(self) -> None:
        """Refresh the worker list from the database, see which workers are up and, when due
        (`_reads_load`), measure each one's load."""
        fleet = await sync_to_async(fleet_rows)()
        views = {row.id: row for row in fleet.workers}
        for view in views.values():
            known = self.capacity.workers.get(view.id)
            if known is not None:
                view.load = known.load
        load = self._reads_load(views)
        if load:
            self._load_read_at = asyncio.get_running_loop().time()
        results = await asyncio.gather(
            *(self.client.health(view.url, load=load) for view in views.values()),
            return_exceptions=True,
        )
        became_healthy = False
        for view, result in zip(views.values(), results, strict=True):
            if not isinstance(result, BaseException):
                if result is not None:
                    if _restarted(view.load, result):
                        await self.capacity.forget_cache(view.id)
                    view.load = result
                    await self._store_metrics(view.id, result)
                if view.state == Worker.State.DOWN:
                    changed = await sync_to_async(services.worker_set_state)(
                        worker_id=view.id, state=Worker.State.HEALTHY
                    )
                    view.state = Worker.State.HEALTHY
                    became_healthy = became_healthy or changed
                    logger.info("worker %s is up", view.name)
            else:
                view.load = None
                if view.state == Worker.State.HEALTHY:
                    await self.capacity.mark_down(view, str(result))
        self.capacity.workers = views
        self._follow_kv_events(views)
        self.capacity.pools = sorted({view.pool for view in views.values()})
        self.capacity.active_pools = fleet.active_pools
        self.capacity.fallbacks = fleet.fallbacks
        if became_healthy:
            self._wake.set()

    def _follow_kv_events(self, views: dict[int, WorkerView]) -> None:
        """A subscriber per worker that publishes KV cache events; none for the others. One
        that stopped on an error is started again."""
        wanted = {
            view.id: (view.kv_events_endpoint, view.kv_events_replay_endpoint)
            for view in views.values()
            if view.kv_events_endpoint
        }
        for worker_id, following in list(self.kv_subscribers.items()):
            if wanted.get(worker_id) == following.endpoints and not following.task.done():
                following.applier.capacity = views[worker_id].capacity_blocks
                continue
            following.task.cancel()
            if following.task.done() and not following.task.cancelled():
                logger.warning(
                    "KV events of worker %s stopped: %r", worker_id, following.task.exception()
                )
            del self.kv_subscribers[worker_id]
            self.capacity.exact.discard(worker_id)
        for worker_id, endpoints in wanted.items():
            if worker_id in self.kv_subscribers:
                continue
            applier = KVEventsApplier(
                self.capacity.index, worker_id, capacity=views[worker_id].capacity_blocks
            )
            subscriber = KVEventsSubscriber(
                applier,
                endpoint=endpoints[0],
                replay_endpoint=endpoints[1],
                on_batch=self.capacity.exact.add,
            )
            task = asyncio.create_task(subscriber.run(), name=f"kv-events-{worker_id}")
            self.kv_subscribers[worker_id] = _Following(endpoints, applier, task)

    async def _store_metrics(self, worker_id: int, load: WorkerLoad) -> None:
        """The reading, for background completions' placement and the admin; with the speed
        this replica fitted to the worker's first tokens, once it has one."""
        reading: dict[Any, float] = {
            "running": load.running,
            "waiting": load.waiting,
            "kv_cache_percent": load.kv_cache_percent,
            "prefix_cache_queries": load.prefix_cache_queries,
            "prefix_cache_hits": load.prefix_cache_hits,
            "measured_ms": queue.now_ms(),
        }
        fit = self.capacity.fits.get(worker_id)
        speed = fit.speed() if fit is not None else None
        if speed is not None:
            reading |= {
                "ttft_base_ms": round(speed.base_ms, 2),
                "ttft_ms_per_token": round(speed.ms_per_token, 4),
                "ttft_ms_per_stream": round(speed.ms_per_stream, 2),
            }
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hset(queue.metrics_key(worker_id), mapping=reading)
            pipe.expire(queue.metrics_key(worker_id), 30)
            await pipe.execute()

    # Dispatch

    async def dispatch_loop(self) -> None:
        while not self._stopping.is_set():
            # Cleared before the look, not after: a wake-up that comes during it (work
            # enqueued after its queue was read) is not lost, it makes the next look at once.
            self._wake.clear()
            try:
                dispatched = await self.dispatch_once()
            except asyncio.CancelledError:
                raise
            except REDIS_FAULTS as exc:
                logger.warning("dispatch: Redis does not answer (%r)", exc)
                dispatched = False
            except Exception:
                logger.exception("dispatch failed; retrying")
                dispatched = False
            if not dispatched:
                poll = (
                    IDLE_POLL_SECONDS
                    if self._may_wait and not self._idle()
                    else self.idle_health_interval
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=poll)

    async def dispatch_once(self) -> bool:
        """Admit at most one generation per pool; True if any was admitted. Notes whether
        work may be left waiting for room (`_may_wait`): not when every tier of every pool
        had room and its queue was empty."""
        dispatched = False
        may_wait = False
        every_tier = queue.tiers_best_first()
        for pool in self.capacity.pools:
            candidates = await self.capacity.candidates(pool)
            # Only the tiers some worker has room for: free answers wait while the headroom
            # kept for paid ones is all that is left.
            tiers = [tier for tier in every_tier if any(view.has_room(tier) for view in candidates)]
            if len(tiers) < len(every_tier):
                may_wait = True
            if not tiers:
                continue
            keys = queue.claim_keys(pool, tiers, self.replica_id)
            claimed = await self.redis.eval(
                queue.CLAIM, len(keys), *keys, self.replica_id, str(queue.now_ms())
            )
            if not claimed:
                continue
            may_wait = True  # the queue had one: it may have more
            # The job comes with its claim: no second round trip to read it.
            generation_id, queue_name, score, flat = claimed
            job = queue.Job.from_fields(dict(zip(flat[::2], flat[1::2], strict=True)))
            for placement in await self.capacity.place(job, candidates):
                admitted = await self.capacity.acquire(
                    placement, generation_id, tokens=job.kv_tokens, tier=job.tier
                )
                if admitted:
                    metrics.admitted(job, reason=metrics.ADOPTED if job.attempt else metrics.NEW)
                    run = self.runs.new(job, placement, admitted)
                    task = asyncio.create_task(self._serve(run), name=f"gen-{generation_id}")
                    self.running[generation_id] = task
                    dispatched = True
                    break
            else:
                # Every candidate filled up meanwhile (another replica), or the tier's share
                # of each is full in tokens: back at the head of its line.
                await self.redis.eval(
                    queue.REQUEUE,
                    5,
                    queue_name,
                    queue.queued_at_key(pool, job.tier),
                    queue.fair_key(pool, job.tier),
                    queue.job_key(generation_id),
                    queue.owned_key(self.replica_id),
                    score,
                    str(job.enqueued_ms),
                    generation_id,
                )
        self._may_wait = may_wait
        return dispatched

    async def _serve(self, run: Run) -> None:
        try:
            await self.runs.serve(run)
        finally:
            self.running.pop(run.job.generation_id, None)
            self._wake.set()

    # What finished answers left to write

    async def flush_loop(self) -> None:
        """Once at start (what a replica that died left), then a second after this replica
        finished generations: nothing while it finishes none."""
        self.flush_due.set()
        while not self._stopping.is_set():
            await self.flush_due.wait()
            await asyncio.sleep(FLUSH_DELAY_SECONDS)
            self.flush_due.clear()
            if not await self.flush():
                self.flush_due.set()  # again after the delay

    async def flush(self) -> bool:
        """The hooks write what finishes of generations without a row left; False if that
        failed (it stays to be written)."""
        try:
            await sync_to_async(hooks.get_hooks().generations_flush)()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("could not write what finished answers left; retrying")
            return False
        return True

    # Messages from other processes

    async def listen_loop(self) -> None:
        """Pub/sub for new work, cancels and the edges' word on relays; reconnects after a
        Redis failure. A cancel sent while no replica listened is still found by housekeeping
        (the job's cancel flag); a relay's outcome, in its job."""
        while not self._stopping.is_set():
            try:
                await self._listen()
            except asyncio.CancelledError:
                raise
            except REDIS_FAULTS as exc:
                logger.warning("listening: Redis does not answer (%r); reconnecting", exc)
                await asyncio.sleep(1.0)
            except Exception:
                logger.exception("listening for wake-ups and cancels failed; reconnecting")
                await asyncio.sleep(1.0)

    async def _listen(self) -> None:
        pubsub = await async_pubsub(self.redis)
        relayed = queue.relay_channel(self.replica_id)
        await pubsub.subscribe(queue.wake_channel(), queue.cancel_channel(), relayed)
        try:
            while not self._stopping.is_set():
                message = await pubsub.get_message(
                    ignore_subscribe_messages=True, timeout=LISTEN_SECONDS
                )
                if message is None:
                    continue
                if message["channel"] == relayed:
                    self.runs.relay_said(message["data"])
                elif message["channel"] == queue.wake_channel():
                    self._announce()
                elif message["channel"] == queue.cancel_channel():
                    task = self.running.get(message["data"])
                    if task is not None:
                        task.cancel()
        finally:
            await pubsub.aclose()


class _Following(NamedTuple):
    """A worker's KV events as followed: its endpoints, what applies them, the task."""

    endpoints: tuple[str, str]
    applier: KVEventsApplier
    task: asyncio.Task[None]


def _restarted(before: WorkerLoad | None, now: WorkerLoad) -> bool:
    """The worker's prefix-cache counters went back: it restarted, with an empty cache."""
    return before is not None and now.prefix_cache_queries < before.prefix_cache_queries
