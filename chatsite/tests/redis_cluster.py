"""A real Redis Cluster of three masters on this machine, for the suite's cluster runs.

`LocalCluster.start()` starts three `redis-server --cluster-enabled yes` on free ports in a
temporary folder, joins them with `redis-cli --cluster create` (no replicas) and returns once
every node says `cluster_state:ok`; `stop()` ends the three processes and removes the folder.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

from redis import Redis
from redis.exceptions import RedisError

from chatsite.testing import budget, wait_until

MASTERS = 3
# A cluster node also listens on its port + 10000 (the cluster bus).
BUS_OFFSET = 10_000
# The budget for each step of the start (scaled): only the point where a start that is not
# coming is reported; a node that is ready is taken at once.
READY_SECONDS = 60.0
# A node's answer to one probe (each probe that fails is simply asked again).
PROBE_SECONDS = 5.0


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_ports(count: int) -> list[int]:
    """Ports free now whose cluster bus port is free too."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port + BUS_OFFSET < 65536 and port not in ports and _free(port + BUS_OFFSET):
            ports.append(port)
    return ports


class LocalCluster:
    """Three cluster masters in a temporary folder (see the module's docstring)."""

    def __init__(self) -> None:
        self.server = shutil.which("redis-server") or "redis-server"
        self.cli = shutil.which("redis-cli") or "redis-cli"
        self.folder = Path(tempfile.mkdtemp(prefix="redis-cluster-"))
        self.ports = _free_ports(MASTERS)
        self.processes: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}"

    def start(self) -> LocalCluster:
        try:
            for port in self.ports:
                self.processes.append(self._server(port))
            for port in self.ports:
                self._until(partial(self._ping, port), f"node {port} to answer")
            subprocess.run(  # noqa: S603 (our own command line)
                [
                    self.cli,
                    "--cluster",
                    "create",
                    *(f"127.0.0.1:{port}" for port in self.ports),
                    "--cluster-replicas",
                    "0",
                    "--cluster-yes",
                ],
                check=True,
                capture_output=True,
                timeout=budget(READY_SECONDS),
            )
            for port in self.ports:
                self._until(partial(self._ready, port), f"node {port} to be ready")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                # Then killed: a node slow to exit costs no failure.
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes.clear()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _server(self, port: int) -> subprocess.Popen[bytes]:
        folder = self.folder / str(port)
        folder.mkdir()
        return subprocess.Popen(  # noqa: S603 (our own command line)
            [
                self.server,
                "--port", str(port),
                "--bind", "127.0.0.1",
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--dir", str(folder),
                "--save", "",
                "--appendonly", "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def _ping(self, port: int) -> bool:
        try:
            with Redis(port=port, socket_timeout=budget(PROBE_SECONDS)) as node:
                return bool(node.ping())
        except RedisError:  # not listening yet
            return False

    def _ready(self, port: int) -> bool:
        try:
            with Redis(
                port=port, socket_timeout=budget(PROBE_SECONDS), decode_responses=True
            ) as node:
                info = node.execute_command("CLUSTER", "INFO")
        except RedisError:  # asked again
            return False
        return "cluster_state:ok" in str(info)

    def _until(self, condition: Callable[[], bool], what: str) -> None:
        """Poll a readiness condition (not a timing assumption); fail at once if a node
        exited, or after the budget."""

        def met() -> bool:
            if any(process.poll() is not None for process in self.processes):
                raise RuntimeError(f"a redis-server of the cluster exited waiting for {what}")
            return condition()

        wait_until(met, within=READY_SECONDS, what=f"the local Redis Cluster: {what}")
