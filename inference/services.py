"""Writes of the inference plane: generations are created, queued, cancelled and finished only here.

`inference/` receives a ready job and reports what happens to it; it knows nothing of
conversations, billing, moderation or plugins. The edge's turn (`conversations.turns`)
creates the generation with `generation_create` in the transaction that writes the
assistant placeholder and queues it with `generation_enqueue`: the job reaches Redis only
after that commit, so a scheduler never sees a generation whose rows do not exist. The
scheduler calls `generation_finish` once per generation; the subscribers of
`inference.hooks` write the final text, settle usage and so on, before the stream's last
event goes out.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, cast

from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.models import DateTimeField, F, Model, QuerySet, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from chatsite import logs, rows, tracing
from chatsite.catalog import CATALOG, catalog_changed
from chatsite.errors import ServiceError
from chatsite.redis import sync_redis
from chatsite.stream_events import MetaData, StreamEvent

from . import metrics, queue
from .errors import ErrorCode
from .hooks import Outcome, get_hooks
from .models import Generation, ModelPool, Worker, worker_url_refusal
from .tokens import count_tokens, pool_tokenizer
from .unkept import UnkeptGeneration

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Admission:
    """Where and since when a scheduler runs a generation's latest attempt, and when that
    attempt's first token came (None before it)."""

    worker_id: int
    attempt: int
    admitted_at: datetime
    first_token_at: datetime | None = None


def tier_priority(tier: str) -> int:
    try:
        return int(settings.INFERENCE_TIER_PRIORITY[tier])
    except KeyError as exc:
        raise ServiceError(ErrorCode.UNKNOWN_TIER, f"Unknown plan tier {tier!r}.") from exc


@dataclass(frozen=True)
class GenerationRequest:
    """What a worker is asked: the prompt, assembled and counted by the caller, and the limits.

    `tools` are offered to the model in OpenAI's format. With `run_tools` the scheduler runs
    the calls the model makes (the tool loop, through `INFERENCE_TOOL_RUNNER`); without, the
    answer ends at the calls, for the client to run. `tool_choice` is passed on as is.
    """

    messages: list[dict[str, Any]]
    prompt_tokens: int
    params: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str | dict[str, Any] | None = None
    run_tools: bool = False
    # Under pressure, the pool's fallback may answer instead (`SCHEDULER_FALLBACK_*`).
    may_fall_back: bool = False
    # Why this pool answers when it is not the conversation's (`auto`): its `reason` and the
    # `notice` the stream's first event carries.
    route: dict[str, str] | None = None
    # The edge that took the request reads the worker's stream itself (`queue.Job.relay`):
    # only for a generation without a row, whose model is offered no tools (the caller's
    # to decide: it must know whether it relays).
    relay: bool = False


def pool_named(*, model: str) -> ModelPool:
    """The active pool serving `model`. Whether a plan may use it is billing's to judge.

    From the process's catalog (`chatsite.catalog`; a pool saved anywhere makes every
    process read it again): read-only."""
    pool = CATALOG.get(
        ("pool-named", model), lambda: ModelPool.objects.filter(name=model, is_active=True).first()
    )
    if pool is None:
        raise ServiceError(ErrorCode.UNKNOWN_MODEL, f"No model named {model!r} is served.")
    return pool


PRESSURE_RETRY_AFTER_SECONDS = 30


def pool_ensure_room_for_new(*, pool: ModelPool, tier: str, is_new: Callable[[], bool]) -> None:
    """The overload policy's last step before the queue time limit: while `pool`'s queue of
    a degraded tier holds `SCHEDULER_PRESSURE_QUEUED` answers, a new conversation of that tier
    (`is_new`, asked only then) is refused with 429."""
    threshold = settings.SCHEDULER_PRESSURE_QUEUED
    if threshold <= 0 or tier not in settings.SCHEDULER_FALLBACK_TIERS:
        return
    redis = sync_redis()
    if int(redis.zcard(queue.queue_key(pool.name, tier))) < threshold or not is_new():
        return
    metrics.REJECTIONS.labels(pool.name, tier, ErrorCode.HIGH_DEMAND).inc()
    raise ServiceError(
        ErrorCode.HIGH_DEMAND,
        "Demand is high right now: new conversations on your plan wait a moment. Please try "
        f"again in {PRESSURE_RETRY_AFTER_SECONDS} s.",
        status=429,
        detail={"retry_after": PRESSURE_RETRY_AFTER_SECONDS},
    )


def generation_create(
    *,
    message_id: Any,
    conversation_id: Any,
    user: User,
    pool: ModelPool,
    tier: str,
    max_tokens: int,
    route_reason: str = "",
) -> Generation:
    """The row of a generation answering the assistant message `message_id`, not yet queued;
    `route_reason` says why `pool` answers if it is not the conversation's."""
    # On every turn's way: a fixed INSERT, not one compiled per call (`chatsite.rows`).
    return rows.insert(
        Generation(
            message_id=message_id,
            conversation_id=conversation_id,
            user=user,
            pool=pool,
            tier=tier,
            priority=tier_priority(tier),
            max_tokens=max_tokens,
            route_reason=route_reason,
        )
    )


def generation_new_unkept(
    *,
    user: User,
    pool: ModelPool,
    tier: str,
    max_tokens: int,
    generation_id: uuid.UUID | None = None,
) -> UnkeptGeneration:
    """A generation that gets no row (inference/unkept.py): the answer of a `/v1` key that
    keeps nothing, queued by `generation_enqueue` like any other; with `generation_id`, the
    record of one queued before (an idempotent retry's)."""
    return UnkeptGeneration(
        id=generation_id or uuid.uuid4(),
        user_id=user.pk,
        pool=pool,
        tier=tier,
        priority=tier_priority(tier),
        max_tokens=max_tokens,
    )


def generation_enqueue(
    *, generation: Generation | UnkeptGeneration, request: GenerationRequest
) -> None:
    """Queue `generation` once the current transaction commits (at once outside of one): its
    `meta` event, then the job."""
    job = queue.Job(
        generation_id=str(generation.id),
        pool=generation.pool.name,
        tier=generation.tier,
        priority=generation.priority,
        conversation_id=str(generation.conversation_id or ""),
        message_id=str(generation.message_id or ""),
        messages=request.messages,
        max_tokens=generation.max_tokens,
        params=request.params,
        enqueued_ms=queue.now_ms(),
        prompt_tokens=request.prompt_tokens,
        user_id=generation.user_id,
        tools=request.tools,
        tool_choice=request.tool_choice,
        run_tools=request.run_tools and bool(request.tools),
        may_fall_back=request.may_fall_back,
        kept=not isinstance(generation, UnkeptGeneration),
        relay=request.relay and isinstance(generation, UnkeptGeneration),
        request_id=logs.request_id.get() or "",
    )

    @tracing.traced("turn.enqueue")
    def _enqueue() -> None:
        redis = sync_redis()
        queue.append_event(
            redis,
            job.generation_id,
            StreamEvent.META,
            {
                "generation_id": job.generation_id,
                "message_id": job.message_id,
                "model": job.pool,
                "status": "queued",
                "prompt_tokens_estimate": request.prompt_tokens,
                **(
                    {"route_reason": request.route["reason"], "notice": request.route["notice"]}
                    if request.route
                    else {}
                ),
            },
        )
        # The scheduler's spans continue from this one.
        queue.enqueue(redis, replace(job, traceparent=tracing.traceparent()))
        logger.debug("generation %s queued in %s (%s)", job.generation_id, job.pool, job.tier)
        if request.route:
            metrics.DEGRADATIONS.labels(job.pool, job.tier, request.route["reason"]).inc()

    transaction.on_commit(_enqueue)


def generation_cancel(*, generation: Generation) -> Generation:
    """Stop a generation now: out of the queue if it waits, else its worker request is closed.

    A generation already finished is left as it is.
    """
    if generation.is_final:
        return generation
    redis = sync_redis()
    removed = _unqueue(redis, generation)
    if removed:
        generation_finish(
            generation_id=generation.id,
            status=Generation.Status.CANCELLED,
            text="",
            finish_reason="cancelled",
        )
    else:
        queue.request_cancel(redis, str(generation.id))
    generation.refresh_from_db()
    return generation


def generation_cancel_unkept(*, generation_id: str) -> None:
    """`generation_cancel` for a generation without a row, by its id (its job says where it
    waits). One already finished is left as it is."""
    redis = sync_redis()
    job = queue.read_job(redis, generation_id)
    if job is None or job.kept:
        return
    if queue.unqueue(redis, pool=job.pool, tier=job.tier, generation_id=generation_id):
        generation_finish(
            generation_id=generation_id,
            status=Generation.Status.CANCELLED,
            text="",
            finish_reason="cancelled",
            job=job,
        )
    else:
        queue.request_cancel(redis, generation_id)


def generation_leave(*, generation: Generation, page: str = "") -> Generation:
    """The web chat's page `page` showing `generation` is going away.

    A closing tab stops the answer at once, as Stop does, unless another client still reads
    it (another tab: the answer is then theirs). A browser reloading a page asks the server
    for the new page before the old one goes (`generation_pages_shown` notes that): such a
    beacon gives the answer `STREAM_FIRST_TOKEN_GRACE_SECONDS` for the reloaded page to read
    it again, as it does at once, before housekeeping cancels it (`cancel_abandoned`). A
    generation already finished is left as it is.
    """
    if generation.is_final:
        return generation
    redis = sync_redis()
    reloading = bool(redis.exists(queue.shown_key(generation.user_id)))
    if queue.leave(redis, str(generation.id), page=page, closing=not reloading):
        return generation_cancel(generation=generation)
    return generation


def generation_pages_shown(*, user: User) -> None:
    """A page of the web chat was just served to `user`: a beacon from one of their pages
    within `STREAM_RELOAD_SECONDS` comes from a page being reloaded (`generation_leave`)."""
    sync_redis().set(
        queue.shown_key(user.pk), "1", px=max(1, int(settings.STREAM_RELOAD_SECONDS * 1000))
    )


def generations_abandon(*, generations: list[Generation]) -> None:
    """Stop generations whose rows are going (their conversation is being removed): out of
    the queue, or their worker request closed by the scheduler. The caller drops their
    streams."""
    redis = sync_redis()
    for generation in generations:
        _unqueue(redis, generation)
        queue.request_cancel(redis, str(generation.id))


def _unqueue(redis: Any, generation: Generation) -> bool:
    """Take `generation` out of whichever queue it waits in: its pool's, or its pool's
    fallback's (where the overload policy may have moved it since the row was read)."""
    pools = [generation.pool.name]
    if generation.pool.fallback_id is not None:
        pools.append(_pool_name(generation.pool.fallback_id))
    gid = str(generation.id)
    return any(
        queue.unqueue(redis, pool=name, tier=generation.tier, generation_id=gid) for name in pools
    )


def _pool_name(pool_id: int) -> str:
    return str(ModelPool.objects.values_list("name", flat=True).get(pk=pool_id))


def generations_route(*, generation_ids: list[str], pool_name: str, reason: str) -> MetaData:
    """Record that the queued generations `generation_ids` are answered by `pool_name`, for
    `reason` (`Generation.RouteReason`); returns the `meta` event that tells their streams."""
    notice = f"Answered by the smaller model {pool_name}: {ROUTE_NOTICES[reason]}."
    with transaction.atomic():
        pool = ModelPool.objects.get(name=pool_name)
        Generation.objects.filter(pk__in=generation_ids, status=Generation.Status.QUEUED).update(
            served_pool=pool, route_reason=reason
        )
        get_hooks().generations_routed(
            generation_ids=generation_ids,
            route={"model": pool_name, "reason": reason, "notice": notice},
        )
    return {"status": "queued", "model": pool_name, "route_reason": reason, "notice": notice}


# What the user is told of each reason an answer went to another pool.
ROUTE_NOTICES: dict[str, str] = {Generation.RouteReason.HIGH_DEMAND: "high demand"}


# The finish reason of an answer that output moderation withdrew (OpenAI's name for it).
CONTENT_FILTER = "content_filter"


def generation_lock_unfinished(generation_id: Any) -> Generation | None:
    """The generation, row-locked until the transaction ends, if it is not final yet."""
    return (
        Generation.objects.select_for_update(of=("self",))
        .select_related("pool", "served_pool", "conversation")
        .filter(pk=generation_id)
        .exclude(status__in=Generation.FINAL_STATUSES)
        .first()
    )


def generation_finish(
    *,
    generation_id: Any,
    status: str,
    text: str,
    finish_reason: str = "",
    prompt_tokens: int | None = None,
    output_tokens: int | None = None,
    cached_tokens: int | None = None,
    error_code: str = "",
    error_message: str = "",
    admission: Admission | None = None,
    job: queue.Job | None = None,
) -> bool:
    """Write the final state once, tell the hooks, then close the stream; False if it was
    already final. `admission`: the scheduler's record of the attempt, written with it.
    `job`, when the caller holds it: an unkept one is finished from it alone, without a
    statement (inference/unkept.py); without it, one without a row is looked for in Redis."""
    outcome = Outcome(
        status=status,
        text=text,
        finish_reason=finish_reason,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        cached_tokens=cached_tokens,
    )
    if job is None or job.kept:
        finished = _finish_row(
            generation_id,
            outcome,
            error_code=error_code,
            error_message=error_message,
            admission=admission,
            job=job,
        )
        if finished is not None:
            return finished
        redis = sync_redis()
        job = queue.read_job(redis, generation_id)
        if job is None or job.kept:
            # Its conversation was deleted meanwhile: leave nothing behind in Redis.
            redis.delete(queue.stream_key(generation_id), queue.job_key(generation_id))
            return False
    return _finish_unkept(job, outcome, error_code=error_code, error_message=error_message)


def _finish_row(
    generation_id: Any,
    outcome: Outcome,
    *,
    error_code: str,
    error_message: str,
    admission: Admission | None,
    job: queue.Job | None,
) -> bool | None:
    """`generation_finish` of a generation with a row; None if it has none."""
    hooks = get_hooks()
    if outcome.output_tokens is None and outcome.text:
        # Counted with the answering pool's tokenizer: the job names it, else the row does.
        pool = _pool_of_job(job.pool) if job is not None else _pool_of_row(generation_id)
        if pool is None:
            return None
        outcome = _counted(outcome, pool)
    with transaction.atomic():
        generation = _write_final(
            generation_id,
            outcome,
            error_code=error_code,
            error_message=error_message,
            admission=admission,
        )
        if generation is None:
            return False if Generation.objects.filter(pk=generation_id).exists() else None
        hooks.generation_finishing(generation=generation, outcome=outcome)

    # The scheduler (which holds the job) flushes what the hooks owe a second later.
    hooks.generation_finished(generation=generation, outcome=outcome, flush_follows=job is not None)
    metrics.finished(generation=generation, error_code=error_code)
    _close_stream(str(generation_id), outcome, error_code=error_code, error_message=error_message)
    return True


def _write_final(
    generation_id: Any,
    outcome: Outcome,
    *,
    error_code: str,
    error_message: str,
    admission: Admission | None,
) -> Generation | None:
    """Write the final state of a generation that is not final yet, and return it with its
    conversation and pools (these from the catalog), locked until the transaction ends;
    None, writing nothing, if it is final already or has no row.

    One `UPDATE ... RETURNING` joined to the conversation, where a locking read and then
    an update took two statements.
    """
    now = timezone.now()
    written: dict[str, Any] = {
        "status": outcome.status,
        "finished_at": now,
        "finish_reason": outcome.finish_reason,
        "prompt_tokens": outcome.prompt_tokens,
        "output_tokens": outcome.output_tokens,
        "cached_tokens": outcome.cached_tokens,
        "error_code": error_code,
        "error_message": error_message[:2000],
    }
    if admission is not None:
        written |= {
            "worker": admission.worker_id,
            "attempts": admission.attempt,
            "admitted_at": admission.admitted_at,
        }
    meta = Generation._meta
    fields = {field.name: field for field in meta.concrete_fields}
    conversation_model = cast("type[Model]", fields["conversation"].related_model)
    quote = connection.ops.quote_name
    sets, params = [], []
    for name, value in written.items():
        sets.append(f"{quote(str(fields[name].column))} = %s")
        params.append(fields[name].get_db_prep_save(value, connection))
    if admission is not None:
        sets.append("first_token_at = COALESCE(first_token_at, %s)")
        params.append(
            fields["first_token_at"].get_db_prep_save(admission.first_token_at, connection)
        )
    final = sorted(Generation.FINAL_STATUSES)
    conversation_fields = conversation_model._meta.concrete_fields
    selected = [f"g.{quote(str(field.column))}" for field in meta.concrete_fields] + [
        f"c.{quote(str(field.column))}" for field in conversation_fields
    ]
    # Names from the models, never from input; every value a bound parameter.
    sql = (
        f"WITH g AS (UPDATE {quote(meta.db_table)}"  # noqa: S608
        f" SET {', '.join(sets)} WHERE id = %s"
        f" AND status NOT IN ({', '.join(['%s'] * len(final))}) RETURNING *)"
        f" SELECT {', '.join(selected)} FROM g"
        f" JOIN {quote(conversation_model._meta.db_table)} c"
        " ON c.id = g.conversation_id"
    )
    params += [meta.pk.get_db_prep_value(generation_id, connection), *final]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    count = len(meta.concrete_fields)
    generation = Generation.from_db(
        connection.alias, [field.attname for field in meta.concrete_fields], row[:count]
    )
    conversation = conversation_model.from_db(
        connection.alias, [field.attname for field in conversation_fields], row[count:]
    )
    cache = generation._state.fields_cache
    cache["conversation"] = conversation
    cache["pool"] = _pool_of_id(generation.pool_id)
    if generation.served_pool_id is not None:
        cache["served_pool"] = _pool_of_id(generation.served_pool_id)
    return generation


def _pool_of_row(generation_id: Any) -> ModelPool | None:
    """The pool a generation's row names (None: it has no row)."""
    pool_id = Generation.objects.filter(pk=generation_id).values_list("pool_id", flat=True)
    return _pool_of_id(found) if (found := pool_id.first()) is not None else None


def _pool_of_id(pool_id: int) -> ModelPool:
    """A pool by its id, from the catalog, active or not."""
    return CATALOG.get(("pool-of-id", pool_id), lambda: ModelPool.objects.get(pk=pool_id))


def _finish_unkept(
    job: queue.Job, outcome: Outcome, *, error_code: str, error_message: str
) -> bool:
    """`generation_finish` of a generation without a row: no statement, only the hooks
    (billing settles it and owes its usage event to the ledger's outbox) and Redis."""
    gid = job.generation_id
    redis = sync_redis()
    if not redis.eval(queue.FINISH_UNKEPT, 1, queue.job_key(gid)):
        return False
    pool = _pool_of_job(job.pool)
    outcome = _counted(outcome, pool)
    generation = UnkeptGeneration.from_job(job, pool)
    generation.status = outcome.status
    generation.finished_at = timezone.now()
    generation.prompt_tokens = outcome.prompt_tokens
    generation.output_tokens = outcome.output_tokens
    generation.cached_tokens = outcome.cached_tokens
    get_hooks().generation_finished(generation=generation, outcome=outcome)
    metrics.finished(generation=generation, error_code=error_code)
    _close_stream(gid, outcome, error_code=error_code, error_message=error_message)
    return True


def _counted(outcome: Outcome, pool: ModelPool) -> Outcome:
    """`outcome` with its output tokens: the worker never reported usage (cancelled, failed),
    so what it produced is counted with the pool's tokenizer."""
    if outcome.output_tokens is not None or not outcome.text:
        return outcome
    return replace(outcome, output_tokens=count_tokens(pool_tokenizer(pool), outcome.text))


def _pool_of_job(name: str) -> ModelPool:
    """The pool a job names, from the catalog, active or not (it may have been switched off
    while the answer ran)."""
    pool = CATALOG.get(("pool-of-job", name), lambda: ModelPool.objects.filter(name=name).first())
    if pool is None:
        raise ModelPool.DoesNotExist(f"no pool named {name!r}")
    return pool


def _close_stream(gid: str, outcome: Outcome, *, error_code: str, error_message: str) -> None:
    """The stream's last events, its expiry and the job's removal: one round trip."""
    with sync_redis().pipeline(transaction=False) as pipe:
        if outcome.status in (Generation.Status.FAILED, Generation.Status.REJECTED):
            queue.append_event(
                pipe, gid, StreamEvent.ERROR, {"code": error_code, "message": error_message}
            )
        queue.append_event(
            pipe,
            gid,
            StreamEvent.DONE,
            {
                "status": outcome.status,
                "finish_reason": outcome.finish_reason,
                "prompt_tokens": outcome.prompt_tokens,
                "output_tokens": outcome.output_tokens,
                "cached_tokens": outcome.cached_tokens,
            },
        )
        queue.expire_stream(pipe, gid)
        pipe.delete(queue.job_key(gid))
        pipe.execute()


def generation_add_tool_round(
    *,
    generation_id: Any,
    text: str,
    tool_calls: list[dict[str, Any]],
    results: list[dict[str, Any]],
) -> bool:
    """Keep one round of the tool loop (the hooks write it where the answer's transcript
    lives); False if the generation ended meanwhile and must not be continued.

    `text` is what the model said before its calls, `tool_calls` the calls in OpenAI's
    format, `results` one per call (`tool_call_id`, `name`, `content`, `ok`).
    """
    return get_hooks().generation_tool_round(
        generation_id=generation_id, text=text, tool_calls=tool_calls, results=results
    )


def generation_record_tool_calls(*, generation_id: Any, tool_calls: list[dict[str, Any]]) -> None:
    """Keep the calls an answer ended with, for a client that runs its own tools (`/v1`)."""
    get_hooks().generation_tool_calls(generation_id=generation_id, tool_calls=tool_calls)


def generation_mark_started(*, generation_id: Any, admission: Admission) -> None:
    """Record that the answer is streaming: on which worker, admitted when, its first token.

    One statement, written beside the answer (never before it) and never over a final state;
    the final state carries the same facts, so an answer that ends before this lands loses
    nothing.
    """
    Generation.objects.filter(
        pk=generation_id, status__in=[Generation.Status.QUEUED, Generation.Status.RUNNING]
    ).update(
        status=Generation.Status.RUNNING,
        worker_id=admission.worker_id,
        attempts=admission.attempt,
        admitted_at=admission.admitted_at,
        first_token_at=Coalesce(
            F("first_token_at"),
            Value(admission.first_token_at or timezone.now(), output_field=DateTimeField()),
        ),
    )
    get_hooks().generation_first_token(generation_id=generation_id)


def worker_set_state(*, worker_id: int, state: str, error: str = "") -> bool:
    """Move a worker to `state` (healthy or down) unless staff are draining it."""
    now = timezone.now()
    changed = (
        Worker.objects.filter(pk=worker_id)
        .exclude(state=state)
        .exclude(state=Worker.State.DRAINING)
        .update(state=state, state_changed_at=now, last_error=error[:2000])
    )
    if state == Worker.State.HEALTHY:
        Worker.objects.filter(pk=worker_id).update(last_seen_at=now)
    if changed:
        catalog_changed()  # every replica's fleet (update() sends no signal)
    return bool(changed)


def workers_sync_from_settings() -> list[Worker]:
    """Register the workers named in `settings.INFERENCE_WORKERS` (pool=url entries), each
    held to the address policy as a worker staff add (`Worker.clean`)."""
    workers = []
    for index, entry in enumerate(settings.INFERENCE_WORKERS):
        pool_name, sep, url = entry.partition("=")
        if not sep or not url.startswith(("http://", "https://")):
            raise ServiceError(
                ErrorCode.BAD_WORKER_SETTING,
                f"INFERENCE_WORKERS entry {entry!r} is not pool=http(s)://host:port",
            )
        refusal = worker_url_refusal(url.strip())
        if refusal is not None:
            raise ServiceError(
                ErrorCode.BAD_WORKER_SETTING, f"INFERENCE_WORKERS entry {entry!r}: {refusal}"
            )
        pool, _ = ModelPool.objects.get_or_create(
            name=pool_name.strip(), defaults={"served_model": pool_name.strip()}
        )
        worker, _ = Worker.objects.get_or_create(
            url=url.strip().rstrip("/"),
            defaults={
                "pool": pool,
                "name": f"{pool.name}-{index + 1}",
                "origin": Worker.Origin.SETTINGS,
            },
        )
        workers.append(worker)
    return workers


def live_scheduler_replicas() -> set[str]:
    """Ids of the scheduler replicas whose heartbeat is current."""
    redis = sync_redis()
    prefix = queue.key("replica", "")
    return {str(name)[len(prefix) :] for name in redis.scan_iter(match=prefix + "*")}


def generation_sweep_stale(*, live_replicas: set[str], grace_seconds: int = 60) -> int:
    """Fail generations no scheduler is serving any more; returns how many were failed.

    A generation is stale when it is not final, its job is gone or is owned by a replica that
    no longer beats, and it is older than `grace_seconds` (a job between commit and enqueue
    is not stale).
    """
    redis = sync_redis()
    cutoff = timezone.now() - timedelta(seconds=grace_seconds)
    failed = 0
    candidates = Generation.objects.exclude(status__in=Generation.FINAL_STATUSES).filter(
        enqueued_at__lt=cutoff
    )
    for generation in candidates.select_related("pool").iterator():
        gid = str(generation.id)
        job = redis.hgetall(queue.job_key(gid))
        if job:
            owner = job.get("owner")
            if owner is None:
                # The job's own pool: the overload policy may have moved it to the fallback's.
                waits_in = str(job.get("pool") or generation.pool.name)
                in_queue = redis.zscore(queue.queue_key(waits_in, generation.tier), gid)
                if in_queue is not None:
                    continue
            elif owner in live_replicas:
                continue
        if generation_end_lost(generation_id=gid, status=Generation.Status.FAILED):
            logger.warning("swept stale generation %s", gid)
            failed += 1
    return failed


def generation_end_lost(*, generation_id: str, status: str) -> bool:
    """End a generation whose scheduler replica died with it: failed (no attempt left, or
    nobody owns it) or cancelled (it was asked to stop), with the text its stream carried.
    False if it was already final."""
    partial = _stream_text(sync_redis(), generation_id)
    if status == Generation.Status.CANCELLED:
        return generation_finish(
            generation_id=generation_id, status=status, text=partial, finish_reason="cancelled"
        )
    return generation_finish(
        generation_id=generation_id,
        status=Generation.Status.FAILED,
        text=partial,
        finish_reason="error",
        error_code=ErrorCode.SCHEDULER_LOST,
        error_message="The service lost this answer; please regenerate it.",
    )


def _stream_text(redis: Any, generation_id: str) -> str:
    """The text a stream carried since its last restart."""
    text = ""
    for _, fields in redis.xrange(queue.stream_key(generation_id)):
        if fields.get("event") == StreamEvent.DELTA:
            text += json.loads(fields["data"]).get("text", "")
        elif fields.get("event") in (StreamEvent.RESTART, StreamEvent.TOOL_START):
            # Text before a tool round is stored with the round, not in the answer.
            text = ""
    return text


def workers_drain(*, workers: QuerySet[Worker]) -> int:
    """Stop sending new generations to `workers`; those running finish."""
    drained = workers.exclude(state=Worker.State.DRAINING).update(
        state=Worker.State.DRAINING, state_changed_at=timezone.now()
    )
    catalog_changed()  # every replica's fleet (update() sends no signal)
    return drained


def workers_undrain(*, workers: QuerySet[Worker]) -> int:
    """Return drained workers to service; the health loop marks them healthy when they answer."""
    undrained = workers.filter(state=Worker.State.DRAINING).update(
        state=Worker.State.DOWN, state_changed_at=timezone.now()
    )
    catalog_changed()
    return undrained
