"""A replica's operator endpoints, on its own port: `/metrics`, `/healthz`, `/readyz`.

A small aiohttp server on the replica's own event loop (`SCHEDULER_METRICS_PORT`, or
`run_scheduler --metrics-port`), so that `/healthz` answering is itself the proof that the
loop turns, and the readiness checks read the replica's own state. Nothing here blocks the
loop: the scrape reads memory (the process's metrics and the replica's view of its workers),
the checks are one Redis round trip each.

- `/healthz`: the loop answers and none of the replica's loops has ended.
- `/readyz` (`chatsite.health`'s shape): Redis answers, this replica's heartbeat is fresh
  (younger than the replica TTL: the others do not think it dead), and every active pool has a
  healthy worker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web
from django.conf import settings

from chatsite import health
from chatsite.metrics import exposition

from .. import queue
from ..metrics import FleetCollector
from ..models import Worker
from .capacity import Capacity

logger = logging.getLogger(__name__)


class OpsServer:
    """A replica's endpoints on `host:port`, from its Redis client, its id, its capacity
    (workers and pools) and `stopped_loops` (the names of its loops that ended); `start()`
    once its loop runs, then `stop()`."""

    def __init__(
        self,
        *,
        port: int,
        redis: Any,
        replica_id: str,
        capacity: Capacity,
        stopped_loops: Callable[[], list[str]],
        host: str = "0.0.0.0",  # noqa: S104 (Prometheus and the probes reach it from outside)
    ) -> None:
        self.host = host
        self.port = port
        self.redis = redis
        self.replica_id = replica_id
        self.capacity = capacity
        self.stopped_loops = stopped_loops
        self.collector = FleetCollector(lambda: capacity.workers)
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        self._runner = web.AppRunner(app, access_log=None)

    async def start(self) -> None:
        """Listen; a port already taken is logged and the replica serves answers without
        its endpoints (its probes then fail, which says so), rather than not at all."""
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, self.host, self.port).start()
        except OSError as exc:
            logger.error("scheduler endpoints: cannot listen on port %d (%s)", self.port, exc)

    async def stop(self) -> None:
        await self._runner.cleanup()

    async def metrics(self, request: web.Request) -> web.Response:
        payload, content_type = exposition([self.collector])
        return web.Response(body=payload, headers={"Content-Type": content_type})

    async def healthz(self, request: web.Request) -> web.Response:
        if stopped := self.stopped_loops():
            return _json(503, {"status": "stopped", "loops": stopped})
        return _json(*health.alive())

    async def readyz(self, request: web.Request) -> web.Response:
        return _json(
            *await health.readiness(
                {
                    "redis": health.redis_answers,
                    "heartbeat": self.heartbeat_fresh,
                    "workers": self.workers_healthy,
                }
            )
        )

    async def heartbeat_fresh(self) -> str | None:
        """This replica's last beat, as the others read it, is younger than the TTL."""
        beat = await self.redis.zscore(queue.replicas_key(), self.replica_id)
        if beat is None:
            return "no heartbeat in Redis"
        age = (queue.now_ms() - float(beat)) / 1000
        if age > settings.SCHEDULER_REPLICA_TTL_SECONDS:
            return f"last heartbeat {age:.1f} s ago"
        return None

    async def workers_healthy(self) -> str | None:
        """Every active pool has a healthy worker, as this replica's health checks found."""
        capacity = self.capacity
        healthy = {
            view.pool for view in capacity.workers.values() if view.state == Worker.State.HEALTHY
        }
        missing = [pool for pool in capacity.active_pools if pool not in healthy]
        return f"no healthy worker in {', '.join(missing)}" if missing else None


def _json(status: int, body: dict[str, object]) -> web.Response:
    return web.Response(
        status=status,
        body=health.json_body(body),
        content_type="application/json",
        headers={"Cache-Control": "no-store"},
    )
