"""The direct relay (inference/relay.py, inference/edge_relay.py): an answer nobody keeps is
read from the worker by the edge that queued it, here `edge_relay.follow` in the test's own
event loop beside an in-process scheduler replica; the replica places and finishes it from
what the edge reports. No token passes through the replica or the stream."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.models import User

from billing.models import UsageEvent
from chatsite.redis import sync_redis
from chatsite.testing import budget
from conversations import turns
from inference import edge_relay, queue, relay, services
from inference.models import Worker
from inference.scheduler.capacity import Capacity, Placement
from inference.tests.fixtures import (
    register_pool,
    running_schedulers,
    send_unkept,
    stream_ended,
    stream_events,
    wait_for,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
async def edge_client() -> AsyncIterator[None]:
    """The edge's client of the workers is the process's; its session is this test's loop's."""
    yield
    await edge_relay.close_client()


@dataclass
class Followed:
    """What a follower of the generation saw: the text since the last restart, the events
    by name, and the `done` event's payload."""

    text: str = ""
    names: list[str] = field(default_factory=list)
    done: dict[str, Any] = field(default_factory=dict)

    def take(self, event: str, payload: dict[str, Any]) -> None:
        self.names.append(event)
        if event == "delta":
            self.text += payload["text"]
        elif event == "restart":
            self.text = ""
        elif event == "done":
            self.done = payload


async def follow(gid: str, user: User, *, relay: bool = True, chars: int = 0) -> Followed:
    """Follow the answer to its `done`, or, with `chars`, until that much text came (then
    leave, as a client that goes away)."""
    seen = Followed()
    items = edge_relay.follow(gid, user_id=user.pk, relay=relay)
    async with contextlib.aclosing(items):
        async for item in items:
            if item is not None:
                seen.take(*item)
            if chars and len(seen.text) >= chars:
                break
    return seen


async def usage_of(gid: str) -> UsageEvent:
    async def recorded() -> bool:
        return await UsageEvent.objects.filter(generation_id=gid).aexists()

    await wait_for(recorded)
    return await UsageEvent.objects.aget(generation_id=gid)


async def test_the_edge_reads_the_answer_and_the_stream_carries_its_text_once(
    user: User, fake_workers: Any
) -> None:
    fake = fake_workers(tokens=5)
    await sync_to_async(register_pool)(fake)
    gid = await send_unkept(user, relay=True)

    async with running_schedulers():
        seen = await asyncio.wait_for(follow(gid, user), budget(60))
        event = await usage_of(gid)

    assert seen.text == "tok0 tok1 tok2 tok3 tok4 "
    # The first piece at once, the rest gathered as the scheduler gathered them.
    assert seen.names[0] == "meta" and seen.names[-1] == "done"
    assert set(seen.names[1:-1]) == {"delta"} and 1 < len(seen.names) - 1 <= 5
    assert seen.done["status"] == "complete" and seen.done["output_tokens"] == 5
    # The stream: the order, the whole text once (for a replay), the end; no delta a token.
    events = await sync_to_async(stream_events)(gid)
    assert [name for name, _ in events] == ["meta", "relay", "delta", "done"]
    assert events[1][1]["attempt"] == 1 and events[1][1]["url"] == fake.url
    # The prompt is not kept in the stream, which outlives the answer: the edge read it
    # from the job, which did not.
    assert "messages" not in events[1][1]["body"]
    assert fake.requests[0]["messages"] == [{"role": "user", "content": "Hello there"}]
    assert events[2][1]["text"] == seen.text
    assert len(fake.requests) == 1
    assert (event.prompt_tokens, event.output_tokens, event.status) == (11, 5, "complete")


async def test_an_edge_that_has_the_prompt_sends_it_without_reading_the_job(
    user: User, fake_workers: Any
) -> None:
    """The `/v1` view hands `follow` the prompt its turn made (one round trip less before
    the first token); whatever it hands is what the worker is asked."""
    fake = fake_workers(tokens=2)
    await sync_to_async(register_pool)(fake)
    gid = await send_unkept(user, relay=True)
    given = [{"role": "user", "content": "Handed over by the edge"}]

    async with running_schedulers():
        items = edge_relay.follow(gid, user_id=user.pk, relay=True, messages=given)
        async with contextlib.aclosing(items):
            names = [item[0] async for item in items if item is not None]

    assert names[0] == "meta" and names[-1] == "done" and "delta" in names
    assert [request["messages"] for request in fake.requests] == [given]


async def test_another_follower_gets_the_text_the_replica_writes_at_the_end(
    user: User, fake_workers: Any
) -> None:
    """A request replayed with the same Idempotency-Key follows without relaying."""
    fake = fake_workers(tokens=4)
    await sync_to_async(register_pool)(fake)
    gid = await send_unkept(user, relay=True)

    async with running_schedulers():
        edge, replay = await asyncio.wait_for(
            asyncio.gather(follow(gid, user), follow(gid, user, relay=False)), budget(60)
        )

    assert edge.text == replay.text == "tok0 tok1 tok2 tok3 "
    assert replay.names == ["meta", "delta", "done"]
    assert len(fake.requests) == 1


async def test_a_worker_that_fails_before_its_first_token_is_replaced_by_another(
    user: User, fake_workers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing = fake_workers(mode="error500")
    healthy = fake_workers(tokens=3)
    await sync_to_async(register_pool)(failing, healthy)
    failing_id = (await Worker.objects.aget(url=failing.url)).pk
    place = Capacity.place

    async def failing_first(self: Capacity, job: Any, views: list[Any]) -> list[Placement]:
        placements = await place(self, job, views)
        return sorted(placements, key=lambda placement: placement.view.id != failing_id)

    monkeypatch.setattr(Capacity, "place", failing_first)
    gid = await send_unkept(user, relay=True)

    async with running_schedulers():
        seen = await asyncio.wait_for(follow(gid, user), budget(60))
        event = await usage_of(gid)

    assert seen.text == "tok0 tok1 tok2 "
    assert "restart" in seen.names and seen.done["status"] == "complete"
    orders = [data for name, data in await sync_to_async(stream_events)(gid) if name == "relay"]
    assert [(order["attempt"], order["url"]) for order in orders] == [
        (1, failing.url),
        (2, healthy.url),
    ]
    assert (event.output_tokens, event.status) == (3, "complete")


async def test_a_client_that_leaves_stops_the_worker_and_is_charged_what_was_read(
    user: User, fake_workers: Any
) -> None:
    fake = fake_workers(tokens=2000, token_delay=0.01)
    await sync_to_async(register_pool)(fake)
    gid = await send_unkept(user, relay=True)

    async with running_schedulers():
        seen = await asyncio.wait_for(follow(gid, user, chars=20), budget(60))
        # What the `/v1` view does once its client has gone: the edge reported first.
        await sync_to_async(services.generation_cancel_unkept)(generation_id=gid)
        event = await usage_of(gid)

    async def aborted() -> bool:
        return fake.aborted == 1

    await wait_for(aborted)
    assert len(seen.text) >= 20
    assert event.status == "cancelled"
    assert len(seen.text) // len("tok0 ") <= event.output_tokens < 2000
    assert (await sync_to_async(stream_events)(gid))[-1][1]["status"] == "cancelled"


async def test_an_answer_whose_edge_says_nothing_is_ended_after_the_patience(
    user: User, fake_workers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The edge died before it read the order: the replica gives the answer up, releases
    its worker and charges nothing; the worker was never asked."""
    monkeypatch.setattr(relay, "PATIENCE_SECONDS", 0.5)
    fake = fake_workers(tokens=3)
    await sync_to_async(register_pool)(fake)
    gid = await send_unkept(user, relay=True)

    async with running_schedulers() as (replica,):
        await wait_for(lambda: stream_ended(gid))
        event = await usage_of(gid)
        assert not replica.running

    done = (await sync_to_async(stream_events)(gid))[-1]
    assert done[0] == "done" and done[1]["status"] == "cancelled"
    assert event.status == "cancelled" and not event.output_tokens
    assert fake.requests == []


def test_an_answer_whose_model_is_offered_tools_is_not_relayed(
    user: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `/v1` request without tools of its own still offers the user's plugins: their calls
    need the scheduler's tool loop, so the turn tells its edge not to relay, as the job says."""
    register_pool()
    lookup = {"type": "function", "function": {"name": "lookup", "parameters": {}}}

    def unkept(**options: Any) -> turns.UnkeptTurn:
        return turns.turn_unkept(
            user=user,
            model=settings.DEFAULT_MODEL,
            system_prompt="",
            messages=[("user", "Hello")],
            relay=True,
            **options,
        )

    plain = unkept()
    monkeypatch.setattr(turns, "conversation_tools", lambda **_: [lookup])
    offered = unkept()

    jobs = [queue.read_job(sync_redis(), turn.generation.id) for turn in (plain, offered)]
    assert plain.relay and jobs[0] is not None and jobs[0].relay
    assert not offered.relay and jobs[1] is not None and not jobs[1].relay
    assert jobs[1].tools == [lookup]


def test_an_outcome_is_read_back_as_written_and_garbage_as_none() -> None:
    outcome = relay.Outcome(
        attempt=2,
        end=relay.End.COMPLETE,
        text="Hi",
        finish_reason="stop",
        usage={"prompt_tokens": 3, "completion_tokens": 1},
        tokens=1,
    )
    assert relay.Outcome.from_json(outcome.to_json()) == outcome
    assert relay.Outcome.from_json("{not json") is None
    assert relay.Outcome.from_json('{"end": "complete"}') is None  # no attempt
    assert relay.Outcome.from_json(None) is None
    assert relay.parse_beat("1700000000000 12") == (1700000000000, 12)
    assert relay.parse_beat("garbage") == (0, 0)
