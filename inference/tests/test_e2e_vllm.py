"""End to end with real vLLM CPU workers serving SmolLM2-135M-Instruct.

Started once per session (about 40 s); `make test` and CI run these.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User

from billing.tests.factories import subscribe
from chatsite import logs
from conversations.models import Conversation, Message
from conversations.services import conversation_create
from conversations.turns import Turn, turn_send
from inference import services
from inference.models import Generation, ModelPool, Worker

from .fixtures import (
    RealWorker,
    finished,
    generation_facts,
    running_schedulers,
    stream_events,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# Long enough to fill several of vLLM's 128-token cache blocks, so a cached prefix shows.
SYSTEM_PROMPT = (
    "You are a patient assistant for a small bakery. You answer questions about bread, "
    "pastry and opening hours. The bakery opens at seven in the morning and closes at six "
    "in the evening, every day except Monday. It sells sourdough, rye, baguettes, croissants, "
    "cinnamon rolls and seasonal fruit tarts. Keep answers short, friendly and factual. "
) * 3


def _register(
    workers: list[RealWorker], max_concurrency: int = 256, *, lasting: bool = False
) -> ModelPool:
    """The real workers as a pool. `lasting`: answers are written to their max_tokens (the
    model may not end them sooner), for a test that needs one still being written."""
    pool = ModelPool.objects.create(name="smollm2-135m", served_model="smollm2-135m")
    if lasting:
        pool.sampling_defaults = {"min_tokens": pool.max_output_tokens}
        pool.save(update_fields=["sampling_defaults"])
    for index, worker in enumerate(workers):
        Worker.objects.create(
            pool=pool,
            name=f"vllm-{index}",
            url=worker.url,
            state=Worker.State.HEALTHY,
            max_concurrency=max_concurrency,
        )
    return pool


register = sync_to_async(_register)


def _send(user: User, content: str, conversation: Conversation | None = None) -> Turn:
    conversation = conversation or conversation_create(
        owner=user, model="smollm2-135m", system_prompt=SYSTEM_PROMPT
    )
    return turn_send(user=user, conversation=conversation, content=content)


send = sync_to_async(_send)


async def test_a_sent_message_gets_a_real_answer(
    user: User, real_workers: list[RealWorker]
) -> None:
    await register(real_workers)
    turn = await send(user, "When does the bakery open?")
    async with running_schedulers():
        await wait_for(lambda: finished(turn.generation.id), within=120)

    generation = await Generation.objects.select_related("message").aget(pk=turn.generation.id)
    message = generation.message
    assert generation.status == Generation.Status.COMPLETE, generation.error_message
    assert message.status == Message.Status.COMPLETE
    assert len(message.content.strip()) > 0
    assert generation.prompt_tokens is not None and generation.prompt_tokens > 100
    assert generation.output_tokens is not None and generation.output_tokens > 0
    assert message.output_tokens == generation.output_tokens
    assert generation.finish_reason in {"stop", "length"}
    events = await sync_to_async(stream_events)(turn.generation.id)
    streamed = "".join(data["text"] for name, data in events if name == "delta")
    assert streamed == message.content


async def test_turns_of_a_conversation_stay_on_one_worker_and_hit_its_cache(
    user: User, real_workers: list[RealWorker]
) -> None:
    await register(real_workers)
    first = await send(user, "What breads do you sell?")
    async with running_schedulers():
        await wait_for(lambda: finished(first.generation.id), within=120)
        worker_id = (await Generation.objects.aget(pk=first.generation.id)).worker_id
        assert worker_id is not None
        url = (await Worker.objects.aget(pk=worker_id)).url
        worker = next(w for w in real_workers if w.url == url)
        before = await sync_to_async(worker.metrics)()

        second = await send(user, "And are you open on Monday?", first.conversation)
        await wait_for(lambda: finished(second.generation.id), within=120)
        after = await sync_to_async(worker.metrics)()

    second_generation = await Generation.objects.aget(pk=second.generation.id)
    assert second_generation.status == Generation.Status.COMPLETE
    assert second_generation.worker_id == worker_id
    # The second prompt starts with the first turn, which the worker still holds.
    assert after.prefix_cache_hits - before.prefix_cache_hits >= 128
    assert second_generation.cached_tokens is None or second_generation.cached_tokens >= 128


async def test_cancel_stops_the_request_inside_vllm(
    user: User, real_workers: list[RealWorker]
) -> None:
    await register(real_workers, lasting=True)
    # As the edge's middleware binds it for a request.
    with logs.bound(request="e2e-request-7", generation=None):
        turn = await send(user, "Write a very long story about a baker, with many chapters.")
    async with running_schedulers():

        async def streaming() -> bool:
            events = await sync_to_async(stream_events)(turn.generation.id)
            return any(name == "delta" for name, _ in events)

        await wait_for(streaming, within=120)
        generation = await Generation.objects.select_related("worker").aget(pk=turn.generation.id)
        assert generation.worker is not None
        worker = next(w for w in real_workers if w.url == generation.worker.url)

        async def running_in_vllm() -> bool:
            return (await sync_to_async(worker.metrics)()).running >= 1

        # vLLM updates its gauge at its own pace: the first text may come before it counts the
        # request (CI found it at 0 once, just after the first delta).
        await wait_for(running_in_vllm, within=30, every=0.2)

        await sync_to_async(services.generation_cancel)(generation=generation)

        async def stopped_in_vllm() -> bool:
            return (await sync_to_async(worker.metrics)()).running == 0

        # vLLM aborts on the closed connection at its next engine step; on a loaded 2-core
        # machine with several engines that step can take seconds.
        await wait_for(stopped_in_vllm, within=30, every=0.2)
        await wait_for(lambda: finished(turn.generation.id))

    generation = await Generation.objects.select_related("message").aget(pk=turn.generation.id)
    assert generation.status == Generation.Status.CANCELLED
    assert generation.message.status == Message.Status.CANCELLED
    assert generation.message.content  # the text produced so far is kept
    assert generation.output_tokens is not None and generation.output_tokens < 512
    if worker.log is not None:  # a worker this run started: vLLM's own log names our id
        ours = f"chatcmpl-{generation.pk}-1.e2e-request-7"
        lines = worker.log.read_text().splitlines()
        assert any(f"Received request {ours}" in line for line in lines)
        assert any("Aborted request" in line and ours in line for line in lines)


async def test_in_a_surge_paid_answers_overtake_the_free_queue(
    user: User, real_workers: list[RealWorker], settings: Any
) -> None:
    settings.SCHEDULER_TIER_SHARE = {"pro": 1.25, "plus": 1.0, "free": 0.75}
    settings.SCHEDULER_MAX_QUEUE_SECONDS = 120
    # One worker that takes four answers: three may be free ones, the fourth and fifth paid.
    await register(real_workers[:1], max_concurrency=4, lasting=True)
    await sync_to_async(subscribe)(user, tier="free", max_output_tokens=400)
    pro_user = await User.objects.acreate(username="pro-user")
    await sync_to_async(subscribe)(pro_user, tier="pro", max_output_tokens=16)
    story = "Write a very long story about a baker, with many chapters."
    free = [await send(user, story) for _ in range(8)]
    async with running_schedulers() as replicas:

        async def free_running() -> bool:
            ids = [turn.generation.id for turn in free]
            running = Generation.objects.filter(pk__in=ids, admitted_at__isnull=False)
            return await running.acount() >= 3

        await wait_for(free_running, within=120)
        paid = [await send(pro_user, "When does the bakery open?") for _ in range(2)]
        for turn in paid:
            await wait_for(partial(finished, turn.generation.id), within=120)
        for turn in free:
            await sync_to_async(services.generation_cancel)(generation=turn.generation)
        for turn in free:
            try:
                await wait_for(partial(finished, turn.generation.id), within=60)
            except AssertionError as exc:
                facts = await generation_facts(turn.generation.id, replicas)
                message = f"a cancelled free answer did not end ({exc}): {facts}"
                raise AssertionError(message) from None

    pro = [await Generation.objects.aget(pk=turn.generation.id) for turn in paid]
    assert all(g.status == Generation.Status.COMPLETE for g in pro), [g.error_message for g in pro]
    admitted_by = max(g.admitted_at for g in pro if g.admitted_at is not None)
    free_rows = [await Generation.objects.aget(pk=turn.generation.id) for turn in free]
    # The paid answers did not wait for a free one to end: the headroom above the free share
    # took them while the free answers ran ...
    first_free_end = min(g.finished_at for g in free_rows if g.finished_at is not None)
    assert admitted_by < first_free_end
    # ... and they went ahead of the free ones sent before them, which waited (or were
    # cancelled while they waited): five were queued behind the free share when the paid
    # ones came; a free answer or two ending in the moment between would let one more in.
    overtaken = [g for g in free_rows if g.admitted_at is None or g.admitted_at > admitted_by]
    assert len(overtaken) >= 3
    for generation in overtaken:
        names = [name for name, _ in await sync_to_async(stream_events)(generation.id)]
        assert "queue" in names  # each was told its place in line
    # No error but cancellation: the surge was served or waited.
    assert {g.status for g in free_rows} <= {
        Generation.Status.COMPLETE,
        Generation.Status.CANCELLED,
    }
