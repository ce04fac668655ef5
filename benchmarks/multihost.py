"""The service spread over hosts, with a host of each kind killed under load: what a user sees
when a machine goes away, not only a process.

The hosts are network namespaces on this machine (`ip netns`), each with its own loopback and
one address on a private /24 (`--subnet`, by default the first 10.77.N.0/24 this machine does
not route yet), all joined by a bridge that lives in a namespace of its own:

    store   .2   Postgres (a cluster of its own, initdb/pg_ctl) and Redis (append-only file)
    edge1   .11  edge (`python -m chatsite.edge`)      edge2   .12  edge
    sched1  .21  scheduler (`manage.py run_scheduler`) sched2  .22  scheduler
    worker1 .31  worker                                worker2 .32  worker
    (root)  .1   this script: the clients, and the checks against Postgres

Each process listens on its host's address only, so every request, query and stream crosses
the bridge as it would between machines. The processes are those of `benchmarks/stack.py`
(its `Host` runs a process with `ip netns exec`): stand-in workers (`--workers fake`,
`inference/tests/fake_worker.py`) or real vLLM CPU workers (`--workers vllm`,
`manage.py run_worker`, one core each). `INFERENCE_WORKER_ALLOWED_NETWORKS` and
`ALLOWED_HOSTS` of the processes started include the subnet and the edges' addresses.

The clients and phases are those of `benchmarks/chaos.py` (`benchmarks/traffic.py`:
conversation API clients that resume with Last-Event-ID on the other edge, streamed /v1
clients that retry with their Idempotency-Key). Phases (`--phases`):

- `none`: nothing (the control);
- `edge`: every process of edge1's namespace SIGKILLed (`ip netns pids`); its clients go on
  through edge2;
- `scheduler`: sched1 killed so; sched2 adopts its answers (`inference/scheduler/adoption.py`);
- `worker`: worker1 killed so; its answers restart on worker2;
- `partition`: sched1's link taken down for `--partition-down` seconds, then up again (its
  processes live on, cut off from Redis, Postgres and the workers; sched2 adopts its answers
  once its beats lapse, and sched1 must leave them to it when it comes back).

The scheduler, worker and partition faults wait (at most 30 s) until their victim owns or
serves an answer. A killed host's process is started again in its namespace after its phase.
The table, per phase and door, checked against Postgres as chaos' is: answers sent,
completed, restarted, failed visibly, stuck, lost, duplicated, charged twice, uncharged, text
mismatch, and the errors the clients met (each retried request counts); below it the errors
by kind.

    SECRET_KEY=x .venv/bin/python benchmarks/multihost.py --workers fake
    SECRET_KEY=x .venv/bin/python benchmarks/multihost.py --workers vllm

It needs root, `ip` (iproute2), `initdb`, `pg_ctl` and `redis-server`. It writes
benchmarks/results/multihost-<UTC date-time>.txt and .json. Every namespace, link and
process it made is removed at the end, also after an error, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import collections
import ipaddress
import os
import platform
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import chaos  # noqa: E402
from benchmarks.common import render  # noqa: E402
from benchmarks.stack import Host, Stack, StackConfig  # noqa: E402
from benchmarks.traffic import Answer, Edges  # noqa: E402

PHASES = ("none", "edge", "scheduler", "worker", "partition")
# Each host: the last byte of its address and the stack's processes it runs.
HOSTS = {
    "store": (2, ("store",)),
    "edge1": (11, ("edge-0",)),
    "edge2": (12, ("edge-1",)),
    "sched1": (21, ("scheduler-0",)),
    "sched2": (22, ("scheduler-1",)),
    "worker1": (31, ("worker-0",)),
    "worker2": (32, ("worker-1",)),
}
ROOT_BYTE = 1
COLUMNS = (*chaos.COLUMNS, "errors")


class NetworkError(RuntimeError):
    """A namespace or link could not be made (no root, no iproute2, no netns support)."""


def ip(*argv: str, check: bool = True) -> str:
    """`ip argv...`; its output, or NetworkError with what it said."""
    try:
        done = subprocess.run(  # noqa: S603 (our own command line)
            ["ip", *argv],  # noqa: S607 (iproute2 from PATH)
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except FileNotFoundError:
        raise NetworkError("`ip` (iproute2) is not installed") from None
    if check and done.returncode != 0:
        raise NetworkError(f"ip {' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def free_subnet() -> ipaddress.IPv4Network:
    """The first 10.77.N.0/24 that no route of this machine touches (another run's, say)."""
    routed = [
        ipaddress.ip_network(match[1], strict=False)
        for match in re.finditer(r"^(\d+\.\d+\.\d+\.\d+(?:/\d+)?)\s", ip("-4", "route"), re.M)
    ]
    for third in range(256):
        subnet = ipaddress.IPv4Network(f"10.77.{third}.0/24")
        if not any(subnet.overlaps(net) for net in routed):
            return subnet
    raise NetworkError("no free 10.77.N.0/24 subnet")


class Network:
    """The run's namespaces: one per host of `HOSTS`, each with `lo` up and `eth0` on the
    subnet, plugged into a bridge in namespace `<prefix>-net`; this machine reaches it
    through link `<prefix>`. `close()` removes all of it, and the processes inside."""

    def __init__(self, prefix: str, subnet: ipaddress.IPv4Network) -> None:
        self.prefix = prefix
        self.subnet = subnet
        self.made: list[str] = []  # namespaces, in the order made
        self.closed = False

    def ns(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    def address(self, host: str) -> str:
        byte = ROOT_BYTE if host == "root" else HOSTS[host][0]
        return str(self.subnet.network_address + byte)

    def _add_namespace(self, name: str) -> None:
        ip("netns", "add", name)
        self.made.append(name)
        ip("-n", name, "link", "set", "lo", "up")

    def up(self) -> None:
        bridge = self.ns("net")
        self._add_namespace(bridge)
        ip("-n", bridge, "link", "add", "br0", "type", "bridge")
        ip("-n", bridge, "link", "set", "br0", "up")
        length = self.subnet.prefixlen
        for host in HOSTS:
            name = self.ns(host)
            self._add_namespace(name)
            # Made inside the bridge's namespace, so no name of ours touches this machine's.
            ip("-n", bridge, "link", "add", host, "type", "veth", "peer", "name", "eth0",
               "netns", name)  # fmt: skip
            ip("-n", bridge, "link", "set", host, "master", "br0", "up")
            ip("-n", name, "addr", "add", f"{self.address(host)}/{length}", "dev", "eth0")
            ip("-n", name, "link", "set", "eth0", "up")
        ip("link", "add", self.prefix, "type", "veth", "peer", "name", "root", "netns", bridge)
        ip("-n", bridge, "link", "set", "root", "master", "br0", "up")
        ip("addr", "add", f"{self.address('root')}/{length}", "dev", self.prefix)
        ip("link", "set", self.prefix, "up")

    def placement(self) -> dict[str, Host]:
        """The stack's processes on their hosts (`StackConfig.hosts`)."""
        network = str(self.subnet)
        return {
            process: Host(address=self.address(host), netns=self.ns(host), network=network)
            for host, (_, processes) in HOSTS.items()
            for process in processes
        }

    def pids(self, host: str) -> list[int]:
        return [int(pid) for pid in ip("netns", "pids", self.ns(host), check=False).split()]

    def kill_host(self, host: str) -> int:
        """SIGKILL to every process in the host's namespace at once, as a power cut would;
        returns how many there were."""
        pids = self.pids(host)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
        return len(pids)

    def link(self, host: str, *, up: bool) -> None:
        """Plug the host's cable into the bridge, or pull it out."""
        ip("-n", self.ns("net"), "link", "set", host, "up" if up else "down")

    def left(self) -> list[str]:
        """Our namespaces and link still on this machine (none once closed)."""
        names = [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]
        found = [name for name in names if name.startswith(f"{self.prefix}-")]
        if ip("link", "show", self.prefix, check=False):
            found.append(f"link {self.prefix}")
        return found

    def close(self) -> None:
        """Kill what runs in the namespaces, then delete them (their links go with them,
        the bridge's peer on this machine too); never raises, safe to call twice."""
        if self.closed:
            return
        self.closed = True
        for name in reversed(self.made):
            for pid in ip("netns", "pids", name, check=False).split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    continue
        for name in reversed(self.made):
            ip("netns", "del", name, check=False)
        ip("link", "del", self.prefix, check=False)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--workers", choices=("vllm", "fake"), default="fake")
    parser.add_argument(
        "--phases", default="none,edge,scheduler,worker", help=f"of {', '.join(PHASES)}"
    )
    parser.add_argument("--subnet", default="", help="a free /24 (default: 10.77.N.0/24)")
    parser.add_argument("--partition-down", type=float, default=10.0, help="seconds cut off")
    chaos.add_traffic_arguments(parser)
    args = parser.parse_args(argv)
    chaos.check_traffic_arguments(parser, args, PHASES)
    if args.subnet:
        args.subnet = ipaddress.IPv4Network(args.subnet)
        if args.subnet.prefixlen > 24:
            parser.error("--subnet needs room for .32: a /24 or wider")
    return args


class HostFaults:
    """The faults of a phase, on hosts: the first host of each kind is the victim."""

    def __init__(self, network: Network, args: argparse.Namespace) -> None:
        self.network = network
        self.args = args

    def _kill(self, host: str, stack: Stack) -> int:
        killed = self.network.kill_host(host)
        for process in HOSTS[host][1]:
            stack.processes[process].kill()  # reaps it: it is our child
        return killed

    async def inject(
        self,
        phase: str,
        stack: Stack,
        args: argparse.Namespace,
        worker_ids: dict[str, int],
        edges: Edges,
    ) -> tuple[str, Any]:
        assert stack.redis is not None
        if phase == "none":
            return "none", None
        if phase == "edge":
            clients = sum(1 for edge in edges.current.values() if edge == 0)
            killed = self._kill("edge1", stack)
            return f"edge1 down: kill -9 its {killed} processes ({clients} clients on it)", (
                "edge",
                0,
            )
        if phase == "worker":
            victim = stack.worker_urls[0]
            leases = await self._until(
                lambda redis: chaos._leases(redis, worker_ids), victim, stack
            )
            killed = self._kill("worker1", stack)
            return (
                f"worker1 down: kill -9 its {killed} processes "
                f"({leases.get(victim, 0)} answers on it; leases {leases})",
                ("worker", 0),
            )
        owned = await self._until(lambda redis: chaos._owned(redis, stack), "scheduler-0", stack)
        if phase == "scheduler":
            replica = stack.replica_names["scheduler-0"]
            killed = self._kill("sched1", stack)
            return (
                f"sched1 down: kill -9 its {killed} processes (replica {replica}, owning "
                f"{owned.get('scheduler-0', 0)}; owned {owned})",
                ("scheduler", "scheduler-0"),
            )
        started = time.monotonic()
        self.network.link("sched1", up=False)
        try:
            await asyncio.sleep(self.args.partition_down)
        finally:
            self.network.link("sched1", up=True)
        return (
            f"sched1 cut off (link down {time.monotonic() - started:.1f} s, then up; owning "
            f"{owned.get('scheduler-0', 0)}; owned {owned})",
            None,
        )

    async def _until(
        self,
        count: Callable[[Any], dict[str, int]],
        victim: str,
        stack: Stack,
        within: float = 30.0,
    ) -> dict[str, int]:
        """Answers per worker or replica (`count(redis)`), once `victim` has one, or after
        `within` s: a victim that serves nothing would show nothing."""
        assert stack.redis is not None
        deadline = time.monotonic() + within
        with stack.redis.client() as redis:
            while True:
                counts = count(redis)
                if counts.get(victim, 0) > 0 or time.monotonic() > deadline:
                    return counts
                await asyncio.sleep(0.1)


# The report


def errors_of(answers: Sequence[Answer]) -> collections.Counter[str]:
    """What the clients met, by kind: each failed request (retried or not), each error
    shown in an answer."""
    kinds = collections.Counter[str]()
    for answer in answers:
        kinds.update(answer.http_errors)
        if answer.error:
            kinds[f"shown {answer.error}"] += 1
    return kinds


def rows_of(
    result: chaos.PhaseResult,
) -> list[tuple[str, dict[str, int], collections.Counter[str]]]:
    """Per door (and all): chaos' counts, the errors met, and those errors by kind."""
    rows = []
    for door, numbers in chaos.rows_of(result):
        chosen = [a for a in result.answers if door == "all" or a.door == door]
        kinds = errors_of(chosen)
        rows.append((door, {**numbers, "errors": sum(kinds.values())}, kinds))
    return rows


def table(results: Sequence[chaos.PhaseResult]) -> str:
    rows = [
        [result.phase, door, *(str(numbers[c]) for c in COLUMNS)]
        for result in results
        for door, numbers, _ in rows_of(result)
    ]
    return render(["phase", "door", *COLUMNS], rows)


def error_kinds(results: Sequence[chaos.PhaseResult]) -> list[str]:
    lines = ["errors the clients met, by kind (per phase and door):"]
    for result in results:
        for door, _, kinds in rows_of(result):
            if door == "all" or not kinds:
                continue
            shown = ", ".join(f"{kind} x{count}" for kind, count in kinds.most_common())
            lines.append(f"  {result.phase:9} {door:13} {shown}")
    return lines if len(lines) > 1 else [*lines, "  none"]


def topology(network: Network, stack: Stack) -> list[str]:
    lines = [f"hosts (network namespaces {network.prefix}-*, bridge on {network.subnet}):"]
    lines.append(f"  {'root':8} {network.address('root'):14} the clients and the checks")
    for host, (_, processes) in HOSTS.items():
        what = "Postgres, Redis" if processes == ("store",) else ", ".join(processes)
        lines.append(f"  {host:8} {network.address(host):14} {what}")
    return lines


def report(
    args: argparse.Namespace,
    network: Network,
    stack: Stack,
    results: Sequence[chaos.PhaseResult],
) -> str:
    header = [
        f"multihost benchmark, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
        f"2 edges, 2 scheduler replicas, 2 {stack.config.workers} workers, Postgres and Redis "
        f"(appendonly yes), each host a network namespace",
        f"{args.clients} conversation API + {args.v1_clients} streamed /v1 clients, think "
        f"<= {args.think} s, {args.max_tokens} tokens per answer; fault {args.lead} s after the "
        f"first sends (once answers run), sends for {args.after} s more; deadline "
        f"{args.deadline:.0f} s per answer",
        "",
        *topology(network, stack),
        "",
    ]
    body = [table(results), "", *error_kinds(results), "", *chaos.details(results)]
    return "\n".join([*header, *body])


def as_json(
    args: argparse.Namespace, network: Network, results: Sequence[chaos.PhaseResult]
) -> dict[str, Any]:
    data = chaos.as_json(args, results)
    data["columns"] = list(COLUMNS)
    data["hosts"] = {host: network.address(host) for host in ("root", *HOSTS)}
    for phase, result in zip(data["phases"], results, strict=True):
        phase["rows"] = {door: numbers for door, numbers, _ in rows_of(result)}
        phase["errors"] = {door: dict(kinds) for door, _, kinds in rows_of(result)}
    return data


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM as SystemExit, so that the `finally` below removes what was made.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    network = Network(f"mh{secrets.token_hex(3)}", args.subnet or free_subnet())
    atexit.register(network.close)
    folder = Path(tempfile.mkdtemp(prefix="multihost-"))
    print(f"network {network.prefix} on {network.subnet}; stack in {folder}", flush=True)
    edges = ",".join(network.address(host) for host in ("edge1", "edge2"))
    # Every process started from here inherits these (the stack copies this environment).
    os.environ["INFERENCE_WORKER_ALLOWED_NETWORKS"] = f"127.0.0.0/8,::1/128,{network.subnet}"
    config = StackConfig(
        edges=2,
        schedulers=2,
        workers=args.workers,
        worker_count=2,
        fake_tokens=args.fake_tokens,
        fake_token_delay=args.fake_token_delay,
        env={
            "ALLOWED_HOSTS": f"localhost,127.0.0.1,{edges}",
            # Heartbeats often, so that a client notices a dead connection within seconds.
            "STREAM_HEARTBEAT_SECONDS": "2",
            "SCHEDULER_MAX_QUEUE_SECONDS": "600",
        },
        hosts=network.placement(),
    )
    tag = secrets.token_hex(3)
    faults = HostFaults(network, args)
    try:
        network.up()
        with Stack(folder, config) as stack:
            worker_ids, users = chaos.bring_up(stack, args, f"multihost-{tag}")
            results = asyncio.run(
                chaos.run(args, stack, worker_ids, users, tag, inject=faults.inject)
            )
            text = report(args, network, stack, results)
    finally:
        network.close()
        if not args.keep:
            for data in (folder / "postgres", folder / "redis"):
                shutil.rmtree(data, ignore_errors=True)
    left = network.left()
    text += f"\n\nleft behind: {', '.join(left) if left else 'no namespace, no link'}"
    print(text)
    path = chaos.save(args, text, as_json(args, network, results), name="multihost")
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    print(f"\nwritten to {shown} (and .json); logs in {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
