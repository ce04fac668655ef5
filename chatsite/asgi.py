"""ASGI entry point, served by the edge (`python -m chatsite.edge`, uvicorn).

HTTP (pages, the JSON API, SSE streams) goes to Django; Channels' router leaves room
for other protocols without another process. The operator's endpoints (`/healthz`,
`/readyz`, `/metrics`) are answered ahead of Django (`chatsite.ops`).
"""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")

# Django must be set up before anything imports models (as `get_asgi_application` does).
django.setup(set_prefix=False)

from chatsite import tracing  # noqa: E402
from chatsite.threads import EdgeHandler  # noqa: E402

# Spans of the turns this edge accepts, if an OTLP endpoint is configured.
tracing.configure("chatsite-edge")

# Django's handler, with each request's thread-sensitive code on a reused thread.
django_asgi_app = EdgeHandler()

from channels.routing import ProtocolTypeRouter  # noqa: E402

from chatsite import health, metrics  # noqa: E402
from chatsite.ops import OpsEndpoints  # noqa: E402
from inference.selectors import pools_without_healthy_worker  # noqa: E402

# The edge is ready while the database and Redis answer and every active pool has a worker.
READINESS = {
    "database": health.database_answers,
    "redis": health.redis_answers,
    "workers": health.database_check(pools_without_healthy_worker),
}

application = ProtocolTypeRouter(
    {
        "http": OpsEndpoints(
            django_asgi_app, checks=READINESS, collectors=[metrics.CeleryQueueCollector()]
        )
    }
)

# An edge process replacing one that died: the dead one's streams are no longer relayed.
metrics.forget_dead_processes()

from chatsite.edge import tune_gc, warm_up  # noqa: E402

# What an edge process's first message would load, loaded as the process starts (see
# `EDGE_WARM_UP`); before `tune_gc`, so it is frozen with the rest.
warm_up()

# Loaded once per edge process: from here on its garbage is collected as an edge can afford.
tune_gc()
