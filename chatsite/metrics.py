"""The service's own Prometheus metrics: the edge's, and how any process exposes its metrics.

Every metric is named `chatsite_*` and defined once, in the module of the layer that counts
it: this one (the edge's streams, Celery's queue), `inference.metrics` (the scheduler's SLOs,
admissions, outcomes) and `moderation.metrics` (trips). Each site that counts does so in one
line.

The edge forks several processes (`python -m chatsite.edge --workers N`), and a scrape reaches
one of them: prometheus_client's multiprocess mode has each process write its values to files
in `PROMETHEUS_MULTIPROC_DIR` (the launcher makes a fresh folder when the variable is unset)
and a scrape sums them (`exposition`). Counters and histograms are summed over the processes;
the per-process series (active streams, events delivered) keep a `pid` label. The scheduler
is one process and exposes its own values the same way, on its own port.

`/metrics` is an operator's endpoint on a public port: only clients in
`METRICS_ALLOWED_NETWORKS` get it (`metrics_allowed`).
"""

from __future__ import annotations

import glob
import ipaddress
import logging
import os
from collections.abc import Iterable, Iterator
from functools import lru_cache

from django.conf import settings
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
    multiprocess,
)
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from chatsite.redis import REDIS_FAULTS, shared_redis

logger = logging.getLogger(__name__)

MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"

# Per edge process: a gauge file per process, dropped when the process is found dead
# (`forget_dead_processes`), so the live ones are all a scrape shows.
EDGE_ACTIVE_STREAMS = Gauge(
    "chatsite_edge_active_streams",
    "Event streams (SSE) this edge process relays now.",
    multiprocess_mode="liveall",
)
EDGE_EVENTS_DELIVERED = Counter(
    "chatsite_edge_events_delivered",
    "Stream events this edge process has relayed to its clients.",
    ["pid"],
)
# This process's child: a label lookup per event would cost the hot path for nothing.
EDGE_EVENTS = EDGE_EVENTS_DELIVERED.labels(pid=str(os.getpid()))

# Where kombu's Redis transport keeps a queue's tasks of priority > 0: the queue's name, this
# separator and the step (its default steps 0, 3, 6, 9; step 0 is the plain name).
CELERY_PRIORITY_SEPARATOR = "\x06\x16"
CELERY_PRIORITY_STEPS = (3, 6, 9)


def exposition(extra: Iterable[Collector] = ()) -> tuple[bytes, str]:
    """The body and content type of a scrape: this process's metrics (every edge process's,
    summed, in multiprocess mode) and the `extra` collectors, read now."""
    registry = CollectorRegistry(auto_describe=False)
    path = os.environ.get(MULTIPROC_DIR_ENV)
    if path:
        multiprocess.MultiProcessCollector(registry, path=path)
    else:
        registry.register(_ProcessRegistry())
    for collector in extra:
        registry.register(collector)
    return generate_latest(registry), CONTENT_TYPE_LATEST


class _ProcessRegistry(Collector):
    """The process's default registry, as one collector of a scrape's registry."""

    def collect(self) -> Iterator[Metric]:
        return iter(REGISTRY.collect())


class CeleryQueueCollector(Collector):
    """`chatsite_celery_queue_length{queue}`: the tasks waiting in each Celery queue, read from
    the broker's Redis lists at scrape time (nothing is counted between scrapes)."""

    def collect(self) -> Iterator[Metric]:
        queues = celery_queues()
        family = GaugeMetricFamily(
            "chatsite_celery_queue_length",
            "Celery tasks waiting in the broker, by queue.",
            labels=["queue"],
        )
        try:
            redis = shared_redis(settings.CELERY_BROKER_URL)
            with redis.pipeline(transaction=False) as pipe:
                for name in queues:
                    pipe.llen(name)
                    for step in CELERY_PRIORITY_STEPS:
                        pipe.llen(f"{name}{CELERY_PRIORITY_SEPARATOR}{step}")
                lengths = pipe.execute()
        except REDIS_FAULTS as exc:
            logger.warning("Celery's queue lengths: the broker does not answer (%r)", exc)
            return
        per_queue = len(CELERY_PRIORITY_STEPS) + 1
        for index, name in enumerate(queues):
            family.add_metric([name], sum(lengths[index * per_queue : (index + 1) * per_queue]))
        yield family

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("chatsite_celery_queue_length", "", labels=["queue"])


def celery_queues() -> list[str]:
    """The queues the project's tasks go to: the default one, and any a route names."""
    names = {getattr(settings, "CELERY_TASK_DEFAULT_QUEUE", "celery")}
    routes = getattr(settings, "CELERY_TASK_ROUTES", None) or {}
    if isinstance(routes, dict):
        names |= {str(route["queue"]) for route in routes.values() if "queue" in route}
    return sorted(names)


@lru_cache(maxsize=1)
def _allowed_networks(
    spec: tuple[str, ...],
) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(net.strip(), strict=False) for net in spec if net.strip())


def metrics_allowed(address: str | None) -> bool:
    """Whether a client at `address` may read `/metrics` (`METRICS_ALLOWED_NETWORKS`)."""
    if not address:
        return False
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    networks = _allowed_networks(tuple(settings.METRICS_ALLOWED_NETWORKS))
    return any(ip.version == net.version and ip in net for net in networks)


def forget_dead_processes(path: str | None = None) -> int:
    """Drop the live-gauge files of processes of the multiprocess folder that are gone (an
    edge process that died and was replaced): their streams are no longer relayed. Their
    counters stay, so that totals never go back. Returns how many processes were dropped."""
    folder = path or os.environ.get(MULTIPROC_DIR_ENV)
    if not folder:
        return 0
    dead = set()
    for name in glob.glob(os.path.join(folder, "gauge_live*_*.db")):
        pid = int(os.path.basename(name).rsplit("_", 1)[1].removesuffix(".db"))
        if not _alive(pid):
            dead.add(pid)
    for pid in dead:
        multiprocess.mark_process_dead(pid, folder)
    return len(dead)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
