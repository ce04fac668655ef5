"""The overload policy's fallback: free web answers that waited too long in a busy pool are
answered by its smaller fallback pool, and the answer, its message, its stream and the admin
say so; paid answers, `/v1` answers and prompts too long for the fallback keep waiting."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from billing.models import UsageEvent
from billing.tests.factories import price, subscribe
from chatsite.redis import sync_redis
from conversations.models import Conversation, Message
from conversations.services import conversation_create
from conversations.turns import turn_send
from inference import queue, services
from inference.models import Generation, ModelPool, Worker

from .fixtures import finished, register_pool, running_schedulers, stream_events, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def pools(big_worker: Any, small_worker: Any) -> tuple[ModelPool, ModelPool]:
    """A big pool whose one worker takes one answer at a time, falling back to a small one."""
    small = register_pool(name="small-model")
    big = register_pool(name="big-model")
    for pool, fake, concurrency in ((big, big_worker, 1), (small, small_worker, 8)):
        Worker.objects.create(
            pool=pool,
            name=f"{pool.name}-0",
            url=fake.url,
            state=Worker.State.HEALTHY,
            max_concurrency=concurrency,
        )
    big.fallback = small
    big.save(update_fields=["fallback"])
    return big, small


def send_to(user: User, pool: ModelPool, *, source: str = Conversation.Source.WEB) -> Any:
    conversation = conversation_create(owner=user, model=pool.name)
    if source != conversation.source:
        Conversation.objects.filter(pk=conversation.pk).update(source=source)
        conversation.refresh_from_db()
    return turn_send(user=user, conversation=conversation, content="Hello there")


async def test_a_free_web_answer_that_waited_is_answered_by_the_fallback(
    user: User, fake_workers: Any, settings: Any
) -> None:
    settings.SCHEDULER_FALLBACK_AFTER_SECONDS = 0.3
    settings.SCHEDULER_TIER_SHARE = {"free": 1.0}
    # An answer on the big worker pauses after its third token until the worker stops: it
    # stays busy with one until the test cancels it, however long things take.
    settings.SCHEDULER_STALL_SECONDS = 3600
    big_worker = fake_workers(tokens=5, pause_trigger="Hello there")
    small_worker = fake_workers()
    big, small = await sync_to_async(pools)(big_worker, small_worker)
    await sync_to_async(price)(big, input_price=3_000_000, output_price=9_000_000)
    await sync_to_async(price)(small, input_price=100_000, output_price=300_000)
    await sync_to_async(subscribe)(user, tier="free")
    pro_user = await User.objects.acreate(username="pro-user")
    await sync_to_async(subscribe)(pro_user, tier="pro")
    first = await sync_to_async(send_to)(user, big)
    async with running_schedulers():
        await wait_for(lambda: running(first.generation.id))
        waiting = await sync_to_async(send_to)(user, big)
        api = await sync_to_async(send_to)(user, big, source=Conversation.Source.API)
        paid = await sync_to_async(send_to)(pro_user, big)
        await wait_for(lambda: finished(waiting.generation.id))
        # The others still wait for the big model, past the fallback's delay.
        assert not await finished(api.generation.id)
        assert not await finished(paid.generation.id)
        for turn in (first, api, paid):
            await sync_to_async(services.generation_cancel)(generation=turn.generation)
            await wait_for(partial(finished, turn.generation.id))

    generation = await Generation.objects.select_related("message").aget(pk=waiting.generation.id)
    assert generation.status == Generation.Status.COMPLETE
    assert generation.pool_id == big.pk  # what was asked for, and what the quotas count
    assert generation.served_pool_id == small.pk
    assert generation.route_reason == Generation.RouteReason.HIGH_DEMAND
    assert generation.worker_id == await small.workers.values_list("id", flat=True).aget()
    assert generation.message.model == "small-model"
    notice = "Answered by the smaller model small-model: high demand."
    assert generation.message.metadata["route"] == {
        "model": "small-model",
        "reason": "high_demand",
        "notice": notice,
    }
    metas = [data for name, data in await sync_to_async(stream_events)(generation.id)]
    assert {"status": "queued", "model": "small-model", "route_reason": "high_demand"}.items() <= (
        next(m for m in metas if m.get("notice")).items()
    )
    # Priced as the small model that answered, counted where it was asked for.
    usage = await UsageEvent.objects.aget(generation_id=generation.id)
    assert (usage.input_micros_per_million, usage.output_micros_per_million) == (100_000, 300_000)
    assert usage.pool_id == big.pk
    # The others were not moved.
    for turn in (api, paid):
        other = await Generation.objects.aget(pk=turn.generation.id)
        assert other.served_pool_id is None and other.route_reason == ""


async def running(generation_id: Any) -> bool:
    return await Generation.objects.filter(pk=generation_id, admitted_at__isnull=False).aexists()


def test_the_page_and_the_api_show_why_another_model_answered(
    user: User, api_client: APIClient
) -> None:
    big = register_pool(name="big-model")
    small = register_pool(name="small-model")
    turn = send_to(user, big)
    route = services.generations_route(
        generation_ids=[str(turn.generation.id)],
        pool_name=small.name,
        reason=Generation.RouteReason.HIGH_DEMAND,
    )
    assert route["notice"] == "Answered by the smaller model small-model: high demand."
    base = f"/api/v1/conversations/{turn.generation.conversation_id}/messages"
    body = api_client.get(f"{base}/{turn.generation.message_id}").json()
    assert body["model"] == "small-model"
    assert body["route"] == {
        "model": "small-model",
        "reason": "high_demand",
        "notice": route["notice"],
    }
    # A message written as asked has none.
    user_message = Message.objects.get(pk=turn.generation.message.parent_id)
    assert api_client.get(f"{base}/{user_message.pk}").json()["route"] is None


def test_a_moved_answer_is_cancelled_from_the_fallbacks_queue(user: User) -> None:
    big = register_pool(name="big-model")
    small = register_pool(name="small-model")
    big.fallback = small
    big.save(update_fields=["fallback"])
    turn = send_to(user, big)
    redis = sync_redis()
    tier = turn.generation.tier
    keys = queue.fallback_keys(big.name, tier, small.name)
    moved = redis.eval(
        queue.MOVE_TO_FALLBACK,
        len(keys),
        *keys,
        str(queue.now_ms()),
        small.name,
        "high_demand",
        "60",
        "100000",
    )
    assert moved == [str(turn.generation.id)]
    assert redis.zscore(queue.queue_key(small.name, tier), str(turn.generation.id)) is not None
    # The row still names the pool asked for: the cancel finds the answer where it went.
    services.generation_cancel(generation=Generation.objects.get(pk=turn.generation.id))
    assert Generation.objects.get(pk=turn.generation.id).status == Generation.Status.CANCELLED
    assert redis.zcard(queue.queue_key(small.name, tier)) == 0


def test_a_prompt_too_long_for_the_fallback_stays(user: User) -> None:
    big = register_pool(name="big-model")
    small = register_pool(name="small-model")
    turn = send_to(user, big)
    redis = sync_redis()
    tier = turn.generation.tier
    keys = queue.fallback_keys(big.name, tier, small.name)
    window = "10"  # fewer tokens than the prompt and answer take
    args = [str(queue.now_ms()), small.name, "high_demand", "60", window]
    assert redis.eval(queue.MOVE_TO_FALLBACK, len(keys), *keys, *args) == []
    assert redis.zscore(queue.queue_key(big.name, tier), str(turn.generation.id)) is not None


def test_under_pressure_new_free_conversations_wait_and_others_go_on(
    user: User, api_client: APIClient, settings: Any
) -> None:
    settings.SCHEDULER_PRESSURE_QUEUED = 2
    pool = register_pool(name="big-model")
    subscribe(user, tier="free")
    first, _ = send_to(user, pool), send_to(user, pool)  # two free answers waiting
    # A new conversation is refused, in the API's error shape, with when to come back.
    conversation = conversation_create(owner=user, model=pool.name)
    response = api_client.post(
        f"/api/v1/conversations/{conversation.pk}/messages", {"content": "Hi"}, format="json"
    )
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "high_demand"
    assert response["Retry-After"] == "30"
    assert not Generation.objects.filter(conversation=conversation).exists()
    # A conversation already under way goes on (its last answer ended).
    Generation.objects.filter(pk=first.generation.pk).update(status=Generation.Status.COMPLETE)
    Message.objects.filter(pk=first.generation.message_id).update(status=Message.Status.COMPLETE)
    sync_redis().zrem(queue.queue_key(pool.name, "free"), str(first.generation.pk))
    send_to(user, pool)  # a third in the queue: still two or more waiting
    follow_up = turn_send(user=user, conversation=first.conversation, content="And then?")
    assert follow_up.generation is not None
    # So does a paid user's new conversation.
    pro_user = User.objects.create(username="pro-user")
    subscribe(pro_user, tier="pro")
    assert send_to(pro_user, pool).generation is not None
