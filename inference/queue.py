"""The Redis side of the inference plane: queues, jobs, leases, affinity and streams.

Every check-and-change that two processes could race on is one Lua script, so several
scheduler replicas and edge processes can share one Redis without locks.

Redis Cluster: a script runs on the node of its keys' slot and may touch only keys of that
slot. So every key of the plane's coordination carries one hash tag, `{<prefix>}` (prefix:
`INFERENCE_REDIS_PREFIX`), and lands in one slot: a script may name any of them (a job of
one pool and the queue of another, every replica's `owned` set), and no replica needs a
cross-slot step. Each script is passed every key it touches in KEYS; a key it finds in its
data (the job of the id it pops from a queue) it builds on a key prefix passed in KEYS
(`job_key("")`, say), which carries the tag and so names the slot. Coordination is small
and constant per answer; the bulk of the traffic, the streams, is spread instead: each
stream's tag is one of `chatsite.redis.STREAM_SHARDS` (`stream_tag`), so streams spread over
the cluster's masters while an edge still reads all it tails with one XREAD per tag. The
prefix index has a tag of its own (`{<prefix>:prefix}`, scheduler/prefix.py), billing's
quota keys one per user (`{u<id>}`, billing/quota.py).

The keys, all `{<prefix>}:...` unless said:

- `q:<pool>:<tier>`  sorted set of queued generation ids, in the order they are served: scored
                     by their start tag in a fair queue between users (`ENQUEUE`)
- `qt:<pool>:<tier>` the same ids scored by enqueue time (ms), for the queue time limit
- `fair:<pool>:<tier>` hash: the queue's virtual time `V` and each user's last finish tag
- `job:<id>`         hash: what the scheduler needs to run the generation (prompt, limits);
                     `detached_ms` since when nobody reads its stream, `leaving` once its page
                     said it is going away; `request_id` and `traceparent` from the edge
- `lease:<worker>`   sorted set of generation ids running on a worker, scored by lease expiry;
                     a replica that dies stops renewing, and its leases lapse by themselves
- `lease-tokens:<worker>`, `prefill:<worker>`  hashes: per lease, the tokens it may hold in the
                     KV cache, and the prompt tokens it has yet to read
- `placed:<worker>`  hash: the worker's rate of placements lately (`rate`/s as of `at` ms)
- `{<prefix>:prefix}:<worker>` the blocks the worker's KV cache holds, as estimated
                     (scheduler/prefix.py)
- `aff:<conv>`       the worker that served the conversation's last turn
- `rr:<pool>`        the pool's round-robin turn
- `replica:<id>`     a live scheduler replica's heartbeat (lapses after the replica TTL)
- `replicas`         sorted set of replica ids by the time of their last heartbeat (ms)
- `owned:<replica>`  set of the generations a replica has claimed and not yet ended: what a
                     live replica adopts when that one stops beating (scheduler/adoption.py)
- `metrics:<worker>` the worker's last load reading, for placement and the admin
- `housekeeping`     which replica does the pool-wide chores this second
- `<prefix>:stream:{s<n>}:<id>` the generation's events (Redis Stream; the entry id is the
                     SSE id), under its stream tag
- `watchers:<id>`    how many clients read the generation's stream now
- `pages:<id>`       hash: of those, how many each page of the web chat holds (by the page's
                     own id), so that a page going away knows whether anyone else reads
- `shown:<user>`     a page of the web chat was served to the user a moment ago: a beacon
                     that follows it comes from the page being reloaded
- `detached`         sorted set of the generations nobody reads, for housekeeping to cancel
                     after a grace unless a client comes back, scored by when to look at each
- `relayed:<replica>` pub/sub channel: an edge relaying an answer the replica ordered says
                     `<id> <attempt> first` at its first token and `<id> <attempt> end` once
                     its outcome is in the job (`relay_first`, `relayed`; `relay_beat` while
                     it lasts: inference/relay.py)
- `wake`, `cancel`   pub/sub channels: new work, and cancels of running generations (a
                     cluster delivers them to subscribers on every node)

Other apps keep single keys of their own under the same tag (`key`): titles' and summaries'
pending marks.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, cast

from django.conf import settings
from redis import Redis

# The project's one client factory, re-exported for the callers that say `queue.sync_redis()`.
from chatsite.redis import async_redis as async_redis
from chatsite.redis import stream_tag
from chatsite.redis import sync_redis as sync_redis

JOB_TTL_SECONDS = 24 * 3600
LEASE_SECONDS = 30


def key(*parts: object) -> str:
    """A key of the plane's coordination, under its one hash tag (see the docstring)."""
    return ":".join(["{" + settings.INFERENCE_REDIS_PREFIX + "}", *(str(p) for p in parts)])


def queue_key(pool: str, tier: str) -> str:
    return key("q", pool, tier)


def queued_at_key(pool: str, tier: str) -> str:
    return key("qt", pool, tier)


def fair_key(pool: str, tier: str) -> str:
    return key("fair", pool, tier)


def job_key(generation_id: object) -> str:
    return key("job", generation_id)


def stream_key(generation_id: object) -> str:
    """A generation's stream: a tag of the streams', not the coordination's (see above)."""
    return f"{settings.INFERENCE_REDIS_PREFIX}:stream:{stream_tag(generation_id)}:{generation_id}"


def lease_key(worker_id: object) -> str:
    return key("lease", worker_id)


def lease_tokens_key(worker_id: object) -> str:
    """The tokens each lease on a worker may hold in its KV cache (prompt plus max_tokens)."""
    return key("lease-tokens", worker_id)


def prefill_key(worker_id: object) -> str:
    """The prompt tokens each lease on a worker has yet to read (until its first token)."""
    return key("prefill", worker_id)


def placed_key(worker_id: object) -> str:
    """The rate of placements on a worker (`rate` per second, as of `at` ms)."""
    return key("placed", worker_id)


def affinity_key(conversation_id: object) -> str:
    return key("aff", conversation_id)


def metrics_key(worker_id: object) -> str:
    return key("metrics", worker_id)


def replica_key(replica_id: str) -> str:
    return key("replica", replica_id)


def replicas_key() -> str:
    return key("replicas")


def owned_key(replica_id: str) -> str:
    """The generations `replica_id` has claimed and not yet ended."""
    return key("owned", replica_id)


def watchers_key(generation_id: object) -> str:
    return key("watchers", generation_id)


def detached_key() -> str:
    return key("detached")


# A page of the web chat names itself with a random id of its own (`static/js/api.js`).
PAGE_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"


def pages_key(generation_id: object) -> str:
    return key("pages", generation_id)


def shown_key(user_id: object) -> str:
    return key("shown", user_id)


def relay_channel(replica_id: str) -> str:
    """Where edges tell a replica of the relays it ordered: a first token, an end."""
    return key("relayed", replica_id)


def wake_channel() -> str:
    return key("wake")


def cancel_channel() -> str:
    return key("cancel")


def tiers_best_first() -> list[str]:
    priorities: dict[str, int] = settings.INFERENCE_TIER_PRIORITY
    return sorted(priorities, key=lambda tier: priorities[tier])


def now_ms() -> int:
    return int(time.time() * 1000)


# Enqueue: the job and its place in the queue, at once.
#
# Within a tier the queue is fair between users by tokens: start-time fair queuing (Goyal,
# Vin and Cheng, SIGCOMM '96), the discipline VTC (Sheng et al., OSDI '24) adapts to LLM
# serving. A request's start tag is the later of the queue's virtual time V (the tag of the
# request served last) and the finish tag of its user's previous request; its finish tag adds
# its cost in tokens (prompt and answer limit). The queue serves the smallest start tag, so
# a user who queued a hundred requests is served once per round among the users waiting, and
# one who comes back after a while starts at V, with no credit saved up. Among equal tags
# the earlier request goes first (a sequence number in the score's fraction). When the queue
# empties, the busy period is over and V and the tags start again from zero, so scores stay
# small enough to be exact.
#
# KEYS: the job, the queue, its enqueue times, its fair-queue state. ARGV: enqueue time, id,
# job TTL, user, cost in tokens, then the job's fields.
_FAIR_ADD = """
local function fair_add(queue, queued_at, fair, id, user, cost, enqueued_ms, ttl)
  local v = tonumber(redis.call('HGET', fair, 'V') or '0')
  local key = 'u:' .. user
  local start = math.max(v, tonumber(redis.call('HGET', fair, key) or '0'))
  local seq = redis.call('HINCRBY', fair, '#', 1) % 1000000
  redis.call('HSET', fair, key, start + cost)
  redis.call('EXPIRE', fair, ttl)
  redis.call('ZADD', queue, string.format('%d.%06d', start, seq), id)
  redis.call('ZADD', queued_at, enqueued_ms, id)
end
"""
ENQUEUE = (
    _FAIR_ADD
    + """
redis.call('HSET', KEYS[1], unpack(ARGV, 6))
redis.call('EXPIRE', KEYS[1], ARGV[3])
fair_add(KEYS[2], KEYS[3], KEYS[4], ARGV[2], ARGV[4], tonumber(ARGV[5]), ARGV[1], ARGV[3])
return 1
"""
)

# The overload policy's fallback: move what waited since before a deadline (ARGV[1]) from a
# pool's queue (KEYS[1], its enqueue times KEYS[2]) to its fallback pool's (KEYS[3..5]: queue,
# enqueue times, fair-queue state), atomically, at most 100 a call. Only jobs that allow it
# (`may_fall_back`) and whose prompt and answer fit the fallback's context window (ARGV[5])
# move. The job (KEYS[6], the job keys' prefix, .. id) learns its new pool (ARGV[2]) and why
# (ARGV[3]); it keeps its enqueue time, so the queue time limit still counts from the send.
# ARGV[4]: the fair-queue state's TTL. Returns the ids moved.
MOVE_TO_FALLBACK = (
    _FAIR_ADD
    + """
local moved = {}
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, 1000)
for _, id in ipairs(ids) do
  if #moved >= 100 then break end
  local job = KEYS[6] .. id
  local f = redis.call(
    'HMGET', job, 'user_id', 'prompt_tokens', 'max_tokens', 'enqueued_ms', 'may_fall_back')
  local tokens = (tonumber(f[2]) or 0) + (tonumber(f[3]) or 0)
  if redis.call('ZSCORE', KEYS[1], id) == false then
    redis.call('ZREM', KEYS[2], id)
  elseif f[5] == '1' and tokens <= tonumber(ARGV[5]) then
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZREM', KEYS[2], id)
    redis.call('HSET', job, 'pool', ARGV[2], 'route', ARGV[3])
    fair_add(KEYS[3], KEYS[4], KEYS[5], id, f[1] or '0', math.max(1, tokens),
             f[4] or ARGV[1], ARGV[4])
    moved[#moved + 1] = id
  end
end
return moved
"""
)

# Claim the next generation of the best non-empty tier that has room (KEYS: each such tier's
# queue, enqueue times and fair-queue state, in threes, then the job keys' prefix and the
# replica's `owned` set: `claim_keys`). ZPOPMIN is what makes a generation go to exactly one
# replica. The `owned` set learns the claim in the same step: a replica that dies right after
# it leaves nothing unowned for its adopter to miss. ARGV: the replica, now. Returns its id,
# its queue, its score (to put it back in the same place) and its job's fields (a flat list
# of names and values).
CLAIM = """
local jobs, owned = KEYS[#KEYS - 1], KEYS[#KEYS]
for i = 1, #KEYS - 2, 3 do
  local popped = redis.call('ZPOPMIN', KEYS[i])
  if #popped > 0 then
    local id = popped[1]
    redis.call('ZREM', KEYS[i + 1], id)
    if redis.call('EXISTS', KEYS[i]) == 0 then
      redis.call('DEL', KEYS[i + 2])
    else
      redis.call('HSET', KEYS[i + 2], 'V', math.floor(tonumber(popped[2])))
    end
    local job = jobs .. id
    if redis.call('EXISTS', job) == 1 then
      redis.call('HSET', job, 'owner', ARGV[1], 'claimed_ms', ARGV[2])
      redis.call('SADD', owned, id)
      return {id, KEYS[i], popped[2], redis.call('HGETALL', job)}
    end
  end
end
return false
"""

# Put a claimed generation back at the head of its queue (KEYS: its queue, enqueue times,
# fair-queue state and job, and the `owned` set of the replica that held it; ARGV: its score,
# its enqueue time, its id), and let any replica claim it. It keeps its score unless the
# queue's virtual time is now below it: its claim emptied the queue and ended the busy period
# (the state went with it), and those who queued since started again from zero. It then
# starts at the virtual time, ahead of them, instead of behind every tag of the new period
# (where an adopted generation always starts: `adoption.REQUEUE_ADOPTED`).
REQUEUE = """
local v = tonumber(redis.call('HGET', KEYS[3], 'V') or '0')
local score = ARGV[1]
if tonumber(score) > v then
  score = string.format('%d.%06d', v, 0)
end
redis.call('ZADD', KEYS[1], score, ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
redis.call('HDEL', KEYS[4], 'owner')
if KEYS[5] then
  redis.call('SREM', KEYS[5], ARGV[3])
end
return 1
"""

# Remove a queued generation if it is still queued: the caller that gets 1 owns its fate.
UNQUEUE = """
redis.call('ZREM', KEYS[2], ARGV[1])
return redis.call('ZREM', KEYS[1], ARGV[1])
"""

# Take every generation queued before a deadline (ARGV[1]) out of the queues (KEYS: a pool's
# tiers' queues and enqueue times, in pairs), atomically: at most 100 per queue a call.
EXPIRE_QUEUED = """
local expired = {}
for i = 1, #KEYS, 2 do
  local ids = redis.call('ZRANGEBYSCORE', KEYS[i + 1], '-inf', ARGV[1], 'LIMIT', 0, 100)
  for _, id in ipairs(ids) do
    redis.call('ZREM', KEYS[i + 1], id)
    if redis.call('ZREM', KEYS[i], id) == 1 then
      expired[#expired + 1] = id
    end
  end
end
return expired
"""


# Note a field on a job only while the job exists: a late writer must not resurrect it.
# The one finish of an unkept generation (KEYS: its job): its job gets a `finishing` mark
# once, and only while it exists (removed with the final events). 1: this caller finishes it;
# 0: another did, or does.
FINISH_UNKEPT = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
return redis.call('HSETNX', KEYS[1], 'finishing', '1')
"""


HSET_IF_EXISTS = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
return -1
"""


# Who reads a generation's stream (KEYS: its watchers, its job, the detached set, its pages;
# ARGV: its id, the watchers' TTL for ATTACH or now for DETACH and LEAVE, the reading page's
# id or ''). The count and the note of since when nobody watches change in one step: a client
# coming back as another leaves is never counted out, and housekeeping (ABANDONED) never reads
# a count and a note that disagree. A page of the web chat is also counted under its own id,
# so that when it goes away LEAVE can tell its own streams from everyone else's. A note is
# written only while the job exists: a finished answer has nothing to cancel.
ATTACH = """
redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
if ARGV[3] ~= '' then
  redis.call('HINCRBY', KEYS[4], ARGV[3], 1)
  redis.call('EXPIRE', KEYS[4], ARGV[2])
end
redis.call('HDEL', KEYS[2], 'detached_ms', 'leaving')
redis.call('ZREM', KEYS[3], ARGV[1])
return 1
"""
DETACH = """
if ARGV[3] ~= '' and redis.call('HINCRBY', KEYS[4], ARGV[3], -1) <= 0 then
  redis.call('HDEL', KEYS[4], ARGV[3])
end
if redis.call('DECR', KEYS[1]) > 0 or redis.call('EXISTS', KEYS[2]) == 0 then
  return 0
end
redis.call('HSET', KEYS[2], 'detached_ms', ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
return 1
"""
# The page showing the generation is going away (ARGV[4]: '1' when its tab is closing, ''
# when it is being reloaded). A closing page whose answer nobody else reads (its own streams,
# open or not yet closed, are not counted) returns LEAVE_CANCEL: the caller stops the answer
# at once, as Stop does. Otherwise the unwatched spell gets the short grace whatever its first
# token, so a reload, which re-attaches at once, keeps the answer, and an answer another tab
# still reads is left to that tab. With nobody watching, the spell is (re)scheduled from its
# start (it may have been put off for the long grace).
LEAVE = """
if redis.call('EXISTS', KEYS[2]) == 0 then
  return 0
end
if ARGV[4] == '1' then
  local own = ARGV[3] ~= '' and tonumber(redis.call('HGET', KEYS[4], ARGV[3]) or '0') or 0
  if tonumber(redis.call('GET', KEYS[1]) or '0') - own <= 0 then
    return 2
  end
end
redis.call('HSET', KEYS[2], 'leaving', '1')
if tonumber(redis.call('GET', KEYS[1]) or '0') <= 0 then
  local since = redis.call('HGET', KEYS[2], 'detached_ms')
  if not since then
    since = ARGV[2]
    redis.call('HSET', KEYS[2], 'detached_ms', since)
  end
  redis.call('ZADD', KEYS[3], since, ARGV[1])
end
return 1
"""
LEAVE_CANCEL = 2

# Housekeeping's look at the generations nobody watches (KEYS: the detached set, then the
# prefixes of the jobs', the watchers', the queues' and the enqueue times' keys:
# `abandoned_keys`; ARGV: now, the short grace (left before its first token, or its page went
# away) and the long grace (left after it), in ms, and how many to look at at most). Each is
# decided
# in one step with its watchers count, so a client that came back is never cancelled and a
# claim never races the unqueue:
# - a client came back, or the job is gone (finished): forgotten;
# - still within its grace: looked at again when it runs out;
# - claimed by a replica: its cancel flag set, returned in the second list (the caller tells
#   the replica at once; the replica's housekeeping sees the flag anyway);
# - waiting in its queue: taken out, returned in the first list (the caller finishes it as
#   cancelled);
# - neither (being finished, or disowned to the sweeper): forgotten.
# The set's score plus the shorter grace is when to look; the spell's start is the job's own
# `detached_ms`. Returns the two lists and how many were looked at.
ABANDONED = """
local now, short, long = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local shortest = math.min(short, long)
local queued, running = {}, {}
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - shortest, 'LIMIT', 0, ARGV[4])
for _, id in ipairs(ids) do
  local job = KEYS[2] .. id
  local f = redis.call(
    'HMGET', job, 'detached_ms', 'first_token_ms', 'leaving', 'owner', 'pool', 'tier')
  local since = tonumber(f[1])
  local watchers = tonumber(redis.call('GET', KEYS[3] .. id) or '0')
  if not since or watchers > 0 then
    redis.call('ZREM', KEYS[1], id)
  else
    local early = f[3] or not f[2] or tonumber(f[2]) > since
    local due = since + (early and short or long)
    if due > now then
      redis.call('ZADD', KEYS[1], due - shortest, id)
    elseif f[4] then
      redis.call('ZREM', KEYS[1], id)
      redis.call('HSET', job, 'cancel', '1')
      running[#running + 1] = id
    else
      redis.call('ZREM', KEYS[1], id)
      if f[5] and f[6] then
        local tier = f[5] .. ':' .. f[6]
        if redis.call('ZREM', KEYS[4] .. tier, id) == 1 then
          redis.call('ZREM', KEYS[5] .. tier, id)
          queued[#queued + 1] = id
        end
      end
    end
  end
end
return {queued, running, #ids}
"""


@dataclass(frozen=True)
class Job:
    """What the scheduler needs to run one generation, as stored in `job:<id>`."""

    generation_id: str
    pool: str
    tier: str
    priority: int
    conversation_id: str
    message_id: str
    messages: list[dict[str, Any]]
    max_tokens: int
    params: dict[str, Any]
    enqueued_ms: int
    prompt_tokens: int = 0  # our own count, for charging an answer that never reported usage
    user_id: int = 0  # whose permissions the tools run with
    # OpenAI-format `tools` offered to the model, and its `tool_choice` (None: the default).
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str | dict[str, Any] | None = None
    # True: the tools are plugins the scheduler runs (web chat, API conversations); False:
    # the client defined them and runs them itself (`/v1`), so the answer ends at the calls.
    run_tools: bool = False
    # The overload policy may have a smaller pool answer (the web chat; not `/v1`, whose
    # client asked for a model by name).
    may_fall_back: bool = False
    # False for a `/v1` answer of a key that keeps nothing: it has no row in Postgres, and
    # its life is this job and its stream (inference/unkept.py).
    kept: bool = True
    # True: the edge that took the request reads the worker's stream itself (a `/v1` answer
    # of a key that keeps nothing, without tools): the scheduler admits and places it, hands
    # the edge a `relay` order and finishes it from what the edge reports (inference/relay.py).
    relay: bool = False
    # The attempts made so far: more than none when a replica died while serving it and
    # another adopted it (scheduler/adoption.py); the next one restarts it.
    attempt: int = 0
    # The edge's request id, for the scheduler's log lines and the worker's request id, and
    # the W3C traceparent of its enqueue span ("" when not traced), which the scheduler's
    # spans continue (chatsite/logs.py, chatsite/tracing.py).
    request_id: str = ""
    traceparent: str = ""
    # When the scheduler claimed it (ms; written by `CLAIM`), the end of its wait in line.
    claimed_ms: int = 0

    @property
    def kv_tokens(self) -> int:
        """What the answer may hold in the worker's KV cache at most: its prompt and answer."""
        return self.prompt_tokens + self.max_tokens

    @property
    def fair_cost(self) -> int:
        """What the request costs its user in the fair queue: the tokens it may take."""
        return max(1, self.kv_tokens)

    def to_fields(self) -> dict[str, str]:
        return {
            "generation_id": self.generation_id,
            "pool": self.pool,
            "tier": self.tier,
            "priority": str(self.priority),
            "conversation_id": self.conversation_id,
            "message_id": self.message_id,
            "messages": json.dumps(self.messages),
            "max_tokens": str(self.max_tokens),
            "params": json.dumps(self.params),
            "enqueued_ms": str(self.enqueued_ms),
            "prompt_tokens": str(self.prompt_tokens),
            "user_id": str(self.user_id),
            "tools": json.dumps(self.tools),
            "tool_choice": json.dumps(self.tool_choice),
            "run_tools": "1" if self.run_tools else "",
            "may_fall_back": "1" if self.may_fall_back else "",
            "kept": "1" if self.kept else "",
            "relay": "1" if self.relay else "",
            "request_id": self.request_id,
            "traceparent": self.traceparent,
        }

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> Job:
        return cls(
            generation_id=fields["generation_id"],
            pool=fields["pool"],
            tier=fields["tier"],
            priority=int(fields["priority"]),
            conversation_id=fields["conversation_id"],
            message_id=fields["message_id"],
            messages=json.loads(fields["messages"]),
            max_tokens=int(fields["max_tokens"]),
            params=json.loads(fields.get("params") or "{}"),
            enqueued_ms=int(fields["enqueued_ms"]),
            prompt_tokens=int(fields.get("prompt_tokens") or 0),
            user_id=int(fields.get("user_id") or 0),
            tools=json.loads(fields.get("tools") or "[]"),
            tool_choice=json.loads(fields.get("tool_choice") or "null"),
            run_tools=bool(fields.get("run_tools")),
            may_fall_back=bool(fields.get("may_fall_back")),
            kept=fields.get("kept", "1") == "1",
            relay=bool(fields.get("relay")),
            attempt=int(fields.get("attempt") or 0),
            request_id=fields.get("request_id") or "",
            traceparent=fields.get("traceparent") or "",
            claimed_ms=int(fields.get("claimed_ms") or 0),
        )


def claim_keys(pool: str, tiers: list[str], replica_id: str) -> list[str]:
    """The keys `CLAIM` takes for `replica_id` to claim from `tiers` of `pool`, best first."""
    return [
        *(
            key
            for tier in tiers
            for key in (queue_key(pool, tier), queued_at_key(pool, tier), fair_key(pool, tier))
        ),
        job_key(""),
        owned_key(replica_id),
    ]


def abandoned_keys() -> list[str]:
    """The keys `ABANDONED` takes: the detached set and the prefixes of the keys it finds."""
    return [detached_key(), job_key(""), watchers_key(""), key("q", ""), key("qt", "")]


def expire_keys(pool: str, tiers: list[str]) -> list[str]:
    """The keys `EXPIRE_QUEUED` takes to expire what waits in `tiers` of `pool`."""
    return [key for tier in tiers for key in (queue_key(pool, tier), queued_at_key(pool, tier))]


def fallback_keys(pool: str, tier: str, fallback: str) -> list[str]:
    """The keys `MOVE_TO_FALLBACK` takes to move `tier`'s waiting answers of `pool` to
    `fallback`."""
    return [
        queue_key(pool, tier),
        queued_at_key(pool, tier),
        queue_key(fallback, tier),
        queued_at_key(fallback, tier),
        fair_key(fallback, tier),
        job_key(""),
    ]


def watch_keys(generation_id: object) -> list[str]:
    """The keys `ATTACH`, `DETACH` and `LEAVE` take for `generation_id`."""
    return [
        watchers_key(generation_id),
        job_key(generation_id),
        detached_key(),
        pages_key(generation_id),
    ]


def read_job(redis: Redis, generation_id: object) -> Job | None:
    """The job of a generation as Redis holds it (a decoding client's), or None once it is
    gone."""
    fields = cast(dict[str, str], redis.hgetall(job_key(generation_id)))
    try:
        return Job.from_fields(fields) if fields else None
    except (KeyError, ValueError):
        return None  # only marks left (a cancel flag): the job itself is gone


def enqueue(redis: Redis, job: Job) -> None:
    """Put `job` in its queue and tell the schedulers there is work."""
    fields = job.to_fields()
    flat: list[str] = []
    for name, value in fields.items():
        flat += [name, value]
    redis.eval(
        ENQUEUE,
        4,
        job_key(job.generation_id),
        queue_key(job.pool, job.tier),
        queued_at_key(job.pool, job.tier),
        fair_key(job.pool, job.tier),
        str(job.enqueued_ms),
        job.generation_id,
        str(JOB_TTL_SECONDS),
        str(job.user_id),
        str(job.fair_cost),
        *flat,
    )
    redis.publish(wake_channel(), job.pool)


def unqueue(redis: Redis, *, pool: str, tier: str, generation_id: str) -> bool:
    """Take a generation out of its queue; True if it was still waiting there."""
    return bool(
        redis.eval(UNQUEUE, 2, queue_key(pool, tier), queued_at_key(pool, tier), generation_id)
    )


def request_cancel(redis: Redis, generation_id: str) -> None:
    """Ask whichever scheduler runs `generation_id` to stop it now."""
    redis.eval(HSET_IF_EXISTS, 1, job_key(generation_id), "cancel", "1")
    redis.publish(cancel_channel(), generation_id)


def leave(redis: Redis, generation_id: str, *, page: str, closing: bool) -> bool:
    """Note that the page `page` showing `generation_id` is going away (`LEAVE`); True when
    it was closing and nobody else reads the answer, which the caller then stops at once."""
    keys = watch_keys(generation_id)
    left = redis.eval(
        LEAVE, len(keys), *keys, generation_id, str(now_ms()), page, "1" if closing else ""
    )
    return int(cast(int, left)) == LEAVE_CANCEL


def append_event(redis: Redis, generation_id: str, event: str, data: dict[str, Any]) -> None:
    """Append one event to a generation's stream (`redis` may be a pipeline)."""
    redis.xadd(stream_key(generation_id), {"event": event, "data": json.dumps(data)})


def expire_stream(redis: Redis, generation_id: str) -> None:
    redis.expire(stream_key(generation_id), settings.GENERATION_STREAM_TTL_SECONDS)


def queue_position(redis: Redis, *, pool: str, tier: str, generation_id: str) -> int | None:
    """1-based place in line across the pool's tiers, or None if no longer queued."""
    ahead = 0
    for other in tiers_best_first():
        if other == tier:
            rank = redis.zrank(queue_key(pool, tier), generation_id)
            if rank is None:
                return None
            return ahead + int(cast(int, rank)) + 1
        ahead += int(redis.zcard(queue_key(pool, other)))
    return None
