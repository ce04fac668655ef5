"""A whole service of its own, as process groups that can be killed and started again: what
the fault and soak benchmarks (`chaos.py`, `soak.py`) run against.

- `Postgres`: a cluster of its own (`initdb`, `pg_ctl`, from `pg_config --bindir`) in a
  temporary folder on a free port, so that restarting it disturbs no other database of the
  machine. As root, its programs run as the `postgres` user (initdb refuses root).
- `RedisServer`: `redis-server` on a free port with an append-only file (`--appendonly yes`,
  the persistence the service needs: queued jobs, leases and streams must survive a restart).
- `Stack`: both stores, the migrations, then workers (real vLLM CPU workers through
  `manage.py run_worker`, the suite's stand-in `inference/tests/fake_worker.py` as processes
  of their own, or workers already running), scheduler replicas (`manage.py run_scheduler`),
  edges (`python -m chatsite.edge`) and, if asked, a Celery worker. Each process is the leader
  of its own process group, so a kill reaches every process under it (vLLM's engine, Celery's
  prefork children) and `close()` leaves nothing behind; use it as a context manager.
- `Host`: where a process runs. By default all listen on this machine's loopback; a stack
  given hosts (`StackConfig.hosts`) runs each named process in a network namespace
  (`ip netns exec`) listening on that namespace's address, as on a host of its own
  (`multihost.py` builds the namespaces).
- `Process.rss()`: the resident memory of a process group, for the soak's growth figures.
- `key_census`: every Redis key, grouped by pattern, with or without a TTL.

Run as a script it is one stand-in worker on a given port (`stack.py fake-worker --port P`),
so that a stand-in can be killed with SIGKILL like a real one and started again where it was.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import free_port  # noqa: E402

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
DATABASE_NAME = "chatsite_bench"
# Environment every process of the stack gets unless the caller's environment says otherwise:
# the workers and MCP servers here listen on the loopback, and plugin secrets need a key.
DEFAULT_ENV = {
    "INFERENCE_WORKER_ALLOWED_NETWORKS": "127.0.0.0/8,::1/128",
    "PLUGINS_MCP_ALLOWED_NETWORKS": "127.0.0.0/8,::1/128",
    "PLUGINS_ENCRYPTION_KEY": "bench-only-key",
    "SECURE_COOKIES": "0",
    "HF_HUB_OFFLINE": "1",
}


# Every process a stack starts carries this variable, set to the stack's folder: what is
# left of a stack after it closed can be found (`leftovers`) and nothing else is touched.
STACK_MARKER = "CHATSITE_BENCH_STACK"


def leftovers(folder: Path | str) -> list[int]:
    """The pids of processes of the stack in `folder` still running (not this one)."""
    marker = f"{STACK_MARKER}={folder}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


class StackError(RuntimeError):
    """A process of the stack did not start or did not come back."""


@dataclass(frozen=True)
class Host:
    """Where a process of the stack runs and listens: this machine's loopback (the default),
    or network namespace `netns` (made beforehand with `ip netns add`) at `address`, whose
    stores let in clients from `network`."""

    address: str = "127.0.0.1"
    netns: str = ""
    network: str = ""

    def wrap(self, command: Sequence[str], *, user: str | None = None) -> list[str]:
        """`command` as run on this host, as `user` when given: `ip netns exec` needs root, so
        the user changes inside the namespace (`runuser`)."""
        wrapped = list(command)
        if user is not None:
            wrapped = ["runuser", "-u", user, "--", *wrapped]
        if self.netns:
            wrapped = ["ip", "netns", "exec", self.netns, *wrapped]
        return wrapped


LOCAL = Host()


def wait_until(
    ready: Any, *, within: float, what: str, every: float = 0.2, alive: Any = None
) -> None:
    """Poll `ready()` (exceptions count as not yet) until true; StackError after `within` s,
    or at once if `alive()` says the process it waits for is gone."""
    deadline = time.monotonic() + within
    while True:
        try:
            if ready():
                return
        except Exception:  # noqa: S110 (not up yet: any failure means try again)
            pass
        if alive is not None and not alive():
            raise StackError(f"{what}: the process exited")
        if time.monotonic() > deadline:
            raise StackError(f"{what}: not ready within {within:.0f} s")
        time.sleep(every)


def _run_as() -> str | None:
    """The user the database's programs run as: `postgres` when we are root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise StackError("running as root needs a 'postgres' user for initdb") from None
    return "postgres"


def process_group(leader: int) -> list[int]:
    """The pids of every process whose process group is `leader`'s."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # Fields after the command's closing parenthesis: state, ppid, pgrp, ...
            group = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2])
        except (OSError, IndexError, ValueError):
            continue
        if group == leader:
            found.append(int(entry.name))
    return found


def rss_bytes(pid: int) -> int:
    """Resident memory of one process (0 once it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return 0


@dataclass
class Process:
    """One process of the stack, leader of its own process group."""

    name: str
    kind: str
    command: list[str]
    env: dict[str, str]
    log: Path
    host: Host = LOCAL
    popen: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> Process:
        with self.log.open("ab") as log:
            log.write(f"\n=== start {self.starts + 1} at {time.time():.3f}\n".encode())
        self.popen = subprocess.Popen(  # noqa: S603 (our own command line)
            self.host.wrap(self.command),
            cwd=ROOT,
            env=self.env,
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.starts += 1
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None, f"{self.name} was never started"
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def rss(self) -> int:
        """Resident bytes of the whole group (a worker's engine, Celery's children)."""
        if not self.alive():
            return 0
        return sum(rss_bytes(pid) for pid in process_group(self.pid))

    def kill(self) -> None:
        """SIGKILL to every process of the group, as a machine or an OOM killer would."""
        if self.popen is None:
            return
        self._signal_group(signal.SIGKILL)
        self.popen.wait()

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, then SIGKILL for what is left of the group after `timeout`."""
        if self.popen is None:
            return
        if self.popen.poll() is None:
            self._signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=timeout)
        # The leader may be gone with children left (vLLM's engine core): kill the rest.
        self._signal_group(signal.SIGKILL)
        self.popen.wait()

    def _signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signum)

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Postgres:
    """A Postgres cluster of its own in `folder`, on a free port of `host` (the loopback)."""

    def __init__(self, folder: Path, host: Host = LOCAL) -> None:
        self.folder = folder
        self.host = host
        self.data = folder / "data"
        self.log = folder / "postgres.log"
        self.port = free_port()
        self.user = _run_as()
        self.bindir = postgres_bindir()

    def url(self, database: str = DATABASE_NAME) -> str:
        return f"postgres://postgres@{self.host.address}:{self.port}/{database}"

    def _run(self, *argv: str, timeout: float = 120) -> None:
        command, user = [str(self.bindir / argv[0]), *argv[1:]], self.user
        if self.host.netns:
            command, user = self.host.wrap(command, user=user), None
        done = subprocess.run(  # noqa: S603 (our own command line)
            command,
            cwd=self.folder,
            user=user,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise StackError(f"{argv[0]} {argv[1:]} failed: {done.stdout}{done.stderr}")

    def init(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.user is not None:
            shutil.chown(self.folder, user=self.user)
        # --no-sync: only the initial files; the running server syncs as usual.
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync")
        if self.host.network:  # initdb lets in the loopback only
            with (self.data / "pg_hba.conf").open("a") as hba:
                hba.write(f"host all all {self.host.network} trust\n")

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.folder} -c listen_addresses={self.host.address}"
            " -c max_connections=300"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o",
                  options, "start")  # fmt: skip

    def restart(self, mode: str = "fast") -> None:
        """`pg_ctl restart -m fast` (clients cut, a clean shutdown) or `-m immediate` (no
        shutdown checkpoint: crash recovery on start, as after a kill)."""
        # -l again: the new postmaster must not write to (and hold open) our pipes.
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-m",
                  mode, "restart")  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "30", "-m", mode, "stop")
        except (StackError, subprocess.TimeoutExpired):
            postmaster = self.postmaster_pid()
            if postmaster:
                os.kill(postmaster, signal.SIGKILL)

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            return None

    def create_database(self, name: str = DATABASE_NAME) -> None:
        self._run("createdb", "-h", self.host.address, "-p", str(self.port), "-U", "postgres", name)


def postgres_bindir() -> Path:
    """Where initdb and pg_ctl are: `pg_config --bindir`, else beside `initdb` on the PATH."""
    pg_config = shutil.which("pg_config")
    if pg_config:
        done = subprocess.run(  # noqa: S603 (fixed argv)
            [pg_config, "--bindir"], capture_output=True, text=True, check=False
        )
        bindir = Path(done.stdout.strip())
        if (bindir / "initdb").exists():
            return bindir
    initdb = shutil.which("initdb")
    if initdb is None:
        raise StackError("no Postgres server programs found (pg_config --bindir, initdb)")
    return Path(initdb).resolve().parent


class RedisServer:
    """`redis-server` of its own on a free port of `host` (the loopback), persisting to an
    append-only file."""

    def __init__(self, folder: Path, *, fsync: str = "everysec", host: Host = LOCAL) -> None:
        self.folder = folder
        self.host = host
        self.port = free_port()
        self.fsync = fsync
        binary = shutil.which("redis-server")
        if binary is None:
            raise StackError("redis-server is not installed")
        folder.mkdir(parents=True, exist_ok=True)
        # Without a password Redis answers the loopback only: a host of its own on a private
        # network (nothing but the run's namespaces reach it) lets its network in.
        protected = ("--protected-mode", "no") if host.network else ()
        self.process = Process(
            name="redis",
            kind="redis",
            command=[
                binary,
                *("--port", str(self.port), "--bind", host.address, "--dir", str(folder)),
                *("--appendonly", "yes", "--appendfsync", fsync, "--save", ""),
                *protected,
            ],
            env=dict(os.environ),
            log=folder / "redis.log",
            host=host,
        )

    @property
    def url(self) -> str:
        return f"redis://{self.host.address}:{self.port}/0"

    def client(self) -> Any:
        from redis import Redis

        return Redis(
            host=self.host.address, port=self.port, decode_responses=True, socket_timeout=5
        )

    def start(self) -> None:
        self.process.start()

        def answers() -> bool:
            with self.client() as redis:
                return bool(redis.ping())  # a LOADING reply raises: not ready yet

        wait_until(answers, within=30, what="redis-server", alive=self.process.alive)

    def kill(self) -> None:
        self.process.kill()

    def stop(self) -> None:
        self.process.stop(timeout=10)


@dataclass
class StackConfig:
    """What to run: `workers` is `vllm`, `fake`, or `urls` (the `worker_urls` given)."""

    edges: int = 2
    schedulers: int = 2
    workers: str = "fake"
    worker_count: int = 2
    worker_urls: list[str] = field(default_factory=list)
    celery: bool = False
    beat: bool = False
    fake_tokens: int = 40
    fake_token_delay: float = 0.1
    redis_fsync: str = "everysec"
    # Settings for every service process (the benchmark's own choices).
    env: dict[str, str] = field(default_factory=dict)
    # Where each process runs, by name (`store` for Postgres and Redis, `edge-0`,
    # `scheduler-1`, `worker-0`, ...); the others on this machine's loopback.
    hosts: dict[str, Host] = field(default_factory=dict)


class Stack:
    """The stores and the service's processes; `close()` (or leaving the `with`) stops all."""

    def __init__(self, folder: Path, config: StackConfig) -> None:
        self.folder = folder
        self.config = config
        # Set here, so that every process started from now on inherits it (the stores too).
        os.environ[STACK_MARKER] = str(folder)
        self.base_env = {**DEFAULT_ENV, **os.environ}
        self.postgres: Postgres | None = None
        self.redis: RedisServer | None = None
        self.processes: dict[str, Process] = {}
        self.worker_urls: list[str] = []
        self.edge_urls: list[str] = []
        self.replica_names: dict[str, str] = {}
        self._scheduler_starts = collections.Counter[str]()

    def __enter__(self) -> Stack:
        return self

    def host(self, name: str) -> Host:
        return self.config.hosts.get(name, LOCAL)

    def __exit__(self, *exc: object) -> None:
        self.close()

    # The stores

    def start_stores(self) -> None:
        # Postgres' programs run as another user: the folder above its own must let it in.
        self.folder.chmod(0o755)
        store = self.host("store")
        self.postgres = Postgres(self.folder / "postgres", store)
        self.postgres.init()
        self.postgres.start()
        self.postgres.create_database()
        self.redis = RedisServer(self.folder / "redis", fsync=self.config.redis_fsync, host=store)
        self.redis.start()

    @property
    def database_url(self) -> str:
        assert self.postgres is not None
        return self.postgres.url()

    @property
    def redis_url(self) -> str:
        assert self.redis is not None
        return self.redis.url

    def service_env(self, **extra: str) -> dict[str, str]:
        """The environment of an edge, replica or Celery worker of this stack."""
        return {
            **self.base_env,
            "DEBUG": "0",
            "DATABASE_URL": self.database_url,
            "REDIS_URL": self.redis_url,
            "INFERENCE_WORKERS": "",
            "LOG_LEVEL": "WARNING",
            # Every client comes from one address: the per-address limit would refuse them.
            "RATE_LIMIT_MESSAGE_POST": "1000000/m",
            **self.config.env,
            **extra,
        }

    def migrate(self) -> None:
        done = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
            cwd=ROOT,
            env=self.service_env(),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if done.returncode != 0:
            raise StackError(f"migrate failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")

    def django(self) -> None:
        """Set Django up in this process against the stack's stores (no connection pool:
        the benchmark's own few queries reconnect after a restart of Postgres)."""
        os.environ["DATABASE_URL"] = self.database_url
        os.environ["REDIS_URL"] = self.redis_url
        os.environ["DB_POOL_MAX_SIZE"] = "0"
        for name, value in DEFAULT_ENV.items():
            os.environ.setdefault(name, value)
        from benchmarks.common import django_start

        django_start()

    # The service's processes

    def _add(self, name: str, kind: str, command: list[str], env: dict[str, str]) -> Process:
        log = self.folder / f"{name}.log"
        process = Process(name, kind, command, env, log, host=self.host(name))
        self.processes[name] = process
        return process.start()

    def start_workers(self) -> list[str]:
        """Start (or adopt the URLs of) the workers; returns their URLs once they answer."""
        config = self.config
        if config.workers == "urls":
            self.worker_urls = [url.rstrip("/") for url in config.worker_urls]
        else:
            for index in range(config.worker_count):
                port = free_port()
                address = self.host(f"worker-{index}").address
                if config.workers == "vllm":
                    cpus = str(index % (os.cpu_count() or 1))
                    command = [sys.executable, "manage.py", "run_worker", "--port", str(port)]
                    command += ["--host", address, "--cpus", cpus]
                else:
                    command = [sys.executable, str(Path(__file__)), "fake-worker"]
                    command += ["--host", address, "--port", str(port)]
                    command += ["--tokens", str(config.fake_tokens)]
                    command += ["--token-delay", str(config.fake_token_delay)]
                self._add(f"worker-{index}", "worker", command, dict(self.base_env))
                self.worker_urls.append(f"http://{address}:{port}")
        for index, url in enumerate(self.worker_urls):
            self.wait_worker(url, self.processes.get(f"worker-{index}"))
        return self.worker_urls

    def wait_worker(self, url: str, process: Process | None) -> None:
        within = 600 if self.config.workers == "vllm" else 30

        def healthy() -> bool:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200

        try:
            wait_until(
                healthy,
                within=within,
                what=f"worker {url}",
                every=1.0,
                alive=process.alive if process else None,
            )
        except StackError as exc:
            tail = process.tail() if process else ""
            raise StackError(f"{exc}\n{tail}") from None

    def served_model(self) -> str:
        if self.config.workers == "fake":
            return "fake"  # the stand-in serves any name and lists none
        response = httpx.get(f"{self.worker_urls[0]}/v1/models", timeout=10)
        return str(response.json()["data"][0]["id"])

    def start_scheduler(self, name: str) -> Process:
        """Start replica `name` (again): each start is a new replica id, as a restarted
        process gets by default (host and pid)."""
        self._scheduler_starts[name] += 1
        replica = f"{name}-{self._scheduler_starts[name]}"
        self.replica_names[name] = replica
        # Each replica's /metrics and probes on a port of its own (the default, 9100, fits
        # one replica a host).
        command = [
            *(sys.executable, "manage.py", "run_scheduler", "--replica-id", replica),
            *("--metrics-port", str(free_port())),
        ]
        process = self.processes.get(name)
        if process is None:
            return self._add(name, "scheduler", command, self.service_env())
        process.command = command
        return process.start()

    def start_service(self) -> None:
        """Scheduler replicas, edges and Celery; returns once each answers."""
        for index in range(self.config.schedulers):
            self.start_scheduler(f"scheduler-{index}")
        for index in range(self.config.edges):
            port = free_port()
            address = self.host(f"edge-{index}").address
            from benchmarks.common import edge_command

            command = edge_command(port, host=address)
            self._add(f"edge-{index}", "edge", command, self.service_env())
            self.edge_urls.append(f"http://{address}:{port}")
        if self.config.celery:
            celery = [str(Path(sys.executable).parent / "celery"), "-A", "chatsite", "worker"]
            celery += ["--loglevel", "WARNING", "--concurrency", "2"]
            if self.config.beat:
                celery.append("-B")  # the periodic tasks (sweeper, reconciliation) as well
            # Prefork children must not inherit a connection pool (see the Procfile).
            self._add("celery", "celery", celery, self.service_env(DB_POOL_MAX_SIZE="0"))
        for index in range(self.config.edges):
            self.wait_edge(index)
        for index in range(self.config.schedulers):
            self.wait_scheduler(f"scheduler-{index}")

    def wait_edge(self, index: int) -> None:
        url, process = self.edge_urls[index], self.processes[f"edge-{index}"]
        try:
            wait_until(
                lambda: httpx.get(f"{url}/v1/models", timeout=2).status_code < 500,
                within=60,
                what=f"edge {url}",
                alive=process.alive,
            )
        except StackError as exc:
            raise StackError(f"{exc}\n{process.tail()}") from None

    def wait_scheduler(self, name: str) -> None:
        from inference import queue

        process = self.processes[name]
        key = queue.replica_key(self.replica_names[name])
        assert self.redis is not None
        with self.redis.client() as redis:
            try:
                wait_until(lambda: redis.exists(key), within=90, what=name, alive=process.alive)
            except StackError as exc:
                raise StackError(f"{exc}\n{process.tail()}") from None

    def restart_edge(self, index: int) -> None:
        self.processes[f"edge-{index}"].start()
        self.wait_edge(index)

    def restart_worker(self, index: int) -> None:
        process = self.processes[f"worker-{index}"]
        process.start()
        self.wait_worker(self.worker_urls[index], process)

    def of_kind(self, kind: str) -> list[Process]:
        return [process for process in self.processes.values() if process.kind == kind]

    def close(self) -> None:
        """Stop everything this stack started, the service before the stores; never raises
        for a process already gone."""
        order = ("edge", "celery", "scheduler", "worker")
        for kind in order:
            for process in self.of_kind(kind):
                try:
                    process.stop()
                except Exception as exc:
                    print(f"could not stop {process.name}: {exc}", file=sys.stderr)
        if self.redis is not None:
            self.redis.stop()
        if self.postgres is not None:
            self.postgres.stop()
        # Anything of ours that outlived its group (it made a session of its own): killed.
        for pid in leftovers(self.folder):
            print(f"killing pid {pid}, left over from the stack", file=sys.stderr)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


# What is in Redis


# Ids inside key names: uuids, numbers, replica names with their start count.
_ID_PATTERNS = [
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "<uuid>"),
    (re.compile(r"[0-9a-f]{32,64}"), "<hash>"),
    (re.compile(r"(?<=:)[a-z]+-\d+-\d+(?=$|:)"), "<replica>"),
    (re.compile(r"\{u\d+\}"), "{u<n>}"),
    (re.compile(r"\{s\d+\}"), "{s<n>}"),
    (re.compile(r"(?<=[:.])\d+(?=$|[:.])"), "<n>"),
]


def key_pattern(key: str) -> str:
    """A key with its ids replaced, so keys of one family group together."""
    for pattern, replacement in _ID_PATTERNS:
        key = pattern.sub(replacement, key)
    return key


@dataclass
class KeyGroup:
    """The keys of one pattern: how many, how many without a TTL, the longest TTL left."""

    pattern: str
    count: int = 0
    without_ttl: int = 0
    max_ttl_s: float = 0.0
    keys: list[str] = field(default_factory=list)

    @property
    def examples(self) -> list[str]:
        return self.keys[:2]


def key_census(redis: Any) -> dict[str, KeyGroup]:
    """Every key of the Redis database, grouped by `key_pattern`."""
    groups: dict[str, KeyGroup] = {}
    keys = list(redis.scan_iter(count=1000))
    with redis.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.pttl(key)
        ttls = pipe.execute()
    for key, ttl in zip(keys, ttls, strict=True):
        if ttl == -2:
            continue  # expired between the scan and now
        group = groups.setdefault(key_pattern(key), KeyGroup(key_pattern(key)))
        group.count += 1
        if ttl == -1:
            group.without_ttl += 1
        else:
            group.max_ttl_s = max(group.max_ttl_s, ttl / 1000)
        group.keys.append(key)
    return dict(sorted(groups.items()))


def members(redis: Any, key: str) -> int:
    """Members of a set, sorted set or hash, length of a list or stream; 1 for a string."""
    kind = redis.type(key)
    counter = {"set": redis.scard, "zset": redis.zcard, "hash": redis.hlen, "list": redis.llen}
    if kind in counter:
        return int(counter[kind](key))
    if kind == "stream":
        return int(redis.xlen(key))
    return 1 if kind == "string" else 0


# Setting up the data a benchmark needs


def prepare_fleet(urls: Sequence[str], served_model: str, max_tokens: int) -> Mapping[str, int]:
    """The default pool served by `urls` (answers capped at `max_tokens`); returns each URL's
    worker id."""
    from django.conf import settings

    from chatsite.catalog import catalog_changed
    from inference.models import ModelPool, Worker

    pool, _ = ModelPool.objects.update_or_create(
        name=settings.DEFAULT_MODEL,
        defaults={"served_model": served_model, "max_output_tokens": max_tokens, "is_active": True},
    )
    ids = {}
    for index, url in enumerate(urls):
        worker = Worker.objects.create(
            pool=pool, name=f"bench-{index}", url=url, state=Worker.State.HEALTHY
        )
        ids[url] = worker.pk
    catalog_changed()
    return ids


def make_users(count: int, prefix: str) -> list[tuple[int, str]]:
    """`count` users on a roomy plan, each with an API key that keeps its `/v1`
    conversations (so that every message sent can be looked for); (user id, raw key)."""
    from django.contrib.auth.models import User

    from accounts.services import api_key_create
    from billing.models import Plan
    from billing.services import subscription_set

    plan, _ = Plan.objects.get_or_create(
        slug="bench-roomy",
        defaults={
            "name": "Benchmark",
            "tier": "pro",
            "monthly_price_micros": 0,
            "requests_per_minute": 100_000,
            "tokens_per_minute": 100_000_000,
            "max_concurrent": 1_000,
            "max_output_tokens": 4_096,
            "message_cap": 1_000_000,
            "message_cap_window_seconds": 3_600,
        },
    )
    made = []
    for index in range(count):
        user = User.objects.create_user(username=f"{prefix}-{index}")
        subscription_set(user=user, plan=plan)
        _, raw = api_key_create(user=user, name="benchmark", store_conversations=True)
        made.append((user.pk, raw))
    return made


def log_lines(process: Process, since: int) -> tuple[int, list[str]]:
    """The lines a process logged from byte `since` on, and the offset to read from next."""
    try:
        with process.log.open("rb") as log:
            log.seek(since)
            data = log.read()
    except OSError:
        return since, []
    return since + len(data), data.decode(errors="replace").splitlines()


def notable(lines: Sequence[str], limit: int = 8) -> list[str]:
    """The distinct error and warning lines among `lines`: errors (and the exception that
    ends each traceback) first, then warnings, at most `limit`."""
    errors: dict[str, str] = {}
    warnings: dict[str, str] = {}
    for line in lines:
        text = re.sub(r"\b[0-9a-f-]{36}\b", "<uuid>", line.strip())[:220]
        # The same line at another time is the same kind: the first one stands for it.
        kind = re.sub(r"^\d{4}-\d\d-\d\d [\d:,.]+ ", "", text)
        if re.search(r"\b(ERROR|CRITICAL)\b|^\w+(\.\w+)*(Error|Exception|Interrupted):", text):
            errors.setdefault(kind, text)
        elif re.search(r"\bWARNING\b", text):
            warnings.setdefault(kind, text)
    return [*errors.values(), *warnings.values()][:limit]


def iter_processes(stack: Stack) -> Iterator[Process]:
    yield from stack.processes.values()
    if stack.redis is not None:
        yield stack.redis.process


# The stand-in worker as a process of its own


def fake_worker_main(argv: Sequence[str]) -> int:
    """One `FakeWorker` listening on `--host`:`--port` until SIGTERM or SIGKILL."""
    from http.server import ThreadingHTTPServer
    from threading import Thread

    from inference.tests.fake_worker import FakeWorker

    parser = argparse.ArgumentParser(prog="stack.py fake-worker")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--token-delay", type=float, default=0.1)
    args = parser.parse_args(argv)
    worker = FakeWorker(tokens=args.tokens, token_delay=args.token_delay)
    # The stand-in binds a port of its own choosing; a restarted worker must come back at
    # the address its pool row names, so it serves its handler on the port given instead.
    worker.server.server_close()
    worker.server = ThreadingHTTPServer((args.host, args.port), worker._handler())
    worker.server.daemon_threads = True
    worker.thread = Thread(target=worker.server.serve_forever, daemon=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    worker.start()
    print(f"fake worker on {worker.url}", flush=True)
    try:
        worker.thread.join()
    finally:
        worker.stop()
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["fake-worker"]:
        raise SystemExit(
            "usage: stack.py fake-worker --port P [--host A] [--tokens N] [--token-delay S]"
        )
    raise SystemExit(fake_worker_main(sys.argv[2:]))
