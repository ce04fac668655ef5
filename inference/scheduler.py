"""The scheduler: admits queued generations to workers and streams their answers to Redis.

One asyncio process (`python manage.py run_scheduler`); any number of replicas share the
queues. A replica claims a generation with an atomic pop (so none is served twice), places it
on a worker with room, preferring the worker that served the conversation's last turn (its KV
cache holds the prefix), streams the answer from vLLM, coalesces tokens into ~50 ms events on
the generation's Redis Stream, and writes the final text to Postgres once.

Loops, each a task:
- health:      polls every worker's /health and /metrics; marks workers up and down
- dispatch:    claims and places generations while some worker has room
- listen:      pub/sub for new work and for cancels of running generations
- housekeeping: heartbeat, lease renewal, queue time limit, queue positions, stale sweep
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections, connections

from moderation import output as moderation_output
from moderation.output import ContentBlocked, OutputWindow, output_window
from moderation.services import output_flag_record
from plugins.registry import ToolResult
from plugins.services import tool_run

from . import queue, services
from .client import (
    OpenAICompatibleClient,
    ToolCall,
    ToolCallAssembler,
    ToolsUnsupported,
    WorkerFault,
    WorkerLoad,
    get_client,
)
from .errors import ErrorCode
from .models import Generation, ModelPool, Worker

logger = logging.getLogger(__name__)

SWEEP_EVERY_SECONDS = 15
# Postgres may refuse us for a moment (restart, connection limit): keep the final text.
FINISH_RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0, 8.0)
REPLICA_TTL_SECONDS = 10
# The plugin layer stops a tool at its own time limit; this outer guard only catches a plugin
# layer that itself hangs (a database that does not answer).
TOOL_GUARD_SECONDS = 5.0
# A tool result shown in a `tool_result` event is cut here; the model gets all of it.
TOOL_RESULT_DISPLAY_CHARS = 2000

# Take a lease on a worker only while it has room; expired leases (a dead replica's) are
# dropped first, so capacity heals by itself.
ACQUIRE_LEASE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4])
return 1
"""


@dataclass
class WorkerView:
    """What a replica knows of a worker: its row, and its load as last measured."""

    id: int
    name: str
    pool: str
    url: str
    served_model: str
    state: str
    max_concurrency: int
    load: WorkerLoad | None = None
    leases: int = 0

    @property
    def busy(self) -> float:
        waiting = self.load.waiting if self.load else 0.0
        return self.leases + waiting

    def has_room(self) -> bool:
        if self.state != Worker.State.HEALTHY or self.leases >= self.max_concurrency:
            return False
        if self.load is None:
            return True
        return (
            self.load.waiting <= settings.SCHEDULER_MAX_WAITING_PER_WORKER
            and self.load.kv_cache_percent < settings.SCHEDULER_KV_CACHE_HIGH_PERCENT
        )


@dataclass
class Run:
    """One generation being served by this replica."""

    job: queue.Job
    worker: WorkerView
    attempt: int = 1
    text: str = ""
    pending: str = ""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    first_token_seen: bool = False
    finished: bool = False
    tried: set[int] = field(default_factory=set)
    # The tool loop (`_tool_round`): the conversation with the rounds done so far, the calls
    # being streamed, and the usage of the rounds done (`usage` includes it).
    messages: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: ToolCallAssembler = field(default_factory=ToolCallAssembler)
    # Output moderation: the rolling window's state and, once a check trips, its verdict.
    moderation: OutputWindow | None = field(default_factory=output_window)
    tool_rounds: int = 0
    spent: dict[str, Any] = field(default_factory=dict)
    announced_attempt: int = 0


class Scheduler:
    """A scheduler replica. `await run()` until `stop()`."""

    def __init__(
        self,
        *,
        replica_id: str | None = None,
        client: OpenAICompatibleClient | None = None,
        health_interval: float | None = None,
    ) -> None:
        self.replica_id = (
            replica_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        )
        self.client = client or get_client()
        self.redis = queue.async_redis()
        self.health_interval = (
            health_interval
            if health_interval is not None
            else settings.SCHEDULER_HEALTH_INTERVAL_MS / 1000
        )
        self.workers: dict[int, WorkerView] = {}
        self.pools: list[str] = []
        self.running: dict[str, asyncio.Task[None]] = {}
        self.leases: dict[str, int] = {}
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._background: set[asyncio.Task[Any]] = set()
        self._last_sweep = 0.0
        # Workers that refused tools (started without a tool-call parser): answer without.
        self.no_tool_workers: set[int] = set()
        # Tool calls block a thread each; their own pool keeps them from starving the rest.
        self._tool_threads = ThreadPoolExecutor(
            max_workers=settings.PLUGINS_MAX_RUNNING, thread_name_prefix="tool-loop"
        )

    # Lifecycle

    async def run(self) -> None:
        await sync_to_async(services.workers_sync_from_settings)()
        await self.heartbeat()
        await self.check_workers()
        loops = [
            asyncio.create_task(
                self._loop(self.check_workers, self.health_interval), name="health"
            ),
            asyncio.create_task(self.dispatch_loop(), name="dispatch"),
            asyncio.create_task(self.listen_loop(), name="listen"),
            asyncio.create_task(self._loop(self.housekeeping, 1.0), name="housekeeping"),
        ]
        logger.info("scheduler %s started with %d worker(s)", self.replica_id, len(self.workers))
        try:
            await self._stopping.wait()
        finally:
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            await self._drain()
            await self.redis.delete(queue.key("replica", self.replica_id))
            await self.redis.aclose()
            await self.client.aclose()
            self._tool_threads.shutdown(wait=False, cancel_futures=True)
            logger.info("scheduler %s stopped", self.replica_id)

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    async def _drain(self) -> None:
        """Let running answers finish for a while, then cancel what is left."""
        if self.running:
            _, pending = await asyncio.wait(list(self.running.values()), timeout=30)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def _loop(self, step: Any, interval: float) -> None:
        while not self._stopping.is_set():
            try:
                await step()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("scheduler loop %s failed; retrying", step.__name__)
            await asyncio.sleep(interval)

    # Workers

    async def check_workers(self) -> None:
        """Refresh the worker list from the database and measure each worker's load."""
        rows = await sync_to_async(_worker_rows)()
        views = {row.id: row for row in rows}
        for view in views.values():
            known = self.workers.get(view.id)
            if known is not None:
                view.load = known.load
        results = await asyncio.gather(
            *(self.client.health(view.url) for view in views.values()), return_exceptions=True
        )
        became_healthy = False
        for view, result in zip(views.values(), results, strict=True):
            if isinstance(result, WorkerLoad):
                view.load = result
                await self.redis.hset(
                    queue.metrics_key(view.id),
                    mapping={
                        "running": result.running,
                        "waiting": result.waiting,
                        "kv_cache_percent": result.kv_cache_percent,
                        "prefix_cache_queries": result.prefix_cache_queries,
                        "prefix_cache_hits": result.prefix_cache_hits,
                        "measured_ms": queue.now_ms(),
                    },
                )
                await self.redis.expire(queue.metrics_key(view.id), 30)
                if view.state == Worker.State.DOWN:
                    changed = await sync_to_async(services.worker_set_state)(
                        worker_id=view.id, state=Worker.State.HEALTHY
                    )
                    view.state = Worker.State.HEALTHY
                    became_healthy = became_healthy or changed
                    logger.info("worker %s is up", view.name)
            else:
                view.load = None
                if view.state == Worker.State.HEALTHY:
                    await self._mark_down(view, str(result))
        self.workers = views
        self.pools = sorted({view.pool for view in views.values()})
        if became_healthy:
            self._wake.set()

    async def _mark_down(self, view: WorkerView, error: str) -> None:
        view.state = Worker.State.DOWN
        known = self.workers.get(view.id)
        if known is not None:
            known.state = Worker.State.DOWN
        await sync_to_async(services.worker_set_state)(
            worker_id=view.id, state=Worker.State.DOWN, error=error
        )
        logger.warning("worker %s is down: %s", view.name, error)

    async def _count_leases(self, views: list[WorkerView]) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            now = queue.now_ms()
            for view in views:
                pipe.zcount(queue.lease_key(view.id), now, "+inf")
            counts = await pipe.execute()
        for view, count in zip(views, counts, strict=True):
            view.leases = int(count)

    async def candidates(self, pool: str, *, exclude: set[int] | None = None) -> list[WorkerView]:
        """The pool's healthy workers that can take one more generation now."""
        views = [
            v
            for v in self.workers.values()
            if v.pool == pool and v.state == Worker.State.HEALTHY and v.id not in (exclude or ())
        ]
        if not views:
            return []
        await self._count_leases(views)
        return [v for v in views if v.has_room()]

    async def place(self, job: queue.Job, candidates: list[WorkerView]) -> list[WorkerView]:
        """Candidates in order of preference: the conversation's worker first if it is not
        loaded well beyond the least-loaded one, then by load."""
        by_load = sorted(candidates, key=lambda v: (v.busy, v.id))
        policy = settings.SCHEDULER_PLACEMENT
        if policy == "round_robin":
            turn = await self.redis.incr(queue.key("rr", job.pool))
            ring = sorted(candidates, key=lambda v: v.id)
            start = turn % len(ring)
            return ring[start:] + ring[:start]
        if policy == "least_loaded":
            return by_load
        sticky_id = await self.redis.get(queue.affinity_key(job.conversation_id))
        if sticky_id is not None:
            sticky = next((v for v in by_load if str(v.id) == sticky_id), None)
            if (
                sticky is not None
                and sticky.busy <= by_load[0].busy + settings.SCHEDULER_AFFINITY_SLACK
            ):
                return [sticky, *(v for v in by_load if v is not sticky)]
        return by_load

    async def acquire_lease(self, view: WorkerView, generation_id: str) -> bool:
        now = queue.now_ms()
        ok = await self.redis.eval(
            ACQUIRE_LEASE,
            1,
            queue.lease_key(view.id),
            str(now),
            str(view.max_concurrency),
            str(now + queue.LEASE_SECONDS * 1000),
            generation_id,
        )
        if ok:
            self.leases[generation_id] = view.id
            view.leases += 1
        return bool(ok)

    async def release_lease(self, generation_id: str) -> None:
        worker_id = self.leases.pop(generation_id, None)
        if worker_id is not None:
            await self.redis.zrem(queue.lease_key(worker_id), generation_id)

    # Dispatch

    async def dispatch_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                dispatched = await self.dispatch_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("dispatch failed; retrying")
                dispatched = False
            if not dispatched:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=0.25)

    async def dispatch_once(self) -> bool:
        """Admit at most one generation per pool; True if any was admitted."""
        dispatched = False
        for pool in self.pools:
            candidates = await self.candidates(pool)
            if not candidates:
                continue
            claimed = await self.redis.eval(
                queue.CLAIM,
                len(queue.tiers_best_first()),
                *(queue.queue_key(pool, tier) for tier in queue.tiers_best_first()),
                queue.job_key(""),
                self.replica_id,
                str(queue.now_ms()),
            )
            if not claimed:
                continue
            generation_id, queue_name = claimed
            fields = await self.redis.hgetall(queue.job_key(generation_id))
            job = queue.Job.from_fields({str(k): str(v) for k, v in fields.items()})
            for view in await self.place(job, candidates):
                if await self.acquire_lease(view, generation_id):
                    run = Run(job=job, worker=view, tried={view.id})
                    task = asyncio.create_task(self.serve(run), name=f"gen-{generation_id}")
                    self.running[generation_id] = task
                    dispatched = True
                    break
            else:
                # Every candidate filled up meanwhile (another replica): back in line, same place.
                await self.redis.zadd(queue_name, {generation_id: job.enqueued_ms})
                await self.redis.hdel(queue.job_key(generation_id), "owner")
        return dispatched

    # Serving one generation

    async def serve(self, run: Run) -> None:
        gid = run.job.generation_id
        try:
            if await self.redis.hget(queue.job_key(gid), "cancel"):
                await self._finish(run, Generation.Status.CANCELLED, "cancelled")
                return
            while True:
                try:
                    await self._attempt(run)
                except WorkerFault as fault:
                    if isinstance(fault, ToolsUnsupported) and run.job.run_tools:
                        # Offering our plugins is optional: answer on this worker without.
                        logger.warning("worker %s serves without tools", run.worker.name)
                        self.no_tool_workers.add(run.worker.id)
                        continue
                    if not await self._retry_elsewhere(run, fault):
                        await self._finish(
                            run,
                            Generation.Status.FAILED,
                            "error",
                            error_code=fault.code,
                            error_message=f"The model worker failed: {fault.message}",
                        )
                        return
                else:
                    # A forced call ends with `stop`, one the model chose with `tool_calls`;
                    # a call cut off by `length` is not run.
                    calls = run.tool_calls.calls() if run.finish_reason != "length" else []
                    if calls and run.job.run_tools:
                        if await self._tool_round(run, calls):
                            continue
                        run.finished = True  # finished elsewhere meanwhile (deleted, swept)
                        return
                    if calls:
                        await self._hand_calls_to_client(run, calls)
                        run.finish_reason = "tool_calls"
                    await self._finish(run, Generation.Status.COMPLETE, run.finish_reason or "stop")
                    return
        except ContentBlocked:
            # `_finish` withdraws the text (retract) and ends it as `content_filter`.
            await self._finish(run, Generation.Status.COMPLETE, moderation_output.CONTENT_FILTER)
        except asyncio.CancelledError:
            await asyncio.shield(self._finish(run, Generation.Status.CANCELLED, "cancelled"))
            raise
        except Exception as exc:
            logger.exception("generation %s failed", gid)
            await self._finish(
                run,
                Generation.Status.FAILED,
                "error",
                error_code=ErrorCode.GENERATION_FAILED,
                error_message=f"The service failed while answering: {type(exc).__name__}",
            )
        finally:
            if not run.finished:
                # Disown it, so the sweeper fails it with the text its stream carried.
                logger.error("generation %s left unfinished; handing it to the sweeper", gid)
                with contextlib.suppress(Exception):
                    await self.redis.hdel(queue.job_key(gid), "owner")
            await self.release_lease(gid)
            self.running.pop(gid, None)
            self._wake.set()

    async def _attempt(self, run: Run) -> None:
        job, view = run.job, run.worker
        if run.announced_attempt != run.attempt:
            # Once per worker: a tool round continues on the same one without a new `meta`.
            run.announced_attempt = run.attempt
            await sync_to_async(services.generation_mark_running)(
                generation_id=job.generation_id, worker_id=view.id, attempt=run.attempt
            )
            await self.redis.set(
                queue.affinity_key(job.conversation_id),
                view.id,
                ex=settings.SCHEDULER_AFFINITY_TTL_SECONDS,
            )
            await self._event(
                job.generation_id,
                "meta",
                {"status": "running", "worker": view.name, "attempt": run.attempt},
            )
        if not run.messages:
            run.messages = list(job.messages)
        # A forced call is the first round's; the rounds after it let the model choose.
        tool_choice = job.tool_choice if not run.tool_rounds else None
        if job.run_tools and run.tool_rounds >= settings.TOOL_LOOP_MAX_ROUNDS:
            tool_choice = "none"  # past the cap the model must answer with what it has
        round_suffix = f"r{run.tool_rounds}" if run.tool_rounds else ""
        stream = self.client.stream_chat(
            base_url=view.url,
            model=view.served_model,
            messages=run.messages,
            # The answer's output budget covers every round.
            max_tokens=max(1, job.max_tokens - int(run.spent.get("completion_tokens") or 0)),
            priority=job.priority,
            params=job.params,
            request_id=f"{job.generation_id}-{run.attempt}{round_suffix}",
            # Only our plugins are optional: a `/v1` client's tools are never dropped.
            tools=None if job.run_tools and view.id in self.no_tool_workers else job.tools,
            tool_choice=tool_choice,
        )
        loop = asyncio.get_running_loop()
        coalesce = settings.SCHEDULER_COALESCE_MS / 1000
        last_flush = 0.0
        flusher: asyncio.Task[None] | None = None
        try:
            async for chunk in stream:
                if chunk.usage:
                    run.usage = _add_usage(run.spent, chunk.usage)
                if chunk.finish_reason:
                    run.finish_reason = chunk.finish_reason
                if chunk.tool_calls:
                    run.tool_calls.add(chunk.tool_calls)
                if not chunk.text:
                    continue
                run.text += chunk.text
                run.pending += chunk.text
                if not run.first_token_seen:
                    run.first_token_seen = True
                    await self.redis.eval(
                        queue.HSET_IF_EXISTS,
                        1,
                        queue.job_key(job.generation_id),
                        "first_token_ms",
                        queue.now_ms(),
                    )
                    self._spawn(
                        sync_to_async(services.generation_mark_first_token)(
                            generation_id=job.generation_id
                        )
                    )
                now = loop.time()
                if now - last_flush >= coalesce:
                    if flusher is not None:
                        flusher.cancel()
                        flusher = None
                    await self._flush(run)
                    last_flush = now
                elif flusher is None or flusher.done():
                    flusher = asyncio.create_task(
                        self._flush_later(run, coalesce - (now - last_flush))
                    )
        finally:
            if flusher is not None:
                flusher.cancel()
            await stream.aclose()  # type: ignore[attr-defined]
        await self._flush(run)

    async def _tool_round(self, run: Run, calls: list[ToolCall]) -> bool:
        """Run the calls the model paused on, write the round to the branch and extend the
        conversation, so the next `_attempt` continues from the results on the same worker.

        Every call gets a result: a failing, hanging or missing tool gives the model an error
        text instead, and the answer goes on. False if the generation ended meanwhile.
        """
        gid = run.job.generation_id
        await self._flush(run)
        results = []
        for call in calls:
            await self._event(
                gid, "tool_start", {"id": call.id, "name": call.name, "arguments": call.arguments}
            )
            result = await self._run_tool(run, call)
            if result.ok:
                shown = result.content[:TOOL_RESULT_DISPLAY_CHARS]
                await self._event(
                    gid,
                    "tool_result",
                    {
                        "id": call.id,
                        "name": call.name,
                        "content": shown,
                        "truncated": len(shown) < len(result.content),
                        "ok": True,
                    },
                )
            else:
                await self._event(
                    gid,
                    "tool_error",
                    {
                        "id": call.id,
                        "name": call.name,
                        "code": result.error_code,
                        "message": result.error_message,
                    },
                )
            results.append(
                {
                    "tool_call_id": call.id,
                    "name": call.name,
                    "content": result.content,
                    "ok": result.ok,
                }
            )
        # The worker parses the arguments it is sent back: keep them valid JSON.
        sent_calls = [
            ToolCall(id=c.id, name=c.name, arguments=_json_arguments(c.arguments)).to_openai()
            for c in calls
        ]
        written = await sync_to_async(services.generation_add_tool_round)(
            generation_id=gid, text=run.text, tool_calls=sent_calls, results=results
        )
        if not written:
            return False
        run.messages = [
            *run.messages,
            {"role": "assistant", "content": run.text, "tool_calls": sent_calls},
            *(
                {"role": "tool", "tool_call_id": r["tool_call_id"], "content": r["content"]}
                for r in results
            ),
        ]
        run.tool_rounds += 1
        run.spent = dict(run.usage or run.spent)
        run.text = ""
        run.finish_reason = None
        run.tool_calls = ToolCallAssembler()
        return True

    async def _run_tool(self, run: Run, call: ToolCall) -> ToolResult:
        """One call through the plugin layer, in a thread, with the caller's permissions."""
        loop = asyncio.get_running_loop()
        guard = settings.PLUGINS_TOOL_TIMEOUT_SECONDS + TOOL_GUARD_SECONDS
        try:
            return await asyncio.wait_for(
                loop.run_in_executor(
                    self._tool_threads,
                    partial(
                        _call_tool,
                        user_id=run.job.user_id,
                        conversation_id=run.job.conversation_id,
                        name=call.name,
                        arguments=call.arguments,
                    ),
                ),
                timeout=guard,
            )
        except TimeoutError:
            logger.error("tool %s: the plugin layer did not answer in %s s", call.name, guard)
            message = f"The tool did not answer within {guard:g} seconds."
            return ToolResult(
                ok=False,
                content=f"Tool error (timeout): {message}",
                error_code="timeout",
                error_message=message,
            )

    async def _hand_calls_to_client(self, run: Run, calls: list[ToolCall]) -> None:
        """End at the model's calls: the client (`/v1`) runs its own tools."""
        tool_calls = [call.to_openai() for call in calls]
        await sync_to_async(services.generation_record_tool_calls)(
            generation_id=run.job.generation_id, tool_calls=tool_calls
        )
        await self._event(run.job.generation_id, "tool_calls", {"tool_calls": tool_calls})

    async def _flush_later(self, run: Run, delay: float) -> None:
        await asyncio.sleep(delay)
        # A trip found here stops the answer at the streaming loop's next flush.
        with contextlib.suppress(ContentBlocked):
            await self._flush(run)

    async def _flush(self, run: Run) -> None:
        """Send the pending text, then check the output's newest window; ContentBlocked
        once a check has tripped (nothing more goes out)."""
        if run.moderation is not None and run.moderation.blocked is not None:
            raise ContentBlocked
        if run.pending:
            text, run.pending = run.pending, ""
            await self._event(run.job.generation_id, "delta", {"text": text})
        if await self._moderate(run):
            raise ContentBlocked

    async def _moderate(self, run: Run, *, final: bool = False) -> bool:
        """Check the newest window of the answer (at the end, `final`: all of it) off the
        event loop; True if the answer must be withdrawn."""
        window = run.moderation
        if window is None:
            return False
        if window.blocked is not None:
            return True
        text = run.text
        excerpt = ("" if window.covered(text) else text) if final else (window.due(text) or "")
        if not excerpt.strip():
            return False
        verdict = await moderation_output.check(excerpt)
        return window.record(verdict, excerpt, end=len(text))

    async def _retry_elsewhere(self, run: Run, fault: WorkerFault) -> bool:
        """Restart once on another worker after a fault; False if that is not possible."""
        gid = run.job.generation_id
        logger.warning("generation %s: worker %s failed: %s", gid, run.worker.name, fault.message)
        await self.release_lease(gid)
        if fault.code == "worker_unreachable":
            await self._mark_down(run.worker, fault.message)
        if run.attempt >= settings.GENERATION_MAX_ATTEMPTS:
            return False
        for view in await self.place(
            run.job, await self.candidates(run.job.pool, exclude=run.tried)
        ):
            if await self.acquire_lease(view, gid):
                run.worker = view
                run.tried.add(view.id)
                run.attempt += 1
                run.text = run.pending = ""
                run.usage = run.finish_reason = None
                run.tool_calls = ToolCallAssembler()
                await self._event(gid, "restart", {"reason": fault.code, "attempt": run.attempt})
                return True
        return False

    async def _finish(
        self,
        run: Run,
        status: str,
        finish_reason: str,
        error_code: str = "",
        error_message: str = "",
    ) -> None:
        window = run.moderation
        if window is not None and window.blocked is None:
            with contextlib.suppress(ContentBlocked):
                await self._flush(run)
            if run.text:
                await self._moderate(run, final=True)
        if window is not None and window.blocked is not None:
            # Withdrawn: clients replace the text with a notice, the stream forgets it, and
            # the message keeps it for staff only (`blocked`). Charged as produced.
            status, finish_reason = Generation.Status.COMPLETE, moderation_output.CONTENT_FILTER
            error_code = error_message = ""
            await moderation_output.retract(self.redis, run.job.generation_id, window.blocked)
        elif window is None:
            await self._flush(run)
        usage = run.usage or {}
        if not usage and run.first_token_seen:
            # The worker read the whole prompt before its first token; charge our count of it.
            usage = {"prompt_tokens": run.job.prompt_tokens}
        details = usage.get("prompt_tokens_details") or {}
        for delay in FINISH_RETRY_DELAYS:
            try:
                await sync_to_async(services.generation_finish)(
                    generation_id=run.job.generation_id,
                    status=status,
                    text=run.text,
                    finish_reason=finish_reason,
                    prompt_tokens=usage.get("prompt_tokens"),
                    output_tokens=usage.get("completion_tokens"),
                    cached_tokens=details.get("cached_tokens"),
                    error_code=error_code,
                    error_message=error_message,
                )
            except Exception:
                logger.exception(
                    "could not record the end of generation %s; retrying in %s s",
                    run.job.generation_id,
                    delay,
                )
                await asyncio.sleep(delay)
                await sync_to_async(close_old_connections)()
            else:
                run.finished = True
                await self._flag_output(run)
                return

    async def _flag_output(self, run: Run) -> None:
        """Record the flag of a withdrawn answer, or of one a check asked staff to review."""
        window = run.moderation
        if window is None:
            return
        retracted = window.blocked is not None
        verdict = window.blocked or window.review
        if verdict is None:
            return
        try:
            await sync_to_async(output_flag_record)(
                generation_id=run.job.generation_id,
                excerpt=window.blocked_excerpt if retracted else window.review_excerpt,
                verdict=verdict,
                retracted=retracted,
            )
        except Exception:
            logger.exception("could not flag generation %s", run.job.generation_id)

    async def _event(self, generation_id: str, event: str, data: dict[str, Any]) -> None:
        await self.redis.xadd(
            queue.stream_key(generation_id), {"event": event, "data": json.dumps(data)}
        )

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # Messages from other processes

    async def listen_loop(self) -> None:
        """Pub/sub for new work and cancels; reconnects after a Redis failure. A cancel sent
        while no replica listened is still found by housekeeping (the job's cancel flag)."""
        while not self._stopping.is_set():
            try:
                await self._listen()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("listening for wake-ups and cancels failed; reconnecting")
                await asyncio.sleep(1.0)

    async def _listen(self) -> None:
        pubsub = self.redis.pubsub()
        await pubsub.subscribe(queue.wake_channel(), queue.cancel_channel())
        try:
            while not self._stopping.is_set():
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if message is None:
                    continue
                if message["channel"] == queue.wake_channel():
                    self._wake.set()
                elif message["channel"] == queue.cancel_channel():
                    task = self.running.get(message["data"])
                    if task is not None:
                        task.cancel()
        finally:
            await pubsub.aclose()

    # Housekeeping

    async def heartbeat(self) -> None:
        await self.redis.set(queue.key("replica", self.replica_id), "1", ex=REPLICA_TTL_SECONDS)

    async def housekeeping(self) -> None:
        await self.heartbeat()
        expiry = queue.now_ms() + queue.LEASE_SECONDS * 1000
        for generation_id, worker_id in list(self.leases.items()):
            await self.redis.zadd(queue.lease_key(worker_id), {generation_id: expiry}, xx=True)
        await self.cancel_abandoned()
        # One replica at a time does the pool-wide chores.
        if not await self.redis.set(queue.key("housekeeping"), self.replica_id, nx=True, px=900):
            return
        await self.reject_overdue()
        await self.publish_positions()
        loop = asyncio.get_running_loop()
        if loop.time() - self._last_sweep >= SWEEP_EVERY_SECONDS:
            self._last_sweep = loop.time()
            await self.sweep()

    async def cancel_abandoned(self) -> None:
        """Cancel running generations that were asked to stop (a cancel whose pub/sub message
        was missed) or whose watchers all left and stayed away past the grace period."""
        cutoff = queue.now_ms() - settings.STREAM_GRACE_SECONDS * 1000
        for generation_id, task in list(self.running.items()):
            flags = await self.redis.hmget(queue.job_key(generation_id), "cancel", "detached_ms")
            if flags[0]:
                task.cancel()
                continue
            detached = flags[1]
            if detached is None or int(detached) > cutoff:
                continue
            watchers = await self.redis.get(queue.key("watchers", generation_id))
            if int(watchers or 0) <= 0:
                logger.info("generation %s abandoned by its watchers; cancelling", generation_id)
                task.cancel()

    async def reject_overdue(self) -> None:
        deadline = queue.now_ms() - settings.SCHEDULER_MAX_QUEUE_SECONDS * 1000
        for pool in await self._queued_pools():
            for tier in queue.tiers_best_first():
                ids = await self.redis.eval(
                    queue.EXPIRE_QUEUED, 1, queue.queue_key(pool, tier), str(deadline)
                )
                for generation_id in ids:
                    await sync_to_async(services.generation_finish)(
                        generation_id=generation_id,
                        status=Generation.Status.REJECTED,
                        text="",
                        finish_reason="rejected",
                        error_code=ErrorCode.QUEUE_TIMEOUT,
                        error_message=(
                            "Demand is high and no model worker could take this answer in "
                            f"{settings.SCHEDULER_MAX_QUEUE_SECONDS} s. Please try again."
                        ),
                    )

    async def publish_positions(self) -> None:
        """Tell each waiting generation its place in line, when it changes."""
        for pool in await self._queued_pools():
            high_demand = not await self.candidates(pool)
            position = 0
            for tier in queue.tiers_best_first():
                members = await self.redis.zrange(queue.queue_key(pool, tier), 0, 499)
                for generation_id in map(str, members):
                    position += 1
                    job = queue.job_key(generation_id)
                    marker = f"{position}:{int(high_demand)}"
                    previous = await self.redis.hget(job, "position")
                    if previous != marker:
                        await self.redis.hset(job, "position", marker)
                        await self._event(
                            generation_id,
                            "queue",
                            {"position": position, "high_demand": high_demand},
                        )

    async def _queued_pools(self) -> list[str]:
        names = await sync_to_async(_active_pool_names)()
        return names

    async def sweep(self) -> None:
        await sync_to_async(close_old_connections)()
        replicas = await sync_to_async(services.live_scheduler_replicas)()
        swept = await sync_to_async(services.generation_sweep_stale)(live_replicas=replicas)
        if swept:
            logger.warning("swept %d stale generation(s)", swept)


def _add_usage(spent: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
    """`usage` of this round plus that of the tool rounds before it, for one bill."""
    if not spent:
        return usage
    total = dict(usage)
    for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
        total[name] = int(spent.get(name) or 0) + int(usage.get(name) or 0)
    cached = int((spent.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    cached += int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    total["prompt_tokens_details"] = {"cached_tokens": cached}
    return total


def _json_arguments(arguments: str) -> str:
    """The model's arguments if they are a JSON object, else that text wrapped in one."""
    try:
        if isinstance(json.loads(arguments), dict):
            return arguments
    except ValueError:
        pass
    return json.dumps({"unparsed_arguments": arguments})


def _call_tool(*, user_id: int, conversation_id: str, name: str, arguments: str) -> ToolResult:
    try:
        return tool_run(
            user_id=user_id, conversation_id=conversation_id, name=name, arguments=arguments
        )
    finally:
        # This pool's threads are reused: do not leave a connection open in one.
        connections.close_all()


def _worker_rows() -> list[WorkerView]:
    close_old_connections()
    return [
        WorkerView(
            id=w.id,
            name=w.name,
            pool=w.pool.name,
            url=w.url.rstrip("/"),
            served_model=w.pool.served_model,
            state=w.state,
            max_concurrency=w.max_concurrency,
        )
        for w in Worker.objects.filter(pool__is_active=True).select_related("pool")
    ]


def _active_pool_names() -> list[str]:
    return list(ModelPool.objects.filter(is_active=True).values_list("name", flat=True))
