"""The edge process: uvicorn serving the project's ASGI application.

    python -m chatsite.edge --port 8000 --workers 2

One command starts the edge everywhere: `make run` (Procfile), the suite's live edge and the
benchmarks. uvicorn runs on uvloop with the httptools parser; `--workers N` forks N processes
that share the listening socket (default `EDGE_WORKERS`, else one per core), so a busy
process does not hold up the others' requests. Every process serves every stream: each reads
Redis through its own multiplexed reader (`chatsite.stream_hub`).

In production, put the edge behind a proxy that terminates TLS and pass `--forwarded-allow-ips`
with the proxy's address, so the client's address and scheme come from its headers.

Its processes count their metrics in files of one folder, which a scrape of any of them sums
(`chatsite.metrics`): `PROMETHEUS_MULTIPROC_DIR`, emptied at start, or else a fresh folder
made here and removed when the edge stops.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chatsite import logs

APPLICATION = "chatsite.asgi:application"
# Named as prometheus_client reads it, in every process, before it is first imported.
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
# The collector's thresholds in an edge process (Python's defaults: 700, 10, 10). An edge holds
# many live objects (every open stream's request, response and generators) and allocates a
# few per event; at the defaults, collections of the older generations walked all of them
# over and over: at 1,000 streams x 20 events/s they showed as half of its py-spy samples
# and put the p99 delivery delay past a second (215 ms at these thresholds).
GC_THRESHOLDS = (50_000, 20, 100)
# How often an edge process's server looks whether it should stop (`quiet_server_class`).
TICK_SECONDS = 1.0
# On SIGTERM, the seconds open responses (streams last minutes) get before they are cut; the
# clients reconnect with Last-Event-ID to another process and lose nothing.
GRACEFUL_SECONDS = 5


def tune_gc() -> None:
    """Collect garbage as an edge can afford (see `GC_THRESHOLDS`); called as each edge
    process loads the application, and the objects loaded by then are left out of
    collections for good (`gc.freeze`)."""
    gc.set_threshold(*GC_THRESHOLDS)
    gc.freeze()


def warm_up() -> None:
    """Run each of `settings.EDGE_WARM_UP` (dotted paths of functions without arguments), as
    each edge process loads the application."""
    from django.conf import settings

    from chatsite import dotted

    for path in settings.EDGE_WARM_UP:
        dotted.load_callable("EDGE_WARM_UP", path)()


def default_workers() -> int:
    return int(os.environ.get("EDGE_WORKERS") or os.cpu_count() or 1)


def command(
    port: int,
    *,
    host: str = "127.0.0.1",
    workers: int = 1,
    application: str = APPLICATION,
) -> list[str]:
    """The command line of an edge serving `application` on `host:port`."""
    return [
        sys.executable,
        "-m",
        "chatsite.edge",
        *("--host", host, "--port", str(port), "--workers", str(workers)),
        *("--application", application),
    ]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m chatsite.edge", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get("EDGE_PORT") or 8000))
    parser.add_argument("--workers", type=int, default=default_workers())
    parser.add_argument("--application", default=APPLICATION)
    parser.add_argument(
        "--forwarded-allow-ips",
        default=os.environ.get("EDGE_FORWARDED_ALLOW_IPS") or "127.0.0.1",
        help="the proxies whose X-Forwarded-* headers are trusted",
    )
    return parser.parse_args(argv)


def metrics_folder() -> tuple[Path, bool]:
    """The folder the edge's processes count their metrics in, emptied, and whether it was
    made here (and is removed when the edge stops). The values of a previous run are not this
    run's: prometheus_client sums every file it finds there."""
    given = os.environ.get(METRICS_DIR_ENV)
    if not given:
        folder = Path(tempfile.mkdtemp(prefix="chatsite-edge-metrics-"))
        os.environ[METRICS_DIR_ENV] = str(folder)
        return folder, True
    folder = Path(given)
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("*.db"):
        stale.unlink()
    return folder, False


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
    folder, made_here = metrics_folder()
    try:
        serve(args)
    finally:
        if made_here:
            shutil.rmtree(folder, ignore_errors=True)


def serve(args: argparse.Namespace) -> None:
    import uvicorn

    # uvicorn's own lines (start, stop, an error outside Django) as the service's, in JSON
    # too; in text, as uvicorn writes them.
    log_config: Any = uvicorn.config.LOGGING_CONFIG
    if (os.environ.get("LOG_FORMAT") or "text") == "json":
        log_config = logs.logging_config("json", os.environ.get("LOG_LEVEL", "INFO"))
    options: dict[str, Any] = {
        "host": args.host,
        "port": args.port,
        "loop": "uvloop",
        "http": "httptools",
        "lifespan": "off",
        "access_log": False,
        "server_header": False,
        "forwarded_allow_ips": args.forwarded_allow_ips,
        "log_config": log_config,
        "timeout_graceful_shutdown": GRACEFUL_SECONDS,
    }
    app_dir = str(Path(__file__).resolve().parent.parent)
    if args.workers > 1:
        # uvicorn's supervisor makes each process's server itself.
        uvicorn.run(args.application, workers=args.workers, app_dir=app_dir, **options)
        return
    # One process: what `uvicorn.run` does, with a server that wakes once a second.
    sys.path.insert(0, app_dir)
    server = quiet_server_class()(config=uvicorn.Config(args.application, **options))
    server.run()
    if not server.started:
        sys.exit(uvicorn.config.STARTUP_FAILURE)


def quiet_server_class() -> type[Any]:
    """uvicorn's `Server`, ticking once a second instead of ten times. Its tick refreshes
    the Date header (once a second either way) and looks whether it was told to stop: idle,
    those ten wake-ups a second were most of an edge process's CPU. A stop is seen within a
    second (then `GRACEFUL_SECONDS` for open responses, as before)."""
    import asyncio

    import uvicorn

    class QuietServer(uvicorn.Server):
        async def main_loop(self) -> None:
            counter = 0  # uvicorn's tick count, a multiple of ten: each tick is a second
            while not await self.on_tick(counter):
                counter = (counter + 10) % 864_000
                await asyncio.sleep(TICK_SECONDS)

    return QuietServer


if __name__ == "__main__":
    main()
