"""Replica liveness and adoption: a dead replica's answers are taken over by a live one.

Every replica beats once a second (`Liveness.beat`): `replica:<id>`, a key that lapses after
`SCHEDULER_REPLICA_TTL_SECONDS` (the stale sweep reads it), and its score in `replicas`, a
sorted set by the time of its last beat, where the others find who stopped. Each generation
a replica claims is in its `owned:<id>` set (the claim's own Lua step adds it) until its run
ends.

A replica silent past the TTL is dead. Any live replica may adopt its generations, one Lua
step for all of them (`ADOPT`): only while the dead one still does not beat, and only the
jobs still its own, so two adopters, or a replica that was only slow, never both win one.
The adopter drops the dead replica's leases and puts each answer back at the head of its
queue with its count of attempts: the next dispatcher restarts it on a worker with a
`restart` event (`run.py`), or it fails here if it has no attempt left. The worker's own
request ended with the dead process's connection (vLLM aborts a request whose stream
closes), and the client's stream goes on: the restart tells it to start the text again.

A replica that was only slow (a stalled event loop, say) and finds a generation it serves
owned by another stops serving it without a word (`Runs.disown`): the adopter answers it.

Judging others needs a Redis this replica could reach all along. A Redis that paused or
went away stopped everyone's beats at once, so after a gap in its own beats a replica waits
a full TTL before it adopts anything: the others have beaten again by then.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings

from .. import queue, services
from ..models import Generation

logger = logging.getLogger(__name__)

# Adopt the generations of a replica that stopped beating (KEYS: its owned set, the
# adopter's, the replicas' beats, the dead one's heartbeat key, the job keys' prefix. ARGV:
# the dead replica, the adopter, the beat time before which a replica is dead, at most how
# many). Nothing if it beats again meanwhile; each job only while it is still the dead
# one's. Returns each adopted id with its job's fields; the dead replica leaves `replicas`
# once it owns nothing.
ADOPT = """
if redis.call('EXISTS', KEYS[4]) == 1 then
  return {}
end
local beat = redis.call('ZSCORE', KEYS[3], ARGV[1])
if beat and tonumber(beat) > tonumber(ARGV[3]) then
  return {}
end
local adopted = {}
for _, id in ipairs(redis.call('SRANDMEMBER', KEYS[1], tonumber(ARGV[4]))) do
  redis.call('SREM', KEYS[1], id)
  local job = KEYS[5] .. id
  if redis.call('HGET', job, 'owner') == ARGV[1] then
    redis.call('HSET', job, 'owner', ARGV[2], 'adopted_from', ARGV[1])
    redis.call('SADD', KEYS[2], id)
    adopted[#adopted + 1] = {id, redis.call('HGETALL', job)}
  end
end
if redis.call('SCARD', KEYS[1]) == 0 then
  redis.call('ZREM', KEYS[3], ARGV[1])
end
return adopted
"""

# An adopted generation back at the head of its queue (KEYS: the queue, its enqueue times,
# its fair-queue state, the job, the adopter's owned set. ARGV: now, its id). Its start tag
# is the queue's virtual time, which is at or before every tag waiting there: it is next.
# Its queue time counts from now; the job stays without an owner until claimed again.
REQUEUE_ADOPTED = """
if redis.call('EXISTS', KEYS[4]) == 0 then
  redis.call('SREM', KEYS[5], ARGV[2])
  return 0
end
local v = tonumber(redis.call('HGET', KEYS[3], 'V') or '0')
redis.call('ZADD', KEYS[1], string.format('%d.%06d', v, 0), ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[1], ARGV[2])
redis.call('HDEL', KEYS[4], 'owner')
redis.call('SREM', KEYS[5], ARGV[2])
return 1
"""

ADOPT_AT_MOST = 500


class Liveness:
    """One replica's heartbeat, and its adoption of the replicas that stopped beating."""

    def __init__(self, *, redis: Any, replica_id: str) -> None:
        self.redis = redis
        self.replica_id = replica_id
        self._last_beat: float | None = None
        # The other replicas silent past the TTL, as the last beat found them.
        self.silent: list[str] = []
        # Since when this replica's own beats have come without a gap (monotonic seconds).
        self._steady_since: float | None = None

    @property
    def ttl(self) -> float:
        return float(settings.SCHEDULER_REPLICA_TTL_SECONDS)

    async def beat(self) -> None:
        """Tell the others this replica is alive, and see who went silent (`silent`) in the
        same round trip."""
        now_ms = queue.now_ms()
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(queue.replica_key(self.replica_id), "1", px=int(self.ttl * 1000))
            pipe.zadd(queue.replicas_key(), {self.replica_id: now_ms})
            pipe.zrangebyscore(queue.replicas_key(), "-inf", now_ms - int(self.ttl * 1000))
            *_, silent = await pipe.execute()
        self.silent = self._others(silent)
        now = time.monotonic()
        if self._last_beat is None or now - self._last_beat > self.ttl / 2:
            # The first beat, or one after a gap: Redis (or this process) stood still, and
            # the others' beats may be as old as ours were.
            self._steady_since = now
        self._last_beat = now

    async def leave(self) -> None:
        """A clean stop: this replica's answers have ended; it beats no more."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.delete(queue.replica_key(self.replica_id))
            pipe.zrem(queue.replicas_key(), self.replica_id)
            await pipe.execute()

    def may_judge(self) -> bool:
        """Whether this replica's own beats have been steady for a full TTL."""
        return self._steady_since is not None and time.monotonic() - self._steady_since >= self.ttl

    async def dead_replicas(self) -> list[str]:
        cutoff = queue.now_ms() - int(self.ttl * 1000)
        return self._others(await self.redis.zrangebyscore(queue.replicas_key(), "-inf", cutoff))

    def _others(self, replicas: list[Any]) -> list[str]:
        return [str(replica) for replica in replicas if replica != self.replica_id]

    async def adopt(self, worker_ids: list[int], *, silent: list[str] | None = None) -> list[str]:
        """Adopt what the dead replicas held and put it back at the head of its queue (or
        end it, when it was cancelled or has no attempt left). Returns the ids adopted.
        `silent`: the replicas found silent already (the heartbeat's reading); read now
        without it. Each adoption checks again, in its Lua step, that the replica is dead."""
        if not self.may_judge():
            return []
        adopted_ids: list[str] = []
        for dead in silent if silent is not None else await self.dead_replicas():
            adopted = await self.redis.eval(
                ADOPT,
                5,
                queue.owned_key(dead),
                queue.owned_key(self.replica_id),
                queue.replicas_key(),
                queue.replica_key(dead),
                queue.job_key(""),
                dead,
                self.replica_id,
                str(queue.now_ms() - int(self.ttl * 1000)),
                str(ADOPT_AT_MOST),
            )
            if not adopted:
                continue
            logger.warning(
                "replica %s stopped beating: adopting %d generation(s)", dead, len(adopted)
            )
            jobs = [
                queue.Job.from_fields(dict(zip(flat[::2], flat[1::2], strict=True)))
                for _, flat in adopted
            ]
            cancelled = {str(gid) for gid, flat in adopted if "cancel" in flat[::2]}
            await self._drop_leases([job.generation_id for job in jobs], worker_ids)
            for job in jobs:
                await self._restart_or_end(job, cancelled=job.generation_id in cancelled)
                adopted_ids.append(job.generation_id)
        if adopted_ids:
            await self.redis.publish(queue.wake_channel(), "adopted")
        return adopted_ids

    async def _drop_leases(self, generation_ids: list[str], worker_ids: list[int]) -> None:
        """The dead replica's leases would lapse by themselves; give their room back now."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for worker_id in worker_ids:
                pipe.zrem(queue.lease_key(worker_id), *generation_ids)
                pipe.hdel(queue.lease_tokens_key(worker_id), *generation_ids)
                pipe.hdel(queue.prefill_key(worker_id), *generation_ids)
            await pipe.execute()

    async def _restart_or_end(self, job: queue.Job, *, cancelled: bool) -> None:
        gid = job.generation_id
        if cancelled or job.attempt >= settings.GENERATION_MAX_ATTEMPTS:
            status = Generation.Status.CANCELLED if cancelled else Generation.Status.FAILED
            await sync_to_async(services.generation_end_lost)(generation_id=gid, status=status)
            await self.redis.srem(queue.owned_key(self.replica_id), gid)
            return
        pool = await self.redis.hget(queue.job_key(gid), "pool") or job.pool
        await self.redis.eval(
            REQUEUE_ADOPTED,
            5,
            queue.queue_key(pool, job.tier),
            queue.queued_at_key(pool, job.tier),
            queue.fair_key(pool, job.tier),
            queue.job_key(gid),
            queue.owned_key(self.replica_id),
            str(queue.now_ms()),
            gid,
        )


async def beat_forever(liveness: Liveness, stopping: asyncio.Event) -> None:
    """The heartbeat, on its own loop: a long housekeeping step must not look like death."""
    while not stopping.is_set():
        try:
            await liveness.beat()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.warning("could not beat the heartbeat; retrying", exc_info=True)
        await asyncio.sleep(min(1.0, liveness.ttl / 4))
