"""The Redis side of quotas: every check-and-change is one Lua script, all or nothing.

Keys of one user share a hash tag (`{u<id>}`), so each script touches one Cluster slot:

- `rpm`, `tpm`        token buckets (hash: `level`, `ts`): capacity = the per-minute limit,
                      refilled continuously at limit/60 s; an absent bucket is full
- `cap:<pool>`        sorted set of reservation ids scored by reservation time (ms): the
                      rolling message-cap window of one pool
- `conc`              sorted set of reservation ids scored by slot expiry (ms): a process that
                      dies leaves a slot that lapses by itself
- `res:<id>`          hash: what a reservation holds (tokens, prompt estimate, pool), until
                      it is settled with the real usage
- `open` (global)     sorted set `<user>:<id>` by reservation time: the reconciler's index of
                      unsettled reservations (written beside the script, not inside it, as it
                      lives in another slot)

Every script takes `now` (ms) as an argument: the caller's clock, so tests can move time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, cast

from django.conf import settings
from redis import Redis
from redis.commands.core import Script

from chatsite.redis import shared_redis

SCOPE_REQUESTS = "requests"
SCOPE_TOKENS = "tokens"
SCOPE_MESSAGES = "messages"
SCOPE_CONCURRENCY = "concurrency"

# Bucket arithmetic shared by the scripts. Levels are fractional tokens (doubles in Lua);
# they are quota, not money.
_BUCKET = """
local function bucket_level(key, capacity, now)
  local state = redis.call('HMGET', key, 'level', 'ts')
  local level = tonumber(state[1])
  local ts = tonumber(state[2])
  if level == nil or ts == nil then
    return capacity, now
  end
  if now > ts then
    level = level + (now - ts) * capacity / 60000
    ts = now
  end
  if level > capacity then
    level = capacity
  end
  return level, ts
end

local function ms_to_full(capacity, level)
  if level >= capacity then
    return 0
  end
  return math.ceil((capacity - level) * 60000 / capacity)
end

local function bucket_store(key, capacity, level, ts)
  redis.call('HSET', key, 'level', tostring(level), 'ts', tostring(ts))
  -- A full bucket is the same as no bucket: let the key go once it would be full.
  redis.call('PEXPIRE', key, ms_to_full(capacity, level) + 1000)
end

local function remaining(level)
  if level < 0 then
    return 0
  end
  return math.floor(level)
end
"""

# KEYS: rpm, tpm, cap, conc, res
# ARGV: now, id, rpm limit, tpm limit, tokens, cap (0 = none), cap window ms,
#       concurrency limit, slot ttl ms, reservation ttl ms, prompt estimate, pool id,
#       retry hint for concurrency (ms)
# Returns {1, rpm remaining, rpm reset ms, tpm remaining, tpm reset ms} when admitted, or
# {0, scope, retry ms, scope, retry ms, ...} with every scope that refused.
RESERVE = (
    _BUCKET
    + """
local now = tonumber(ARGV[1])
local id = ARGV[2]
local rpm_limit = tonumber(ARGV[3])
local tpm_limit = tonumber(ARGV[4])
local tokens = tonumber(ARGV[5])
local cap = tonumber(ARGV[6])
local window = tonumber(ARGV[7])
local concurrency = tonumber(ARGV[8])
local refused = {0}

local rpm_level, rpm_ts = bucket_level(KEYS[1], rpm_limit, now)
local tpm_level, tpm_ts = bucket_level(KEYS[2], tpm_limit, now)
if redis.call('EXISTS', KEYS[5]) == 1 then
  -- Already reserved under this id: nothing more is taken.
  return {1, remaining(rpm_level), ms_to_full(rpm_limit, rpm_level),
          remaining(tpm_level), ms_to_full(tpm_limit, tpm_level)}
end

-- Slots whose holder died without settling have expired: they free themselves here.
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
if redis.call('ZCARD', KEYS[4]) >= concurrency then
  table.insert(refused, 'concurrency')
  table.insert(refused, tonumber(ARGV[13]))
end

if cap > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - window)
  local count = redis.call('ZCARD', KEYS[3])
  if count >= cap then
    -- The window admits one more once this entry (the oldest beyond the cap) has left it.
    local entry = redis.call('ZRANGE', KEYS[3], count - cap, count - cap, 'WITHSCORES')
    table.insert(refused, 'messages')
    table.insert(refused, math.max(1, tonumber(entry[2]) + window - now))
  end
end

if rpm_level < 1 then
  table.insert(refused, 'requests')
  table.insert(refused, math.ceil((1 - rpm_level) * 60000 / rpm_limit))
end
if tpm_level < tokens then
  table.insert(refused, 'tokens')
  table.insert(refused, math.ceil((tokens - tpm_level) * 60000 / tpm_limit))
end
if #refused > 1 then
  return refused
end

rpm_level = rpm_level - 1
tpm_level = tpm_level - tokens
bucket_store(KEYS[1], rpm_limit, rpm_level, rpm_ts)
bucket_store(KEYS[2], tpm_limit, tpm_level, tpm_ts)
if cap > 0 then
  redis.call('ZADD', KEYS[3], now, id)
  redis.call('PEXPIRE', KEYS[3], window)
end
local slot_ttl = tonumber(ARGV[9])
redis.call('ZADD', KEYS[4], now + slot_ttl, id)
redis.call('PEXPIRE', KEYS[4], slot_ttl)
redis.call('HSET', KEYS[5], 'tokens', tokens, 'prompt', ARGV[11], 'pool', ARGV[12], 'at', now)
redis.call('PEXPIRE', KEYS[5], ARGV[10])
return {1, remaining(rpm_level), ms_to_full(rpm_limit, rpm_level),
        remaining(tpm_level), ms_to_full(tpm_limit, tpm_level)}
"""
)

# KEYS: tpm, cap, conc, res
# ARGV: now, id, tpm limit, tokens charged, refund the message (1/0)
# Returns the tokens the reservation held, or -1 if there was none (already settled).
SETTLE = (
    _BUCKET
    + """
local reserved = tonumber(redis.call('HGET', KEYS[4], 'tokens'))
if reserved == nil then
  return -1
end
local now = tonumber(ARGV[1])
local tpm_limit = tonumber(ARGV[3])
local level, ts = bucket_level(KEYS[1], tpm_limit, now)
-- Unused tokens go back, never above capacity; an overrun is charged (the level may go
-- below zero, and the bucket then takes longer to refill).
level = math.min(tpm_limit, level + reserved - tonumber(ARGV[4]))
bucket_store(KEYS[1], tpm_limit, level, ts)
redis.call('ZREM', KEYS[3], ARGV[2])
if ARGV[5] == '1' then
  redis.call('ZREM', KEYS[2], ARGV[2])
end
redis.call('DEL', KEYS[4])
return reserved
"""
)

# KEYS: rpm, tpm   ARGV: now, rpm limit, tpm limit
# Returns {rpm remaining, rpm reset ms, tpm remaining, tpm reset ms}; changes nothing.
PEEK = (
    _BUCKET
    + """
local now = tonumber(ARGV[1])
local rpm_limit = tonumber(ARGV[2])
local tpm_limit = tonumber(ARGV[3])
local rpm_level = bucket_level(KEYS[1], rpm_limit, now)
local tpm_level = bucket_level(KEYS[2], tpm_limit, now)
return {remaining(rpm_level), ms_to_full(rpm_limit, rpm_level),
        remaining(tpm_level), ms_to_full(tpm_limit, tpm_level)}
"""
)


@dataclass(frozen=True)
class Limits:
    """One user's limits for one pool, as the scripts take them."""

    requests_per_minute: int
    tokens_per_minute: int
    max_concurrent: int
    message_cap: int | None
    message_cap_window_ms: int


@dataclass(frozen=True)
class BucketState:
    limit: int
    remaining: int
    reset_ms: int


@dataclass(frozen=True)
class Refusal:
    scope: str
    retry_ms: int


@dataclass(frozen=True)
class Outcome:
    """A reservation's answer: admitted with the buckets after it, or every refusing scope."""

    admitted: bool
    requests: BucketState | None = None
    tokens: BucketState | None = None
    refusals: tuple[Refusal, ...] = ()


@dataclass(frozen=True)
class Held:
    """What an unsettled reservation holds."""

    tokens: int
    prompt_tokens: int
    pool_id: int


def now_ms() -> int:
    return int(time.time() * 1000)


def client() -> Redis:
    # Called on every request from many threads: the process's one pooled client.
    return shared_redis()


@lru_cache(maxsize=16)
def _script(url: str, source: str) -> Script:
    return shared_redis(url).register_script(source)


def script(source: str) -> Script:
    return _script(settings.REDIS_URL, source)


def _key(user_id: int, *parts: object) -> str:
    return ":".join([settings.BILLING_REDIS_PREFIX, f"{{u{user_id}}}", *(str(p) for p in parts)])


def rpm_key(user_id: int) -> str:
    return _key(user_id, "rpm")


def tpm_key(user_id: int) -> str:
    return _key(user_id, "tpm")


def cap_key(user_id: int, pool_id: int) -> str:
    return _key(user_id, "cap", pool_id)


def concurrency_key(user_id: int) -> str:
    return _key(user_id, "conc")


def reservation_key(user_id: int, reservation_id: str) -> str:
    return _key(user_id, "res", reservation_id)


def idempotency_key(user_id: int, digest: str) -> str:
    return _key(user_id, "idem", digest)


def open_key() -> str:
    return f"{settings.BILLING_REDIS_PREFIX}:open"


def reserve(
    *,
    user_id: int,
    pool_id: int,
    reservation_id: str,
    prompt_tokens: int,
    tokens: int,
    limits: Limits,
    now: int,
) -> Outcome:
    """Take one request, `tokens` tokens, a message and a slot from every scope, or nothing."""
    reply = cast(
        list[Any],
        script(RESERVE)(
            keys=[
                rpm_key(user_id),
                tpm_key(user_id),
                cap_key(user_id, pool_id),
                concurrency_key(user_id),
                reservation_key(user_id, reservation_id),
            ],
            args=[
                now,
                reservation_id,
                limits.requests_per_minute,
                limits.tokens_per_minute,
                tokens,
                limits.message_cap or 0,
                limits.message_cap_window_ms,
                limits.max_concurrent,
                settings.BILLING_SLOT_TTL_SECONDS * 1000,
                settings.BILLING_RESERVATION_TTL_SECONDS * 1000,
                prompt_tokens,
                pool_id,
                settings.BILLING_CONCURRENCY_RETRY_SECONDS * 1000,
            ],
        ),
    )
    if int(reply[0]) == 0:
        pairs = reply[1:]
        refusals = tuple(
            Refusal(scope=str(pairs[i]), retry_ms=int(pairs[i + 1]))
            for i in range(0, len(pairs), 2)
        )
        return Outcome(admitted=False, refusals=refusals)
    client().zadd(open_key(), {f"{user_id}:{reservation_id}": now})
    return Outcome(
        admitted=True,
        requests=BucketState(limits.requests_per_minute, int(reply[1]), int(reply[2])),
        tokens=BucketState(limits.tokens_per_minute, int(reply[3]), int(reply[4])),
    )


def held(*, user_id: int, reservation_id: str) -> Held | None:
    """What the reservation holds, or None once it is settled (or never was)."""
    tokens, prompt, pool = client().hmget(
        reservation_key(user_id, reservation_id), ["tokens", "prompt", "pool"]
    )
    if tokens is None:
        return None
    return Held(tokens=int(tokens), prompt_tokens=int(prompt or 0), pool_id=int(pool or 0))


def settle(
    *,
    user_id: int,
    pool_id: int,
    reservation_id: str,
    tokens_per_minute: int,
    charged_tokens: int,
    refund_message: bool,
    now: int,
) -> int | None:
    """Replace the reservation by what was used; returns the tokens it held, None if settled."""
    reserved = int(
        cast(
            int,
            script(SETTLE)(
                keys=[
                    tpm_key(user_id),
                    cap_key(user_id, pool_id),
                    concurrency_key(user_id),
                    reservation_key(user_id, reservation_id),
                ],
                args=[
                    now,
                    reservation_id,
                    tokens_per_minute,
                    charged_tokens,
                    1 if refund_message else 0,
                ],
            ),
        )
    )
    client().zrem(open_key(), f"{user_id}:{reservation_id}")
    return None if reserved < 0 else reserved


def peek(
    *, user_id: int, requests_per_minute: int, tokens_per_minute: int, now: int
) -> tuple[BucketState, BucketState]:
    """The request and token buckets as they stand, refilled to `now`."""
    reply = cast(
        list[int],
        script(PEEK)(
            keys=[rpm_key(user_id), tpm_key(user_id)],
            args=[now, requests_per_minute, tokens_per_minute],
        ),
    )
    return (
        BucketState(requests_per_minute, int(reply[0]), int(reply[1])),
        BucketState(tokens_per_minute, int(reply[2]), int(reply[3])),
    )


def cap_window(*, user_id: int, pool_id: int, window_ms: int, now: int) -> dict[str, int]:
    """Reservation id -> time (ms) of every message counted in the rolling window."""
    entries = cast(
        list[tuple[str, float]],
        client().zrangebyscore(cap_key(user_id, pool_id), now - window_ms, "+inf", withscores=True),
    )
    return {str(member): int(score) for member, score in entries}


def concurrency_in_use(*, user_id: int, now: int) -> int:
    return int(client().zcount(concurrency_key(user_id), f"({now}", "+inf"))


def open_reservations(*, before: int, limit: int = 10_000) -> list[tuple[int, str]]:
    """(user id, reservation id) of unsettled reservations made before `before` (ms)."""
    members = client().zrangebyscore(open_key(), "-inf", before, start=0, num=limit)
    pairs = []
    for member in members:
        user_id, _, reservation_id = str(member).partition(":")
        pairs.append((int(user_id), reservation_id))
    return pairs


def forget_open(*, user_id: int, reservation_id: str) -> None:
    client().zrem(open_key(), f"{user_id}:{reservation_id}")


def slot_extend(*, user_id: int, reservation_id: str, now: int) -> bool:
    """Keep a live generation's slot (only if it still holds one)."""
    until = now + settings.BILLING_SLOT_TTL_SECONDS * 1000
    redis = client()
    changed = redis.zadd(concurrency_key(user_id), {reservation_id: until}, xx=True, ch=True)
    if changed:
        redis.pexpire(concurrency_key(user_id), settings.BILLING_SLOT_TTL_SECONDS * 1000)
    return bool(changed)


def cap_repair(
    *,
    user_id: int,
    pool_id: int,
    window_ms: int,
    add: dict[str, int],
    remove: list[str],
) -> None:
    """Put missing messages back into a cap window and take stray ones out."""
    key = cap_key(user_id, pool_id)
    pipe = client().pipeline(transaction=True)
    if add:
        pipe.zadd(key, add)
        pipe.pexpire(key, window_ms)
    if remove:
        pipe.zrem(key, *remove)
    pipe.execute()


# KEYS: key   ARGV: value. Deletes the key only while it still holds `value`.
DELETE_IF_EQUAL = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
