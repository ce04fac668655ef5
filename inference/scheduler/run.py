"""One generation's run: its state, the attempt on a worker, the retry elsewhere, the finish.

`Runs.serve` drives a `Run` from admission to its final state: stream the answer from the
worker (coalesced onto the stream, checked by the output guard as it grows), run the tools
the model calls and continue on the same worker, restart once on another worker after a
fault, and write the final text to Postgres once, whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from dataclasses import dataclass, field, replace
from typing import Any, cast

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from chatsite import logs, tracing
from chatsite.redis import REDIS_FAULTS
from chatsite.stream_events import (
    DeltaData,
    MetaData,
    RelayData,
    RestartData,
    RetractData,
    StreamEvent,
)

from .. import hooks, metrics, queue, relay, services
from ..client import (
    FaultCode,
    OpenAICompatibleClient,
    ToolCall,
    ToolCallAssembler,
    ToolsUnsupported,
    WorkerFault,
    chat_body,
)
from ..errors import ErrorCode
from ..models import Generation
from ..sampling import request_sampling
from .capacity import Admitted, Capacity, Placement, WorkerView
from .guard import ContentBlocked, GuardWindow, OutputGuard
from .prefix import Prompt
from .tools import ToolLoop, sent_calls
from .writer import Coalescer, StreamWriter

logger = logging.getLogger(__name__)

# Postgres may refuse us for a moment (restart, connection limit), or Redis (a failover):
# keep the final text, for about as long as the writer holds events (a Redis outage).
FINISH_RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0)


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
    # The tool loop: the conversation with the rounds done so far, the calls being streamed,
    # and the usage of the rounds done (`usage` includes it).
    messages: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: ToolCallAssembler = field(default_factory=ToolCallAssembler)
    # Output moderation: the rolling window's state and, once a check trips, its verdict.
    moderation: GuardWindow | None = None
    tool_rounds: int = 0
    spent: dict[str, Any] = field(default_factory=dict)
    announced_attempt: int = 0
    # Where and since when its latest attempt runs, for Postgres: written with the attempt's
    # first token (beside the answer, not before it) and with the final state.
    admission: services.Admission | None = None
    # What its worker had to read before it when the attempt was admitted (for the worker's
    # speed), until the attempt's first token.
    admitted: Admitted | None = None
    # The prompt as placement rendered and tokenized it, and with which model's tokenizer:
    # what the worker holds before the answer.
    prompt: Prompt | None = None
    prompt_folder: str = ""
    # An answer its edge reads from the worker itself (`queue.Job.relay`): what the edge
    # reported of the latest attempt, and the `retract` payload if moderation withdrew it.
    relayed: relay.Outcome | None = None
    retract: dict[str, Any] | None = None


class RelayGone(Exception):
    """The edge relaying the answer reported its client gone, or stopped reporting."""


class Runs:
    """Serves this replica's generations, one `Run` each."""

    def __init__(
        self,
        *,
        redis: Any,
        replica_id: str,
        client: OpenAICompatibleClient,
        capacity: Capacity,
        writer: StreamWriter,
        guard: OutputGuard,
        tools: ToolLoop,
        no_tool_workers: set[int],
        finished: asyncio.Event | None = None,
    ) -> None:
        self.redis = redis
        # Set as a generation without a row finishes: what it left is written in a batch.
        self.finished = finished or asyncio.Event()
        self.replica_id = replica_id
        self.client = client
        self.capacity = capacity
        self.writer = writer
        self.guard = guard
        self.tools = tools
        # Workers that refused tools (started without a tool-call parser): answer without.
        self.no_tool_workers = no_tool_workers
        self._background: set[asyncio.Task[Any]] = set()
        # Generations another replica adopted from this one: their runs end without a word.
        self._given_up: set[str] = set()
        # Runs that ended unfinished, still to be disowned (Redis was away when they ended):
        # while the job names this live replica, neither the sweeper nor adoption takes it.
        self._unowned: set[str] = set()
        # The relays this replica ordered and waits on: what their edges said, by id.
        self._relays: dict[str, asyncio.Queue[tuple[int, str]]] = {}

    def relay_said(self, message: str) -> None:
        """An edge's word on a relay this replica ordered (`<id> <attempt> first|end`)."""
        try:
            generation_id, attempt, said = message.split()
            signals = self._relays.get(generation_id)
            if signals is not None:
                signals.put_nowait((int(attempt), said))
        except ValueError:
            logger.warning("unreadable relay message %r", message[:200])

    def new(self, job: queue.Job, placement: Placement, admitted: Admitted) -> Run:
        worker = placement.view
        # Its wait in line and its placement, now that both are over.
        admitted_ms = queue.now_ms()
        claimed_ms = job.claimed_ms or admitted_ms
        tracing.record(
            "scheduler.queue_wait",
            parent=job.traceparent,
            start_ms=job.enqueued_ms,
            end_ms=claimed_ms,
            **{"chatsite.pool": job.pool, "chatsite.tier": job.tier},
        )
        tracing.record(
            "scheduler.placement",
            parent=job.traceparent,
            start_ms=claimed_ms,
            end_ms=admitted_ms,
            **{"chatsite.worker": worker.name},
        )
        return Run(
            job=job,
            worker=worker,
            # An adopted answer (its replica died) goes on from the attempts made so far.
            attempt=job.attempt + 1,
            tried={worker.id},
            # An answer relayed by its edge is checked there, as it reads it.
            moderation=None if job.relay else self.guard.window(),
            admitted=admitted,
            prompt=placement.prompt,
            prompt_folder=worker.tokenizer_folder,
        )

    async def disown_left(self) -> None:
        """Hand the runs that ended unfinished to the sweeper (again, after a Redis outage)."""
        for gid in list(self._unowned):
            try:
                async with self.redis.pipeline(transaction=False) as pipe:
                    pipe.hdel(queue.job_key(gid), "owner")
                    pipe.srem(queue.owned_key(self.replica_id), gid)
                    await pipe.execute()
            except REDIS_FAULTS:
                return  # the adoption loop tries again in a second
            self._unowned.discard(gid)

    def give_up(self, generation_id: str) -> None:
        """Another replica adopted this generation (this one stood still past the replica
        TTL): the run that is cancelled next ends without writing anything, and without
        releasing a lease the adopter may hold under the same name."""
        self._given_up.add(generation_id)

    async def serve(self, run: Run) -> None:
        """Serve `run` to its end; its log lines carry its request and generation ids, and
        its spans join the trace of the turn that enqueued it."""
        job = run.job
        with (
            logs.bound(request=job.request_id or None, generation=job.generation_id),
            tracing.resumed(job.traceparent),
        ):
            await self._serve(run)

    async def _serve(self, run: Run) -> None:
        gid = run.job.generation_id
        try:
            if await self._cancel_asked(gid):
                await self._finish(run, Generation.Status.CANCELLED, "cancelled")
                return
            while True:
                try:
                    await self._attempt(run)
                except WorkerFault as fault:
                    if isinstance(fault, ToolsUnsupported) and run.job.run_tools:
                        # Offering our plugins is optional: answer on this worker without.
                        logger.warning("worker %s serves without tools", run.worker.name)
                        metrics.degraded(run.job, metrics.TOOLS_UNSUPPORTED)
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
                        await self.tools.hand_to_client(
                            generation_id=gid, calls=calls, kept=run.job.kept
                        )
                        run.finish_reason = "tool_calls"
                    await self._finish(run, Generation.Status.COMPLETE, run.finish_reason or "stop")
                    return
        except ContentBlocked:
            # `_finish` withdraws the text (retract) and ends it as `content_filter`.
            await self._finish(run, Generation.Status.COMPLETE, services.CONTENT_FILTER)
        except RelayGone:
            # Its edge cancels it next: that cancel must not cut this write short either.
            await self._finish_whatever_comes(run)
        except asyncio.CancelledError:
            if gid in self._given_up:
                raise
            await self._finish_whatever_comes(run)
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
            if gid in self._given_up:
                self._given_up.discard(gid)
                self.capacity.forget_lease(gid)
            else:
                if not run.finished:
                    # Disown it, so the sweeper fails it with the text its stream carried.
                    logger.error("generation %s left unfinished; handing it to the sweeper", gid)
                    self._unowned.add(gid)
                await self.capacity.release(gid)
                await self.disown_left()
                with contextlib.suppress(Exception):
                    await self.redis.srem(queue.owned_key(self.replica_id), gid)

    async def _finish_whatever_comes(self, run: Run) -> None:
        """Finish `run` as cancelled. A cancel may come twice (its pub/sub message, then the
        job's cancel flag seen by housekeeping): the second must not cut the write short."""
        finishing = asyncio.ensure_future(
            self._finish(run, Generation.Status.CANCELLED, "cancelled")
        )
        while not finishing.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(finishing)
        finishing.result()

    async def _cancel_asked(self, generation_id: str) -> bool:
        try:
            return bool(await self.redis.hget(queue.job_key(generation_id), "cancel"))
        except REDIS_FAULTS:
            return False  # housekeeping finds the flag once Redis answers

    @tracing.traced("scheduler.generate")
    async def _attempt(self, run: Run) -> None:
        job, view = run.job, run.worker
        tracing.annotate(
            **{
                "chatsite.worker": view.name,
                "chatsite.attempt": run.attempt,
                "chatsite.tool_round": run.tool_rounds,
            }
        )
        if run.announced_attempt != run.attempt:
            # Once per worker: a tool round continues on the same one without a new `meta`.
            # No database round trip stands between admission and the first token.
            adopted = run.announced_attempt == 0 and job.attempt > 0
            run.announced_attempt = run.attempt
            run.admission = services.Admission(
                worker_id=view.id, attempt=run.attempt, admitted_at=timezone.now()
            )
            # Off the answer's way: a Redis that is away holds up neither (adoption reads the
            # attempts made; the next turn's placement, the conversation's worker).
            self._spawn(self._note_attempt(run))
            if adopted:
                # Its replica died mid-answer: the client starts the text again.
                await self.writer.event(
                    job.generation_id,
                    StreamEvent.RESTART,
                    RestartData(reason=ErrorCode.SCHEDULER_LOST, attempt=run.attempt),
                )
            if not job.relay:  # a relayed answer's order says as much
                await self.writer.event(
                    job.generation_id,
                    StreamEvent.META,
                    MetaData(status="running", worker=view.name, attempt=run.attempt),
                )
            logger.debug(
                "generation %s runs on %s (attempt %d)", job.generation_id, view.name, run.attempt
            )
        if not run.messages:
            run.messages = list(job.messages)
        # A forced call is the first round's; the rounds after it let the model choose.
        tool_choice = job.tool_choice if not run.tool_rounds else None
        if job.run_tools and run.tool_rounds >= settings.TOOL_LOOP_MAX_ROUNDS:
            tool_choice = "none"  # past the cap the model must answer with what it has
        round_suffix = f"r{run.tool_rounds}" if run.tool_rounds else ""
        # The answer's output budget covers every round.
        max_tokens = max(1, job.max_tokens - int(run.spent.get("completion_tokens") or 0))
        if job.relay:
            body = chat_body(
                model=view.served_model,
                messages=None,  # the edge has them (`RelayData`)
                max_tokens=max_tokens,
                priority=job.priority,
                params=request_sampling(job.params, view.sampling_defaults, max_tokens=max_tokens),
            )
            await self._relayed_attempt(run, body, worker_request_id(job, str(run.attempt)))
            return
        stream = self.client.stream_chat(
            base_url=view.url,
            model=view.served_model,
            messages=run.messages,
            max_tokens=max_tokens,
            priority=job.priority,
            params=request_sampling(job.params, view.sampling_defaults, max_tokens=max_tokens),
            request_id=worker_request_id(job, f"{run.attempt}{round_suffix}"),
            # Only our plugins are optional: a `/v1` client's tools are never dropped.
            tools=None if job.run_tools and view.id in self.no_tool_workers else job.tools,
            tool_choice=tool_choice,
        )
        coalescer = Coalescer(
            lambda: self._flush(run),
            interval=settings.SCHEDULER_COALESCE_MS / 1000,
            # A trip found by the timer stops the answer at the loop's next piece of text
            # (closing the stream aborts the request in vLLM).
            late_errors=(ContentBlocked,),
        )
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
                if run.admission is not None and run.admission.first_token_at is None:
                    await self._first_token(run, run.admission)
                await coalescer.pending()
        finally:
            await coalescer.aclose()
            await stream.aclose()
        await self._flush(run)

    async def _relayed_attempt(self, run: Run, body: dict[str, Any], request_id: str) -> None:
        """Order the edge that took the request to read the attempt from the worker, and
        take over what it reports, as if the attempt had run here (inference/relay.py)."""
        gid = run.job.generation_id
        signals: asyncio.Queue[tuple[int, str]] = asyncio.Queue()
        self._relays[gid] = signals
        try:
            order = RelayData(
                attempt=run.attempt,
                replica=self.replica_id,
                url=run.worker.url,
                body=body,
                request_id=request_id,
            )
            await self.writer.event(gid, StreamEvent.RELAY, order)
            outcome = await self._relay_outcome(run, signals)
        finally:
            self._relays.pop(gid, None)
        self._take_outcome(run, outcome)

    async def _relay_outcome(
        self, run: Run, signals: asyncio.Queue[tuple[int, str]]
    ) -> relay.Outcome:
        """What the edge reports of the attempt; `LOST` once it has said nothing for
        `relay.PATIENCE_SECONDS` (no first token, beat or outcome)."""
        gid, attempt = run.job.generation_id, run.attempt
        ordered_ms = queue.now_ms()
        while True:
            try:
                said_attempt, said = await asyncio.wait_for(
                    signals.get(), timeout=relay.PATIENCE_SECONDS
                )
            except TimeoutError:
                said_attempt, said = attempt, "silent"
            if said_attempt != attempt:
                continue  # of an attempt this one replaced
            if said == "first":
                await self._relay_first_token(run)
                continue
            try:
                reported, first, beat = await self.redis.hmget(
                    queue.job_key(gid), relay.OUTCOME_FIELD, relay.FIRST_FIELD, relay.BEAT_FIELD
                )
            except REDIS_FAULTS:
                continue  # asked again after the patience
            outcome = relay.Outcome.from_json(reported)
            if outcome is not None and outcome.attempt == attempt:
                if outcome.tokens:
                    await self._relay_first_token(run)  # its word may have been lost
                return outcome
            if said != "silent":
                continue
            first_attempt, first_ms = relay.parse_beat(first)
            if first_attempt == attempt:
                await self._relay_first_token(run)
            else:
                first_ms = 0
            beat_ms, tokens = relay.parse_beat(beat)
            if queue.now_ms() - max(ordered_ms, first_ms, beat_ms) < relay.PATIENCE_SECONDS * 1000:
                continue
            logger.warning("the edge relaying generation %s went silent; ending it", gid)
            return relay.Outcome(attempt=attempt, end=relay.End.LOST, tokens=tokens)

    async def _relay_first_token(self, run: Run) -> None:
        if run.admission is not None and run.admission.first_token_at is None:
            await self._first_token(run, run.admission)

    def _take_outcome(self, run: Run, outcome: relay.Outcome) -> None:
        """The attempt's end as the edge reported it, as `_attempt` ends its own: text,
        usage and finish reason kept; a fault, a withdrawal or a departure raised."""
        run.relayed = outcome
        run.text = outcome.text
        run.usage = outcome.usage
        run.finish_reason = outcome.finish_reason
        if outcome.end == relay.End.LOST and outcome.tokens:
            run.usage = {
                "prompt_tokens": run.job.prompt_tokens,
                "completion_tokens": outcome.tokens,
            }
        if outcome.end == relay.End.BLOCKED:
            run.retract = outcome.retract or {}
            raise ContentBlocked
        # Written to the stream once, at the finish: for a replay of the request, the sweeper.
        run.pending = run.text
        if outcome.end == relay.End.FAULT:
            try:
                code = FaultCode(outcome.fault_code)
            except ValueError:
                code = FaultCode.WORKER_ERROR
            raise WorkerFault(code, outcome.fault_message)
        if outcome.end in (relay.End.LEFT, relay.End.LOST):
            raise RelayGone

    async def _late_outcome(self, run: Run) -> None:
        """A relayed answer cancelled before its outcome was taken: take what the edge
        reported by then (it reports before it cancels), if it did."""
        try:
            reported = await self.redis.hget(
                queue.job_key(run.job.generation_id), relay.OUTCOME_FIELD
            )
        except REDIS_FAULTS:
            return
        outcome = relay.Outcome.from_json(reported)
        if outcome is not None and outcome.attempt == run.attempt:
            with contextlib.suppress(ContentBlocked, WorkerFault, RelayGone):
                self._take_outcome(run, outcome)

    async def _note_attempt(self, run: Run) -> None:
        job = run.job
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.eval(
                    queue.HSET_IF_EXISTS,
                    1,
                    queue.job_key(job.generation_id),
                    "attempt",
                    run.attempt,
                )
                if job.conversation_id:  # an unkept answer has no next turn to place
                    pipe.set(
                        queue.affinity_key(job.conversation_id),
                        run.worker.id,
                        ex=settings.SCHEDULER_AFFINITY_TTL_SECONDS,
                    )
                await pipe.execute()
        except REDIS_FAULTS:
            logger.warning("could not note attempt %d of %s", run.attempt, job.generation_id)

    async def _first_token(self, run: Run, admission: services.Admission) -> None:
        """The attempt's first text: Postgres learns where and since when it runs, in one
        write off the answer's way; the job's first-token time is kept for the first only."""
        first_token_at = timezone.now()
        tracing.event("first_token")
        run.admission = replace(admission, first_token_at=first_token_at)
        gid = run.job.generation_id
        if not run.first_token_seen:
            run.first_token_seen = True
            metrics.first_token(run.job)
            # Housekeeping's mark (the grace of a stream nobody reads); a relayed answer's
            # edge noted its own (`relay_first`), and nobody tails it but that edge.
            if not run.job.relay:
                try:
                    await self.redis.eval(
                        queue.HSET_IF_EXISTS,
                        1,
                        queue.job_key(gid),
                        "first_token_ms",
                        queue.now_ms(),
                    )
                except REDIS_FAULTS:  # Redis is away; the answer goes on (the writer holds it)
                    logger.warning("could not note the first token of %s", gid)
        if run.job.kept:  # an unkept answer has no row to mark
            self._spawn(
                sync_to_async(services.generation_mark_started)(
                    generation_id=gid, admission=run.admission
                )
            )
        if run.admitted is not None:
            ttft = first_token_at - admission.admitted_at
            self._spawn(self.capacity.first_token(gid, run.admitted, ttft.total_seconds() * 1000))
            run.admitted = None

    async def _tool_round(self, run: Run, calls: list[ToolCall]) -> bool:
        """Run the calls the model paused on, write the round to the branch and extend the
        conversation, so the next `_attempt` continues from the results on the same worker.
        False if the generation ended meanwhile."""
        gid = run.job.generation_id
        await self._flush(run)
        results = await self.tools.run_calls(
            generation_id=gid,
            user_id=run.job.user_id,
            # An unkept answer is in no conversation: the user's tools, as it was offered.
            conversation_id=run.job.conversation_id or None,
            calls=calls,
        )
        sent = sent_calls(calls)
        # An unkept answer's rounds live in the run alone, as its text does.
        if run.job.kept and not await sync_to_async(services.generation_add_tool_round)(
            generation_id=gid, text=run.text, tool_calls=sent, results=results
        ):
            return False
        run.messages = [
            *run.messages,
            {"role": "assistant", "content": run.text, "tool_calls": sent},
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

    async def _flush(self, run: Run) -> None:
        """Send the pending text, then check the output's newest window; ContentBlocked
        once a check has tripped (nothing more goes out)."""
        if run.moderation is not None and run.moderation.blocked is not None:
            raise ContentBlocked
        if run.pending:
            text, run.pending = run.pending, ""
            await self.writer.event(run.job.generation_id, StreamEvent.DELTA, DeltaData(text=text))
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
        verdict = await self.guard.check(excerpt)
        return window.record(verdict, excerpt, end=len(text))

    async def _retry_elsewhere(self, run: Run, fault: WorkerFault) -> bool:
        """Restart once on another worker after a fault; False if that is not possible."""
        gid = run.job.generation_id
        logger.warning("generation %s: worker %s failed: %s", gid, run.worker.name, fault.message)
        await self.capacity.release(gid)
        if fault.code == FaultCode.WORKER_UNREACHABLE:
            await self.capacity.mark_down(run.worker, fault.message)
        if run.attempt >= settings.GENERATION_MAX_ATTEMPTS:
            return False
        others = await self.capacity.candidates(run.job.pool, exclude=run.tried)
        for placement in await self.capacity.place(run.job, others):
            admitted = await self.capacity.acquire(
                placement, gid, tokens=run.job.kv_tokens, tier=run.job.tier
            )
            if admitted:
                metrics.ADMISSIONS.labels(run.job.pool, run.job.tier, metrics.RETRY).inc()
                view = placement.view
                run.worker = view
                run.admitted = admitted
                run.tried.add(view.id)
                run.attempt += 1
                run.text = run.pending = ""
                run.usage = run.finish_reason = None
                run.tool_calls = ToolCallAssembler()
                await self.writer.event(
                    gid, StreamEvent.RESTART, RestartData(reason=fault.code, attempt=run.attempt)
                )
                return True
        return False

    @tracing.traced("scheduler.finish")
    async def _finish(
        self,
        run: Run,
        status: str,
        finish_reason: str,
        error_code: str = "",
        error_message: str = "",
    ) -> None:
        window = run.moderation
        if run.job.relay and run.relayed is None:
            await self._late_outcome(run)
        if window is not None and window.blocked is None:
            with contextlib.suppress(ContentBlocked):
                await self._flush(run)
            if run.text:
                await self._moderate(run, final=True)
        if run.retract is not None:
            # Withdrawn by the edge's checks (which flagged it): as below.
            status, finish_reason = Generation.Status.COMPLETE, services.CONTENT_FILTER
            error_code = error_message = ""
            await self.writer.retract(run.job.generation_id, cast(RetractData, run.retract))
        elif window is not None and window.blocked is not None:
            # Withdrawn: clients replace the text with a notice, the stream forgets it, and
            # the message keeps it for staff only (`blocked`). Charged as produced.
            status, finish_reason = Generation.Status.COMPLETE, services.CONTENT_FILTER
            error_code = error_message = ""
            await self.writer.retract(
                run.job.generation_id, self.guard.retract_payload(window.blocked)
            )
        elif window is None:
            await self._flush(run)
        usage = run.usage or {}
        if not usage and run.first_token_seen:
            # The worker read the whole prompt before its first token; charge our count of it.
            usage = {"prompt_tokens": run.job.prompt_tokens}
        details = usage.get("prompt_tokens_details") or {}
        # The final state after the answer's events: wait for those Redis has yet to take.
        await self.writer.drained(run.job.generation_id)
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
                    admission=run.admission,
                    job=run.job,
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
                self.finished.set()  # its usage event waits in the ledger's outbox
                logger.debug(
                    "generation %s ended %s (%s)", run.job.generation_id, status, finish_reason
                )
                metrics.answered(
                    run.job,
                    status=status,
                    output_tokens=usage.get("completion_tokens"),
                    since=run.admission.first_token_at if run.admission else None,
                )
                if status == Generation.Status.COMPLETE and run.text:
                    self._remember_answer(run, usage)
                await self._flag_output(run)
                return

    def _remember_answer(self, run: Run, usage: dict[str, Any]) -> None:
        """The blocks the answer filled on its worker are the next turn's prefix: the index
        learns them, off the answer's way."""
        sequence = int(usage.get("prompt_tokens") or 0) + int(usage.get("completion_tokens") or 0)
        # The placed prompt is the answer's own unless tool rounds grew the conversation or
        # a retry moved it to a worker of another model.
        same = not run.tool_rounds and run.prompt_folder == run.worker.tokenizer_folder
        self._spawn(
            self.capacity.remember_answer(
                run.worker,
                run.messages or run.job.messages,
                run.job.tools,
                run.text,
                sequence_tokens=sequence,
                prompt=run.prompt if same else None,
            )
        )

    async def _flag_output(self, run: Run) -> None:
        """Report a withdrawn answer, or one a check asked staff to review."""
        window = run.moderation
        if window is None:
            return
        retracted = window.blocked is not None
        verdict = window.blocked or window.review
        if verdict is None:
            return
        try:
            await sync_to_async(hooks.get_hooks().generation_output_flagged)(
                generation_id=run.job.generation_id,
                user_id=run.job.user_id,
                excerpt=window.blocked_excerpt if retracted else window.review_excerpt,
                verdict=verdict,
                retracted=retracted,
            )
        except Exception:
            logger.exception("could not flag generation %s", run.job.generation_id)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def worker_request_id(job: queue.Job, attempt: str) -> str:
    """The request id the worker is sent (vLLM's own log lines and its abort name it): the
    generation and its attempt (with its tool round, `2r1`), then the edge's request id."""
    own = f"{job.generation_id}-{attempt}"
    return f"{own}.{job.request_id}" if job.request_id else own


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
