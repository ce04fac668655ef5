"""Deleting a conversation in Django admin takes the same way out as every other removal."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.test import Client

from accounts.tests.factories import UserFactory
from billing import quota
from billing.tests.factories import subscribe
from chatsite.redis import async_redis, sync_redis
from conversations.events import user_events_key
from conversations.models import Conversation
from inference import queue
from inference.models import Generation
from inference.tests.fixtures import (
    register_pool,
    running_schedulers,
    send,
    stream_events,
    wait_for,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _staff_client() -> Client:
    client = Client()
    client.force_login(UserFactory.create(is_staff=True, is_superuser=True))
    return client


def _redis_names_with(marker: str) -> list[str]:
    return [str(name) for name in sync_redis().scan_iter() if marker in str(name)]


async def test_deleting_in_admin_while_the_answer_streams_stops_it_and_frees_everything(
    user: User, fake_workers: Any
) -> None:
    await sync_to_async(subscribe)(user, max_concurrent=1)
    # The answer goes silent after its third token until the test lets it go on: it is still
    # being written when it is deleted, however slow the machine.
    fake = fake_workers(tokens=500, token_delay=0.02, pause_trigger="Hello there")
    await sync_to_async(register_pool)(fake)
    turn = await send(user)
    gid = str(turn.generation.id)
    conversation_id = turn.conversation.pk
    staff = await sync_to_async(_staff_client)()

    async with running_schedulers():

        async def streaming() -> bool:
            events = await sync_to_async(stream_events)(gid)
            return any(name == "delta" for name, _ in events)

        await wait_for(streaming)
        assert quota.held(user_id=user.pk, reservation_id=gid) is not None

        response = await sync_to_async(staff.post)(
            f"/admin/conversations/conversation/{conversation_id}/delete/", {"post": "yes"}
        )
        assert response.status_code == 302

        async def scheduler_let_go() -> bool:
            return not await async_redis().exists(queue.job_key(gid))

        await wait_for(scheduler_let_go)

        async def worker_aborted() -> bool:
            return fake.aborted == 1 and fake.running == 0

        # Let go on, the worker finds its connection closed at its next write.
        fake.resume.set()
        await wait_for(worker_aborted)

    # The rows: a tombstone without content, the generation gone with its message.
    tombstone = await Conversation.objects.aget(pk=conversation_id)
    assert tombstone.deleted_at is not None and tombstone.title == ""
    assert not await Generation.objects.filter(pk=gid).aexists()
    # Billing: the reservation and the concurrency slot are given back.
    assert quota.held(user_id=user.pk, reservation_id=gid) is None
    assert (await send(user)).generation is not None  # max_concurrent=1: the slot is free
    # Redis: nothing names the conversation; of the answer at most its closing event remains.
    assert await sync_to_async(_redis_names_with)(str(conversation_id)) == []
    left = await sync_to_async(_redis_names_with)(gid)
    assert set(left) <= {queue.stream_key(gid)}
    if left:
        assert ("done", {"status": "cancelled", "finish_reason": "conversation_deleted"}) in (
            await sync_to_async(stream_events)(gid)
        )
    # The owner's open pages are told.
    entries: Any = sync_redis().xrange(user_events_key(user.pk))
    assert [fields["event"] for _, fields in entries] == ["deleted"]
