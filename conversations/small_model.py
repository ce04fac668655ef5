"""Short internal completions (titles, summaries), asked of a pool's workers directly.

Why not through the scheduler: a `Generation` is an assistant message of the tree, charged to
the user's plan and streamed to their tabs; a title or a summary is none of these. Queued as
generations they would need a message that is not in the tree, a reservation nobody pays
for, and a stream nobody reads. So a Celery task calls a worker itself, and stays fair by:

- vLLM priority `settings.BACKGROUND_LLM_PRIORITY`, below every tier's, so the worker's own
  scheduler runs users' answers first whenever both wait for the same batch;
- small, bounded work: a title is once per conversation and a few tokens; a summary is a few
  hundred tokens once per many turns (`settings.SUMMARY_TAIL_PERCENT`);
- the worker the scheduler's placement policy prefers (by default the one that holds the
  conversation's prefix when it is not much busier than the least loaded one), by the loads
  the scheduler last stored; a worker being drained or down is never asked;
- a hard timeout (`settings.BACKGROUND_LLM_TIMEOUT_SECONDS`); a fault raises `WorkerFault`
  and the task retries with backoff.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from django.conf import settings

from inference.client import FaultCode, WorkerFault, get_client
from inference.models import ModelPool, Worker
from inference.scheduler.capacity import background_order

from .auto_model import is_auto

logger = logging.getLogger(__name__)

# Try at most this many workers of the pool before giving the fault to Celery's retry.
MAX_WORKERS_TRIED = 2


def pool_for_background(*, setting: str, conversation_model: str) -> ModelPool:
    """The pool named by `setting` (TITLE_MODEL, SUMMARY_MODEL) or else the conversation's."""
    name = getattr(settings, setting) or conversation_model
    if is_auto(name):
        name = settings.AUTO_MODEL_SMALL  # chores of an `auto` conversation: the small pool
    pool = ModelPool.objects.filter(name=name, is_active=True).first()
    if pool is None:
        raise WorkerFault(FaultCode.NO_POOL, f"no active pool named {name!r}")
    return pool


def _workers_by_preference(pool: ModelPool, conversation_id: Any) -> list[Worker]:
    workers = {w.pk: w for w in Worker.objects.filter(pool=pool, state=Worker.State.HEALTHY)}
    order = background_order(
        pool=pool.name, worker_ids=sorted(workers), conversation_id=conversation_id
    )
    return [workers[worker_id] for worker_id in order]


async def _ask(worker: Worker, pool: ModelPool, messages: list[dict[str, Any]], **kw: Any) -> str:
    client = get_client()
    text = ""
    try:
        async with asyncio.timeout(settings.BACKGROUND_LLM_TIMEOUT_SECONDS):
            async for chunk in client.stream_chat(
                base_url=worker.url,
                model=pool.served_model,
                messages=messages,
                priority=settings.BACKGROUND_LLM_PRIORITY,
                request_id=f"bg-{uuid.uuid4()}",
                **kw,
            ):
                text += chunk.text
    except TimeoutError as exc:
        raise WorkerFault(FaultCode.WORKER_STALLED, "the background completion timed out") from exc
    finally:
        await client.aclose()
    return text


def complete(
    *,
    pool: ModelPool,
    messages: list[dict[str, Any]],
    max_tokens: int,
    conversation_id: Any = None,
) -> str:
    """The text a worker of `pool` answers to `messages` (at most `max_tokens`)."""
    workers = _workers_by_preference(pool, conversation_id)
    if not workers:
        raise WorkerFault(FaultCode.NO_WORKER, f"pool {pool.name!r} has no healthy worker")
    tried = workers[:MAX_WORKERS_TRIED]
    for worker in tried[:-1]:
        try:
            return _run(worker, pool, messages, max_tokens)
        except WorkerFault as exc:
            logger.warning("background completion on %s failed: %s", worker.name, exc.message)
    return _run(tried[-1], pool, messages, max_tokens)


def _run(worker: Worker, pool: ModelPool, messages: list[dict[str, Any]], max_tokens: int) -> str:
    return asyncio.run(
        _ask(worker, pool, messages, max_tokens=max_tokens, params={"temperature": 0.2})
    )
