"""The edge's operator endpoints, answered before Django: `/healthz`, `/readyz`, `/metrics`.

They are served by every edge process on the edge's own port, ahead of the middleware, so
that a store that is down makes `/readyz` say so (503, the failing checks named) instead of
failing inside a middleware that reads it. `/metrics` answers only to clients in
`METRICS_ALLOWED_NETWORKS` (`chatsite.metrics.metrics_allowed`; behind the TLS proxy, the
client's address comes from the proxy's headers, `EDGE_FORWARDED_ALLOW_IPS`) and is a 404
for everyone else, as if it did not exist. `/readyz` tells those others which checks fail, but
not why.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client.registry import Collector

from chatsite import health, metrics

HEALTHZ_PATH = "/healthz"
READYZ_PATH = "/readyz"
METRICS_PATH = "/metrics"


class OpsEndpoints:
    """Wraps the edge's ASGI application: answers the three paths, passes the rest on."""

    def __init__(
        self,
        app: Any,
        *,
        checks: Mapping[str, health.Check],
        collectors: Iterable[Collector] = (),
    ) -> None:
        self.app = app
        self.checks = checks
        self.collectors = list(collectors)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path") if scope["type"] == "http" else None
        if path not in (HEALTHZ_PATH, READYZ_PATH, METRICS_PATH):
            await self.app(scope, receive, send)
            return
        client = scope.get("client") or (None, None)
        operator = metrics.metrics_allowed(client[0])
        if path == HEALTHZ_PATH:
            status, body = health.alive()
            await _respond(send, status, "application/json", health.json_body(body))
        elif path == READYZ_PATH:
            status, body = await health.readiness(self.checks)
            body = body if operator else health.without_reasons(body)
            await _respond(send, status, "application/json", health.json_body(body))
        elif not operator:
            await _respond(send, 404, "text/plain", b"Not Found")
        else:
            # Reading the multiprocess files and the broker blocks: off the event loop.
            payload, content_type = await asyncio.to_thread(metrics.exposition, self.collectors)
            await _respond(send, 200, content_type, payload)


async def _respond(send: Any, status: int, content_type: str, body: bytes) -> None:
    headers = [(b"content-type", content_type.encode()), (b"cache-control", b"no-store")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
