"""Housekeeping, once a second: what keeps a replica's claims alive and the queues honest.

Every replica renews the leases it holds (its heartbeat, which the sweeper and adoption
read, has a loop of its own: `adoption.py`) and cancels the generations it runs that were
asked to stop. The pool-wide chores are done by one replica at a time (a short Redis lock):
reject what waited past the queue limit, cancel what nobody watched for its grace (queued or
running), tell the waiting their place in line, and now and then fail the generations
nobody serves.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections

from chatsite.stream_events import QueueData, StreamEvent

from .. import metrics, queue, services
from ..errors import ErrorCode
from ..models import Generation
from .capacity import Capacity
from .writer import StreamWriter

logger = logging.getLogger(__name__)

SWEEP_EVERY_SECONDS = 15
# How many abandoned generations `queue.ABANDONED` looks at a call.
ABANDONED_BATCH = 100


class Housekeeping:
    """The chores of one replica; `running` is the replica's own map of generation tasks."""

    def __init__(
        self,
        *,
        redis: Any,
        replica_id: str,
        capacity: Capacity,
        writer: StreamWriter,
        running: dict[str, asyncio.Task[None]],
        finished: asyncio.Event | None = None,
    ) -> None:
        self.redis = redis
        # Set when a chore finished a generation (it may have no row: its usage is batched).
        self.finished = finished or asyncio.Event()
        self.replica_id = replica_id
        self.capacity = capacity
        self.writer = writer
        self.running = running
        self._last_sweep = 0.0

    async def step(self) -> None:
        await self.capacity.renew()
        await self.cancel_requested()
        # One replica at a time does the pool-wide chores.
        if not await self.redis.set(queue.key("housekeeping"), self.replica_id, nx=True, px=900):
            return
        await self.cancel_abandoned()
        if await self.anything_queued():
            await self.reject_overdue()
            await self.send_to_fallback()
            await self.publish_positions()
        loop = asyncio.get_running_loop()
        if loop.time() - self._last_sweep >= SWEEP_EVERY_SECONDS:
            self._last_sweep = loop.time()
            await self.sweep()

    async def anything_queued(self) -> bool:
        """Whether any answer waits in a queue: the chores of the waiting (expiry, fallback,
        places in line) cost a round trip or more per pool and tier, for nothing most of the
        time; this is one."""
        pools = {*self.capacity.active_pools, *self.capacity.fallbacks}
        if not pools:
            return False
        async with self.redis.pipeline(transaction=False) as pipe:
            for pool in pools:
                for tier in queue.tiers_best_first():
                    pipe.zcard(queue.queue_key(pool, tier))
            return any(await pipe.execute())

    async def cancel_requested(self) -> None:
        """Cancel the running generations of this replica whose job carries the cancel flag:
        a Stop, or an abandoned answer (`cancel_abandoned`), whose pub/sub message was missed."""
        running = list(self.running.items())
        if not running:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for generation_id, _ in running:
                pipe.hget(queue.job_key(generation_id), "cancel")
            flags = await pipe.execute()
        for (_, task), flag in zip(running, flags, strict=True):
            if flag:
                task.cancel()

    async def cancel_abandoned(self) -> None:
        """Cancel the generations whose watchers all left and none came back within the grace:
        `STREAM_FIRST_TOKEN_GRACE_SECONDS` for one left before its first token or whose page
        went away, `STREAM_GRACE_SECONDS` for one left after it. A queued one is taken out of
        its queue and finished as cancelled (its reservation released); a running one is
        stopped by its replica, which closes the worker's request."""
        short = int(settings.STREAM_FIRST_TOKEN_GRACE_SECONDS * 1000)
        long = int(settings.STREAM_GRACE_SECONDS * 1000)
        looked = ABANDONED_BATCH
        while looked == ABANDONED_BATCH:  # a full batch: more may be due
            keys = queue.abandoned_keys()
            queued, running, looked = await self.redis.eval(
                queue.ABANDONED,
                len(keys),
                *keys,
                str(queue.now_ms()),
                str(short),
                str(long),
                str(ABANDONED_BATCH),
            )
            for generation_id in running:
                logger.info("generation %s abandoned by its watchers; cancelling", generation_id)
                await self.redis.publish(queue.cancel_channel(), generation_id)
            for generation_id in queued:
                logger.info("queued generation %s abandoned by its watchers", generation_id)
                await sync_to_async(services.generation_finish)(
                    generation_id=generation_id,
                    status=Generation.Status.CANCELLED,
                    text="",
                    finish_reason="cancelled",
                )
                self.finished.set()

    async def reject_overdue(self) -> None:
        deadline = queue.now_ms() - settings.SCHEDULER_MAX_QUEUE_SECONDS * 1000
        tiers = queue.tiers_best_first()
        for pool in self.capacity.active_pools:
            keys = queue.expire_keys(pool, tiers)
            ids = await self.redis.eval(queue.EXPIRE_QUEUED, len(keys), *keys, str(deadline))
            for generation_id in ids:
                await sync_to_async(services.generation_finish)(
                    generation_id=generation_id,
                    status=Generation.Status.REJECTED,
                    text="",
                    finish_reason="rejected",
                    error_code=ErrorCode.QUEUE_TIMEOUT,
                    error_message=(
                        "Demand is high and no model worker could take this answer in "
                        f"{settings.SCHEDULER_MAX_QUEUE_SECONDS} s. Please try again."
                    ),
                )
                self.finished.set()

    async def send_to_fallback(self) -> None:
        """The overload policy: answers of the fallback tiers that waited past
        `SCHEDULER_FALLBACK_AFTER_SECONDS` in a pool whose fallback has workers go to the
        fallback's queue; the generation records it and its stream says so."""
        after = settings.SCHEDULER_FALLBACK_AFTER_SECONDS
        if after <= 0:
            return
        deadline = queue.now_ms() - int(after * 1000)
        for pool, fallback in self.capacity.fallbacks.items():
            if fallback.name not in self.capacity.pools:
                continue  # no worker there to answer
            for tier in settings.SCHEDULER_FALLBACK_TIERS:
                keys = queue.fallback_keys(pool, tier, fallback.name)
                moved = await self.redis.eval(
                    queue.MOVE_TO_FALLBACK,
                    len(keys),
                    *keys,
                    str(deadline),
                    fallback.name,
                    Generation.RouteReason.HIGH_DEMAND,
                    str(queue.JOB_TTL_SECONDS),
                    str(fallback.context_window),
                )
                if not moved:
                    continue
                # The fallback's dispatchers look now (their queue may have been empty).
                await self.redis.publish(queue.wake_channel(), fallback.name)
                route = await sync_to_async(services.generations_route)(
                    generation_ids=list(moved),
                    pool_name=fallback.name,
                    reason=Generation.RouteReason.HIGH_DEMAND,
                )
                metrics.DEGRADATIONS.labels(fallback.name, tier, "high_demand").inc(len(moved))
                for generation_id in moved:
                    await self.writer.event(generation_id, StreamEvent.META, route)
                logger.info(
                    "%d %s answer(s) of %s sent to %s", len(moved), tier, pool, fallback.name
                )

    async def publish_positions(self) -> None:
        """Tell each waiting generation its place in line, when it changes."""
        for pool in self.capacity.active_pools:
            high_demand = not await self.capacity.candidates(pool)
            position = 0
            for tier in queue.tiers_best_first():
                members = await self.redis.zrange(queue.queue_key(pool, tier), 0, 499)
                for generation_id in map(str, members):
                    position += 1
                    job = queue.job_key(generation_id)
                    marker = f"{position}:{int(high_demand)}"
                    previous = await self.redis.hget(job, "position")
                    if previous != marker:
                        await self.redis.hset(job, "position", marker)
                        await self.writer.event(
                            generation_id,
                            StreamEvent.QUEUE,
                            QueueData(position=position, high_demand=high_demand),
                        )

    async def sweep(self) -> None:
        await sync_to_async(close_old_connections)()
        replicas = await sync_to_async(services.live_scheduler_replicas)()
        swept = await sync_to_async(services.generation_sweep_stale)(live_replicas=replicas)
        if swept:
            logger.warning("swept %d stale generation(s)", swept)
