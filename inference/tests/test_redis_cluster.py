"""Redis Cluster: every Lua script names the keys it touches and they share one slot, and an
answer goes from the queue to a finished stream on a real cluster of three masters.

The rest of the Redis-facing suite runs on a cluster too with `pytest --redis-cluster`
(`make test` does, for the files named in the Makefile).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.models import User
from redis.crc import key_slot

from billing import quota
from chatsite.redis import STREAM_SHARDS, sync_redis
from chatsite.tests.redis_cluster import LocalCluster
from conversations.events import user_events_key
from conversations.models import Message
from inference import queue
from inference.models import Generation
from inference.scheduler import prefix

from .fixtures import LiveEdge, register_pool, running_schedulers, send_turn, start_edge, wait_for
from .test_stream import bearer, collect, finished, stream_url

# Commands whose first argument is not a key.
KEYLESS = {"PUBLISH", "TIME"}
CALL = re.compile(r"redis\.p?call\(")

# The claim script as it was before the cluster work: it built the job's key from ARGV.
OLD_CLAIM = """
for i = 1, #KEYS, 3 do
  local popped = redis.call('ZPOPMIN', KEYS[i])
  if #popped > 0 then
    local id = popped[1]
    local job = ARGV[1] .. id
    if redis.call('EXISTS', job) == 1 then
      redis.call('SADD', ARGV[4], id)
      return {id, redis.call('HGETALL', job)}
    end
  end
end
return false
"""


def _arguments(text: str, start: int) -> list[str]:
    """The comma-separated arguments of the call whose '(' is at `start`."""
    depth = 0
    current: list[str] = []
    found: list[str] = []
    for char in text[start + 1 :]:
        if char in "({[":
            depth += 1
        elif char in ")}]":
            if depth == 0:
                found.append("".join(current).strip())
                return found
            depth -= 1
        if char == "," and depth == 0:
            found.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    raise ValueError("unbalanced call")


def undeclared_keys(script: str) -> list[str]:
    """The key arguments of `redis.call`/`pcall` in `script` not taken from KEYS: a key must
    be `KEYS[...]`, or built on one (`KEYS[n] .. id`), or a local or a function parameter
    that only ever holds such a value."""
    assigned: dict[str, list[str]] = {}
    for names, values in re.findall(r"local\s+([\w\s,]+?)\s*=\s*([^\n]+)", script):
        if names.strip().startswith("function"):
            continue
        parts = [v.strip() for v in values.split(",")]
        for index, name in enumerate(n.strip() for n in names.split(",")):
            assigned.setdefault(name, []).append(parts[index] if index < len(parts) else "")
    for function, params in re.findall(r"local\s+function\s+(\w+)\(([^)]*)\)", script):
        names = [p.strip() for p in params.split(",")]
        for match in re.finditer(rf"(?<!function ){function}\(", script):
            for name, value in zip(names, _arguments(script, match.end() - 1), strict=False):
                assigned.setdefault(name, []).append(value)

    def declared(expression: str, seen: frozenset[str] = frozenset()) -> bool:
        head = expression.split("..", 1)[0].strip()
        if re.fullmatch(r"KEYS\[[^\]]+\]", head):
            return True
        if re.fullmatch(r"\w+", head) and head in assigned and head not in seen:
            return all(declared(v, seen | {head}) for v in assigned[head])
        return False

    bad = []
    for match in CALL.finditer(script):
        arguments = _arguments(script, match.end() - 1)
        command = arguments[0].strip("'\"").upper()
        if command not in KEYLESS and not declared(arguments[1]):
            bad.append(f"{command} {arguments[1]}")
    return bad


def project_scripts() -> dict[str, str]:
    """Every Lua script in the code: the module-level strings that call Redis, by name."""
    root = Path(settings.BASE_DIR)
    scripts = {}
    for path in sorted(root.glob("*/**/*.py")):
        relative = path.relative_to(root)
        if relative.parts[0].startswith(".") or "tests" in relative.parts:
            continue
        if relative.parts[0] == "benchmarks" or "redis.call(" not in path.read_text():
            continue
        module = importlib.import_module(".".join(relative.with_suffix("").parts))
        for name, value in vars(module).items():
            if isinstance(value, str) and "redis.call(" in value and not name.startswith("_"):
                scripts[f"{module.__name__}.{name}"] = value
    return scripts


def test_the_key_check_catches_a_key_built_from_argv() -> None:
    assert undeclared_keys(OLD_CLAIM) == ["EXISTS job", "SADD ARGV[4]", "HGETALL job"]
    assert undeclared_keys(queue.CLAIM) == []


def test_every_lua_script_takes_its_keys_from_keys() -> None:
    scripts = project_scripts()
    assert {
        "inference.queue.CLAIM",
        "inference.queue.ABANDONED",
        "inference.scheduler.adoption.ADOPT",
        "inference.scheduler.capacity.ACQUIRE_LEASE",
        "inference.scheduler.prefix.MATCH",
        "inference.scheduler.writer.RETRACT",
        "billing.quota.RESERVE",
    } <= set(scripts)
    assert {name: undeclared_keys(text) for name, text in scripts.items()} == {
        name: [] for name in scripts
    }


def _sample_keys() -> dict[str, list[str]]:
    """Each script's KEYS for a sample call, as its callers build them."""
    gid, replica, worker, user = "7f9c", "replica-a", 3, 42
    return {
        "ENQUEUE": [
            queue.job_key(gid),
            queue.queue_key("big", "free"),
            queue.queued_at_key("big", "free"),
            queue.fair_key("big", "free"),
        ],
        "CLAIM": queue.claim_keys("big", queue.tiers_best_first(), replica),
        "REQUEUE": [
            queue.queue_key("big", "pro"),
            queue.queued_at_key("big", "pro"),
            queue.fair_key("big", "pro"),
            queue.job_key(gid),
            queue.owned_key(replica),
        ],
        "UNQUEUE": [queue.queue_key("big", "free"), queue.queued_at_key("big", "free")],
        "EXPIRE_QUEUED": queue.expire_keys("big", queue.tiers_best_first()),
        "MOVE_TO_FALLBACK": queue.fallback_keys("big", "free", "small"),
        "ATTACH/DETACH/LEAVE": queue.watch_keys(gid),
        "ABANDONED": queue.abandoned_keys(),
        "ADOPT": [
            queue.owned_key("dead"),
            queue.owned_key(replica),
            queue.replicas_key(),
            queue.replica_key("dead"),
            queue.job_key(""),
        ],
        "REQUEUE_ADOPTED": [
            queue.queue_key("small", "plus"),
            queue.queued_at_key("small", "plus"),
            queue.fair_key("small", "plus"),
            queue.job_key(gid),
            queue.owned_key(replica),
        ],
        "ACQUIRE_LEASE": [
            queue.lease_key(worker),
            queue.lease_tokens_key(worker),
            queue.prefill_key(worker),
            queue.placed_key(worker),
        ],
        "RELEASE_LEASE": [
            queue.lease_key(worker),
            queue.lease_tokens_key(worker),
            queue.prefill_key(worker),
        ],
        "MATCH": [prefix.index_key(w) for w in (1, 2, 3, 40)],
        "RESERVE": [
            quota.rpm_key(user),
            quota.tpm_key(user),
            quota.cap_key(user, 5),
            quota.concurrency_key(user),
            quota.reservation_key(user, gid),
        ],
        "SETTLE": [
            quota.tpm_key(user),
            quota.cap_key(user, 5),
            quota.concurrency_key(user),
            quota.reservation_key(user, gid),
        ],
    }


def test_each_scripts_keys_share_one_slot() -> None:
    slots = {name: {key_slot(k.encode()) for k in keys} for name, keys in _sample_keys().items()}
    assert {name: len(found) for name, found in slots.items()} == {name: 1 for name in slots}
    # Users' quotas are apart from each other and from the inference plane's coordination.
    assert key_slot(quota.rpm_key(1).encode()) != key_slot(quota.rpm_key(2).encode())
    assert slots["RESERVE"] != slots["CLAIM"]


def test_streams_spread_over_their_shards_apart_from_the_coordination() -> None:
    streams = {key_slot(queue.stream_key(f"gen-{n}").encode()) for n in range(500)}
    users = {key_slot(user_events_key(n).encode()) for n in range(500)}
    assert len(streams) == STREAM_SHARDS
    assert users <= streams  # the edge reads both kinds with the same readers
    assert key_slot(queue.job_key("gen-1").encode()) not in streams


@pytest.fixture
def cluster_edge(
    transactional_db: Any, on_redis_cluster: LocalCluster, tmp_path: Path
) -> Iterator[LiveEdge]:
    """An edge process on the cluster, stopped before the database is flushed."""
    edge = start_edge(tmp_path)
    try:
        yield edge
    finally:
        edge.wait_until_idle()
        edge.stop()


async def test_an_answer_goes_from_the_queue_to_a_finished_stream_on_a_cluster(
    user: User, fake_workers: Any, cluster_edge: LiveEdge
) -> None:
    fake = fake_workers(tokens=12, token_delay=0.01)
    await sync_to_async(register_pool)(fake)
    turn = await sync_to_async(send_turn)(user, "Hello over the cluster")
    gid = turn.generation.id
    async with running_schedulers(2):
        await wait_for(lambda: finished(gid))
        events = await collect(stream_url(cluster_edge, gid), await sync_to_async(bearer)(user))

    generation = await Generation.objects.aget(pk=gid)
    assert generation.status == Generation.Status.COMPLETE
    message = await Message.objects.aget(pk=turn.assistant_message.id)
    text = "".join(e.data["text"] for e in events if e.event == "delta" and e.data)
    assert text == message.content and text
    assert [e.event for e in events][-1] == "done"
    # The pieces landed on the cluster: the stream in its shard, the settled quota.
    redis = sync_redis()
    assert redis.xlen(queue.stream_key(gid)) == len([e for e in events if e.id])
    assert not redis.exists(queue.job_key(gid))
    assert quota.open_reservations(before=queue.now_ms() + 1) == []


async def test_a_stop_ends_a_running_answer_on_a_cluster(
    user: User, fake_workers: Any, on_redis_cluster: LocalCluster, transactional_db: Any
) -> None:
    fake = fake_workers(tokens=10_000, token_delay=0.02)
    await sync_to_async(register_pool)(fake)
    turn = await sync_to_async(send_turn)(user, "Talk for a long time")
    gid = turn.generation.id
    async with running_schedulers() as (scheduler,):
        await wait_for(lambda: _has_text(gid))
        await sync_to_async(queue.request_cancel)(sync_redis(), str(gid))
        await wait_for(lambda: finished(gid))

    generation = await Generation.objects.aget(pk=gid)
    assert generation.status == Generation.Status.CANCELLED
    assert not scheduler.running


async def _has_text(generation_id: Any) -> bool:
    entries: Any = sync_redis().xrange(queue.stream_key(generation_id))
    return any(fields.get("event") == "delta" for _, fields in entries)
