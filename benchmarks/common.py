"""What every benchmark script shares: percentiles, aligned tables, its own database."""

from __future__ import annotations

import logging
import math
import os
import socket
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between the closest ranks, as numpy's default."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def ratio(value: float, reference: float) -> str:
    """`value / reference` for a table, or "-" where either is missing (zero or NaN)."""
    if not reference or value != value or reference != reference:
        return "-"
    return f"{value / reference:.2f}"


def render(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table: first column left-aligned, the others right-aligned."""
    widths = [max(len(str(row[i])) for row in [headers, *rows]) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        first, *rest = cells
        return "  ".join(
            [first.ljust(widths[0]), *(c.rjust(w) for c, w in zip(rest, widths[1:], strict=True))]
        )

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(row) for row in rows)])


def ensure_database(database: Mapping[str, Any]) -> None:
    """Create the benchmark's own database (Django's DATABASES entry) if it is missing."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(
        dbname="postgres",
        user=database.get("USER") or None,
        password=database.get("PASSWORD") or None,
        host=database.get("HOST") or None,
        port=str(database.get("PORT") or "") or None,
        autocommit=True,
    ) as connection:
        name = str(database["NAME"])
        exists = connection.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (name,)
        ).fetchone()
        if not exists:
            connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def prepare_stores() -> None:
    """Create and migrate the benchmark's database; refuse Redis db 0 and flush the one given.

    Both refusals protect real data: the database's name must contain "bench", and db 0 is
    the one `make run` uses. Rows of earlier runs stay (each run makes its own user).
    """
    from django.conf import settings
    from django.core.management import call_command

    from chatsite.redis import sync_redis

    database = settings.DATABASES["default"]
    if database["ENGINE"] != "django.db.backends.postgresql":
        raise SystemExit("DATABASE_URL must name a Postgres database (postgres://.../x_bench).")
    if "bench" not in str(database["NAME"]):
        raise SystemExit(f"Refusing database {database['NAME']!r}: its name must contain 'bench'.")
    redis = sync_redis()
    if int(redis.connection_pool.connection_kwargs.get("db", 0)) == 0:
        raise SystemExit("Refusing Redis db 0 (it is flushed at start): use another db number.")
    ensure_database(database)
    call_command("migrate", verbosity=0, interactive=False)
    redis.flushdb()
    redis.close()


def django_start(*, database_url: str | None = None, redis_url: str | None = None) -> None:
    """Start Django for a benchmark: its own database and Redis unless the environment names
    others, and no log line per HTTP request (readiness probes would flood the output)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
    if database_url:
        os.environ.setdefault("DATABASE_URL", database_url)
    if redis_url:
        os.environ.setdefault("REDIS_URL", redis_url)
    import django

    django.setup()
    logging.getLogger("httpx").setLevel(logging.WARNING)


def write_result(directory: Path, name: str, text: str) -> Path:
    """Save a benchmark's report as `<directory>/<name>-<UTC date-time>.txt`; returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}-{datetime.now(UTC):%Y%m%d-%H%M%S}.txt"
    path.write_text(text if text.endswith("\n") else text + "\n")
    return path


def worker_urls(text: str) -> list[str]:
    """The workers' base URLs from a comma-separated `--workers`."""
    return [url.strip().rstrip("/") for url in text.split(",") if url.strip()]


def free_port() -> int:
    """A TCP port on the loopback nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def service_env() -> dict[str, str]:
    """The environment of the edge and scheduler processes a benchmark starts."""
    return {
        # The benchmarks' workers listen on the loopback, which the service refuses to reach
        # unless told (a run without it waited for workers it would never call).
        "INFERENCE_WORKER_ALLOWED_NETWORKS": "127.0.0.0/8,::1/128",
        **os.environ,
        "DEBUG": "0",
        "INFERENCE_WORKERS": "",
        # Latency under load is measured, not turned into rejections.
        "SCHEDULER_MAX_QUEUE_SECONDS": "600",
        # Every request comes from one address: the per-address abuse limit would refuse them.
        "RATE_LIMIT_MESSAGE_POST": "1000000/m",
        "LOG_LEVEL": "WARNING",
    }


def edge_command(port: int, *, workers: int = 1, host: str = "127.0.0.1") -> list[str]:
    """The command line of one edge (`chatsite.edge`) on `host`:`port`."""
    from chatsite import edge

    return edge.command(port, host=host, workers=workers)
