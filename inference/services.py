"""Writes of the inference plane: generations are started, cancelled and finished only here.

The edge calls `generation_start` in the transaction that creates the assistant placeholder;
the job reaches Redis only after that commit, so a scheduler never sees a generation whose
rows do not exist. The scheduler calls `generation_finish` once per generation, which writes
the final text to Postgres (never per token) before the stream's last event goes out.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from billing.services import generation_settle, reservation_create
from chatsite.errors import ServiceError
from conversations.context import assemble_context, count_tokens, load_tokenizer
from conversations.models import Conversation, Message
from conversations.selectors import active_branch
from conversations.summaries import summary_for_branch, summary_request_if_needed
from conversations.titles import title_request_after_answer
from plugins.builtin.search_index import search_index_schedule
from plugins.selectors import tools_for_conversation

from . import queue
from .errors import ErrorCode
from .models import Generation, ModelPool, Worker

logger = logging.getLogger(__name__)

# Tokens a chat template adds around the tools it is given (the instructions that frame them).
TOOLS_OVERHEAD_TOKENS = 80


def tier_priority(tier: str) -> int:
    try:
        return int(settings.INFERENCE_TIER_PRIORITY[tier])
    except KeyError as exc:
        raise ServiceError(ErrorCode.UNKNOWN_TIER, f"Unknown plan tier {tier!r}.") from exc


def pool_for_model(*, model: str, tier: str) -> ModelPool:
    """The active pool serving `model` that `tier` may use."""
    pool = ModelPool.objects.filter(name=model, is_active=True).first()
    if pool is None:
        raise ServiceError(ErrorCode.UNKNOWN_MODEL, f"No model named {model!r} is served.")
    if tier not in pool.tiers:
        raise ServiceError(
            ErrorCode.MODEL_NOT_IN_PLAN,
            f"Your plan does not include {model!r}.",
            status=403,
        )
    return pool


def pool_tokenizer_folder(pool: ModelPool) -> str:
    return pool.tokenizer_path or str(settings.MODEL_DIR)


def generation_start(
    *,
    message: Message,
    user: User,
    tier: str | None = None,
    max_tokens: int | None = None,
    params: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: str | dict[str, Any] | None = None,
) -> Generation:
    """Create the generation for a queued assistant placeholder and queue it after commit.

    Without `tools`, the model is offered the plugin tools this user may call in this
    conversation, and the scheduler runs the calls it makes (the tool loop). With `tools`
    (OpenAI's format, from a `/v1` client) those are offered instead and the answer ends at
    the model's calls, which the client runs. `tool_choice` is passed to the model as is.
    """
    if message.role != Message.Role.ASSISTANT or message.status != Message.Status.QUEUED:
        raise ValueError("a generation starts from a queued assistant placeholder")
    tier = tier or settings.DEFAULT_TIER
    conversation = message.conversation
    pool = pool_for_model(model=conversation.model, tier=tier)
    max_tokens = min(max_tokens or pool.max_output_tokens, pool.max_output_tokens)

    branch = active_branch(conversation=conversation)
    if not branch or branch[-1].pk != message.pk:
        raise ValueError("the placeholder must be the conversation's current leaf")
    branch = branch[:-1]
    tokenizer = load_tokenizer(pool_tokenizer_folder(pool))
    run_tools = tools is None
    if tools is None:
        tools = [
            spec.to_openai()
            for spec in tools_for_conversation(user=user, conversation=conversation)
        ]
    # The template writes the tools into the prompt: they take room in the window.
    tools_tokens = (
        count_tokens(tokenizer, json.dumps(tools)) + TOOLS_OVERHEAD_TOKENS if tools else 0
    )
    budget_tokens = pool.context_window - max_tokens - tools_tokens
    context = assemble_context(
        branch=branch,
        tokenizer=tokenizer,
        budget_tokens=budget_tokens,
        summary=summary_for_branch(branch=branch),
    )
    # Issue 9: turns dropped that no summary covers: the branch's summary is due.
    summary_request_if_needed(
        conversation=conversation, leaf=branch[-1], context=context, budget_tokens=budget_tokens
    )
    prompt_tokens = context.prompt_tokens + tools_tokens
    generation = Generation.objects.create(
        message=message,
        conversation=conversation,
        user=user,
        pool=pool,
        tier=tier,
        priority=tier_priority(tier),
        max_tokens=max_tokens,
    )
    # Billing (issue 5): reserve the prompt estimate plus max output tokens against every
    # limit of the user's plan at once; a refusal (403/413/429) rolls the turn back.
    reservation_create(generation=generation, prompt_tokens=prompt_tokens)
    job = queue.Job(
        generation_id=str(generation.id),
        pool=pool.name,
        tier=tier,
        priority=generation.priority,
        conversation_id=str(conversation.id),
        message_id=str(message.id),
        messages=context.messages,
        max_tokens=max_tokens,
        params=params or {},
        enqueued_ms=queue.now_ms(),
        prompt_tokens=prompt_tokens,
        user_id=user.pk,
        tools=tools,
        tool_choice=tool_choice,
        run_tools=run_tools and bool(tools),
    )

    def _enqueue() -> None:
        redis = queue.sync_redis()
        queue.append_event(
            redis,
            job.generation_id,
            "meta",
            {
                "generation_id": job.generation_id,
                "message_id": job.message_id,
                "model": pool.name,
                "status": "queued",
                "prompt_tokens_estimate": prompt_tokens,
            },
        )
        queue.enqueue(redis, job)

    transaction.on_commit(_enqueue)
    return generation


def generation_cancel(*, generation: Generation) -> Generation:
    """Stop a generation now: out of the queue if it waits, else its worker request is closed.

    A generation already finished is left as it is.
    """
    if generation.is_final:
        return generation
    redis = queue.sync_redis()
    removed = queue.unqueue(
        redis, pool=generation.pool.name, tier=generation.tier, generation_id=str(generation.id)
    )
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


def generations_abandon(*, generations: list[Generation]) -> None:
    """Stop generations whose rows are gone (their conversation was deleted) and drop their
    streams: out of the queue, or their worker request closed by the scheduler."""
    redis = queue.sync_redis()
    for generation in generations:
        gid = str(generation.id)
        queue.unqueue(redis, pool=generation.pool.name, tier=generation.tier, generation_id=gid)
        queue.request_cancel(redis, gid)
        # Tabs still watching learn that it ended; the stream then goes soon.
        queue.append_event(
            redis, gid, "done", {"status": "cancelled", "finish_reason": "conversation_deleted"}
        )
        redis.expire(queue.stream_key(gid), 60)


# The finish reason of an answer that output moderation withdrew (OpenAI's name for it).
CONTENT_FILTER = "content_filter"

_MESSAGE_STATUS = {
    Generation.Status.COMPLETE: Message.Status.COMPLETE,
    Generation.Status.CANCELLED: Message.Status.CANCELLED,
    Generation.Status.FAILED: Message.Status.FAILED,
    Generation.Status.REJECTED: Message.Status.FAILED,
}


def _unfinished_locked(generation_id: Any) -> Generation | None:
    """The generation, row-locked until the transaction ends, if it is not final yet."""
    return (
        Generation.objects.select_for_update(of=("self",))
        .select_related("pool")
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
) -> bool:
    """Write the final state once, then close the stream; False if it was already final."""
    now = timezone.now()
    with transaction.atomic():
        generation = _unfinished_locked(generation_id)
        if generation is None:
            if not Generation.objects.filter(pk=generation_id).exists():
                # Its conversation was deleted meanwhile: leave nothing behind in Redis.
                redis = queue.sync_redis()
                redis.delete(queue.stream_key(generation_id), queue.job_key(generation_id))
            return False
        if output_tokens is None and text:
            # The worker never reported usage (cancelled, failed): count what it produced.
            tokenizer = load_tokenizer(pool_tokenizer_folder(generation.pool))
            output_tokens = count_tokens(tokenizer, text)
        generation.status = status
        generation.finished_at = now
        generation.finish_reason = finish_reason
        generation.prompt_tokens = prompt_tokens
        generation.output_tokens = output_tokens
        generation.cached_tokens = cached_tokens
        generation.error_code = error_code
        generation.error_message = error_message[:2000]
        generation.save(
            update_fields=[
                "status",
                "finished_at",
                "finish_reason",
                "prompt_tokens",
                "output_tokens",
                "cached_tokens",
                "error_code",
                "error_message",
            ]
        )
        # Moderation withdrew it: the text stays for staff, the message is `blocked`.
        message_status = (
            Message.Status.BLOCKED
            if finish_reason == CONTENT_FILTER
            else _MESSAGE_STATUS[Generation.Status(status)]
        )
        Message.objects.filter(pk=generation.message_id).update(
            content=text,
            status=message_status,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            content_tokens=None,
            updated_at=now,
        )
        # Issue 9: the first completed exchange gets its conversation a title, after commit.
        title_request_after_answer(
            conversation_id=generation.conversation_id, status=message_status
        )
        if message_status == Message.Status.COMPLETE:
            # Conversation search (plugins): the answer and the question it answered.
            search_index_schedule(message_id=generation.message_id)
            question = _question_of(generation.message_id)
            if question is not None:
                search_index_schedule(message_id=question)

    # Billing (issue 5): the usage event, and the reservation settled with the real usage.
    generation_settle(generation=generation)
    redis = queue.sync_redis()
    gid = str(generation_id)
    if status in (Generation.Status.FAILED, Generation.Status.REJECTED):
        queue.append_event(redis, gid, "error", {"code": error_code, "message": error_message})
    queue.append_event(
        redis,
        gid,
        "done",
        {
            "status": status,
            "finish_reason": finish_reason,
            "prompt_tokens": prompt_tokens,
            "output_tokens": output_tokens,
        },
    )
    queue.expire_stream(redis, gid)
    redis.delete(queue.job_key(gid))
    return True


def generation_add_tool_round(
    *,
    generation_id: Any,
    text: str,
    tool_calls: list[dict[str, Any]],
    results: list[dict[str, Any]],
) -> bool:
    """Write one round of the tool loop onto the generation's branch; False if it ended.

    The round is the assistant message that made the calls (`text` is what it said before
    them; `metadata["tool_calls"]` the calls in OpenAI's format) and one `tool` message per
    result (`results`: `tool_call_id`, `name`, `content`, `ok`), chained between the user
    message and the answer's placeholder. The placeholder is re-parented under the last
    result, so it stays the leaf and keeps its generation; the `current_child` pointers that
    led to it lead to it again, so later context assembly walks the round in order.
    """
    conversation_id = (
        Generation.objects.filter(pk=generation_id)
        .values_list("conversation_id", flat=True)
        .first()
    )
    if conversation_id is None:
        return False
    with transaction.atomic():
        # Tree writers lock the conversation first; so do we, before the generation.
        conversation = (
            Conversation.objects.select_for_update()
            .filter(pk=conversation_id, deleted_at__isnull=True)
            .first()
        )
        generation = _unfinished_locked(generation_id)
        if conversation is None or generation is None:
            return False
        placeholder = Message.objects.select_related("parent").get(pk=generation.message_id)
        parent = placeholder.parent
        if parent is None:
            raise ValueError("an answer's placeholder always has a parent")
        tokenizer = load_tokenizer(pool_tokenizer_folder(generation.pool))
        caller = Message.objects.create(
            conversation=conversation,
            parent=parent,
            role=Message.Role.ASSISTANT,
            content=text,
            status=Message.Status.COMPLETE,
            model=placeholder.model,
            metadata={"tool_calls": tool_calls},
            # The calls are part of what the model reads back: count them with the text.
            content_tokens=count_tokens(tokenizer, text + json.dumps(tool_calls)),
        )
        chain = [caller]
        for result in results:
            chain.append(
                Message.objects.create(
                    conversation=conversation,
                    parent=chain[-1],
                    role=Message.Role.TOOL,
                    content=result["content"],
                    status=Message.Status.COMPLETE,
                    metadata={
                        "tool_call_id": result["tool_call_id"],
                        "name": result["name"],
                        "ok": result["ok"],
                    },
                )
            )
        for node, child in zip(chain, [*chain[1:], placeholder], strict=True):
            node.current_child = child
        Message.objects.bulk_update(chain, ["current_child"])
        placeholder.parent = chain[-1]
        placeholder.save(update_fields=["parent", "updated_at"])
        if parent.current_child_id == placeholder.pk:
            parent.current_child = caller
            parent.save(update_fields=["current_child", "updated_at"])
    return True


def generation_record_tool_calls(*, generation_id: Any, tool_calls: list[dict[str, Any]]) -> None:
    """Keep the calls an answer ended with, for a client that runs its own tools (`/v1`)."""
    with transaction.atomic():
        message = (
            Message.objects.select_for_update()
            .filter(generation__pk=generation_id)
            .only("metadata")
            .first()
        )
        if message is not None:
            message.metadata = {**message.metadata, "tool_calls": tool_calls}
            message.save(update_fields=["metadata", "updated_at"])


def _question_of(message_id: Any) -> Any | None:
    """The user message an answer replies to (above any tool rounds between them)."""
    parent_id = Message.objects.filter(pk=message_id).values_list("parent_id", flat=True).first()
    while parent_id is not None:
        role, next_parent = Message.objects.filter(pk=parent_id).values_list("role", "parent_id")[0]
        if role == Message.Role.USER:
            return parent_id
        parent_id = next_parent
    return None


def generation_mark_running(*, generation_id: Any, worker_id: int, attempt: int) -> None:
    """Record the admission of a generation to a worker."""
    Generation.objects.filter(pk=generation_id).update(
        status=Generation.Status.RUNNING,
        worker_id=worker_id,
        attempts=attempt,
        admitted_at=timezone.now(),
    )


def generation_mark_first_token(*, generation_id: Any) -> None:
    """Record the first token: the message is now visibly streaming."""
    now = timezone.now()
    Generation.objects.filter(pk=generation_id, first_token_at__isnull=True).update(
        first_token_at=now
    )
    message_id = Generation.objects.filter(pk=generation_id).values_list("message_id", flat=True)
    Message.objects.filter(pk__in=message_id, status=Message.Status.QUEUED).update(
        status=Message.Status.STREAMING, updated_at=now
    )


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
    return bool(changed)


def workers_sync_from_settings() -> list[Worker]:
    """Register the workers named in `settings.INFERENCE_WORKERS` (pool=url entries)."""
    workers = []
    for index, entry in enumerate(settings.INFERENCE_WORKERS):
        pool_name, sep, url = entry.partition("=")
        if not sep or not url.startswith(("http://", "https://")):
            raise ServiceError(
                ErrorCode.BAD_WORKER_SETTING,
                f"INFERENCE_WORKERS entry {entry!r} is not pool=http(s)://host:port",
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
    redis = queue.sync_redis()
    prefix = queue.key("replica", "")
    return {str(name)[len(prefix) :] for name in redis.scan_iter(match=prefix + "*")}


def generation_sweep_stale(*, live_replicas: set[str], grace_seconds: int = 60) -> int:
    """Fail generations no scheduler is serving any more; returns how many were failed.

    A generation is stale when it is not final, its job is gone or is owned by a replica that
    no longer beats, and it is older than `grace_seconds` (a job between commit and enqueue
    is not stale).
    """
    redis = queue.sync_redis()
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
                in_queue = redis.zscore(queue.queue_key(generation.pool.name, generation.tier), gid)
                if in_queue is not None:
                    continue
            elif owner in live_replicas:
                continue
        partial = _stream_text(redis, gid)
        if generation_finish(
            generation_id=generation.id,
            status=Generation.Status.FAILED,
            text=partial,
            finish_reason="error",
            error_code=ErrorCode.SCHEDULER_LOST,
            error_message="The service lost this answer; please regenerate it.",
        ):
            logger.warning("swept stale generation %s", gid)
            failed += 1
    return failed


def _stream_text(redis: Any, generation_id: str) -> str:
    """The text a stream carried since its last restart."""
    text = ""
    for _, fields in redis.xrange(queue.stream_key(generation_id)):
        if fields.get("event") == "delta":
            text += json.loads(fields["data"]).get("text", "")
        elif fields.get("event") in ("restart", "tool_start"):
            # Text before a tool round is stored with the round, not in the answer.
            text = ""
    return text


def workers_drain(*, workers: QuerySet[Worker]) -> int:
    """Stop sending new generations to `workers`; those running finish."""
    return workers.exclude(state=Worker.State.DRAINING).update(
        state=Worker.State.DRAINING, state_changed_at=timezone.now()
    )


def workers_undrain(*, workers: QuerySet[Worker]) -> int:
    """Return drained workers to service; the health loop marks them healthy when they answer."""
    return workers.filter(state=Worker.State.DRAINING).update(
        state=Worker.State.DOWN, state_changed_at=timezone.now()
    )
