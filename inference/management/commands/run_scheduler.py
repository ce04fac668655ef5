"""`python manage.py run_scheduler`: one scheduler replica, until SIGINT or SIGTERM.

The replica runs on uvloop, as the edge does: its work is mostly small socket reads and
writes (Redis commands, the workers' streamed chunks), and uvloop's event loop and transports
cost less CPU per one of them than asyncio's own (a redis-py command: about 15% less, measured
here).
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import uvloop
from django.conf import settings
from django.core.management.base import BaseCommand

from chatsite import tracing
from inference.scheduler import Scheduler


class Command(BaseCommand):
    help = "Run a scheduler replica: admit queued generations to workers and stream answers."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--replica-id", help="A name for this replica (default: host-pid).")
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=settings.SCHEDULER_METRICS_PORT,
            help="Serve /metrics, /healthz and /readyz on this port; 0: not at all "
            "(default: SCHEDULER_METRICS_PORT).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # Spans of the generations it serves, if an OTLP endpoint is configured.
        tracing.configure("chatsite-scheduler")
        uvloop.run(self._run(options.get("replica_id"), options["metrics_port"]))

    async def _run(self, replica_id: str | None, metrics_port: int) -> None:
        scheduler = Scheduler(replica_id=replica_id, metrics_port=metrics_port)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, scheduler.stop)
        self.stdout.write(f"scheduler {scheduler.replica_id} running")
        await scheduler.run()
