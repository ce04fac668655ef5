"""The usage ledger: one event per generation with its price and cost, equal to the sum of
the generations, and a reconciler that repairs what a crash left behind."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.db.models import Sum
from django.utils import timezone
from rest_framework.test import APIClient

from billing import ledger, quota, services, tasks
from billing.models import UsageEvent
from billing.pricing import format_micros, generation_cost_micros, micros_to_minor
from billing.tests.factories import price, subscribe
from billing.tests.helpers import finish, finish_as_scheduler, send
from chatsite.celery import app
from conversations.removal import conversation_remove
from conversations.services import conversation_create
from inference.models import Generation, ModelPool

pytestmark = pytest.mark.django_db


def new_turn(client: APIClient, user: User, pool: ModelPool) -> str:
    conversation = conversation_create(owner=user, model=pool.name)
    response = send(client, conversation)
    assert response.status_code == 201, response.content
    return str(response.json()["generation"]["id"])


def later(seconds: int = 3600) -> Any:
    return timezone.now() + timedelta(seconds=seconds)


def at(milliseconds: float) -> datetime:
    """The quota's clock (epoch milliseconds) as the reconciler's `now`."""
    return datetime.fromtimestamp(milliseconds / 1000, tz=UTC)


def test_cost_is_rounded_up_once_per_generation() -> None:
    # 3 * 0.15 + 1 * 0.60 = 1.05 micro-units -> 2
    assert (
        generation_cost_micros(
            prompt_tokens=3, output_tokens=1, input_price=150_000, output_price=600_000
        )
        == 2
    )
    assert (
        generation_cost_micros(
            prompt_tokens=1_000_000, output_tokens=0, input_price=150_000, output_price=600_000
        )
        == 150_000
    )
    assert (
        generation_cost_micros(
            prompt_tokens=0, output_tokens=0, input_price=150_000, output_price=600_000
        )
        == 0
    )


def test_invoices_round_micro_units_to_cents_half_up() -> None:
    assert micros_to_minor(4_999, minor_digits=2) == 0
    assert micros_to_minor(5_000, minor_digits=2) == 1
    assert micros_to_minor(20_004_999, minor_digits=2) == 2000
    assert micros_to_minor(20_005_000, minor_digits=2) == 2001
    assert format_micros(1_234_500, "USD") == "1.2345 USD"
    assert format_micros(20_000_000, "USD") == "20.00 USD"


def test_a_finished_generation_writes_one_event_with_its_prices_and_cost(
    api_client: APIClient, user: User, pool: ModelPool
) -> None:
    price(pool, input_price=150_000, output_price=600_000)
    plan = subscribe(user)
    generation_id = new_turn(api_client, user, pool)

    finish(generation_id, prompt_tokens=1200, output_tokens=300)

    event = UsageEvent.objects.get(generation_id=generation_id)
    assert (event.user_id, event.pool_id, event.plan_id) == (user.pk, pool.pk, plan.pk)
    assert (event.status, event.prompt_tokens, event.output_tokens) == ("complete", 1200, 300)
    assert (event.input_micros_per_million, event.output_micros_per_million) == (
        150_000,
        600_000,
    )
    assert event.cost_micros == 180 + 180
    assert event.occurred_at == Generation.objects.get(pk=generation_id).finished_at


def test_recording_twice_leaves_one_event(
    api_client: APIClient, user: User, pool: ModelPool
) -> None:
    generation_id = new_turn(api_client, user, pool)
    finish(generation_id)
    generation = Generation.objects.select_related("pool", "user").get(pk=generation_id)

    services.usage_record(generation=generation)
    services.generation_settle(generation=generation)

    assert UsageEvent.objects.filter(generation_id=generation_id).count() == 1


def queued_turn(client: APIClient, user: User, pool: ModelPool, capture: Any) -> str:
    """`new_turn`, its job queued (after its commit) as a scheduler finds it."""
    with capture(execute=True):
        return new_turn(client, user, pool)


def test_an_answer_a_scheduler_finished_owes_its_event_until_the_flush(
    api_client: APIClient,
    user: User,
    pool: ModelPool,
    django_capture_on_commit_callbacks: Any,
) -> None:
    subscribe(user)
    # Sent to a fallback by the overload policy: priced at the pool that answered.
    fallback = ModelPool.objects.create(name="small", served_model="small")
    price(fallback, input_price=100_000, output_price=200_000)
    generation_id = queued_turn(api_client, user, pool, django_capture_on_commit_callbacks)
    Generation.objects.filter(pk=generation_id).update(served_pool=fallback)

    finish_as_scheduler(generation_id, prompt_tokens=1000, output_tokens=500)

    # Settled in Redis at once; the event waits for the replica's flush.
    assert quota.held(user_id=user.pk, reservation_id=generation_id) is None
    assert not UsageEvent.objects.filter(generation_id=generation_id).exists()
    assert ledger.ledger_flush() == 1
    event = UsageEvent.objects.get(generation_id=generation_id)
    assert (event.pool_id, event.prompt_tokens, event.output_tokens) == (pool.pk, 1000, 500)
    assert event.cost_micros == 100 + 100
    assert event.occurred_at == Generation.objects.get(pk=generation_id).finished_at
    assert ledger.ledger_flush() == 0


def test_an_owed_event_is_billed_once_whether_the_flush_or_the_reconciler_writes_it(
    api_client: APIClient,
    user: User,
    pool: ModelPool,
    django_capture_on_commit_callbacks: Any,
) -> None:
    lost, kept = (
        queued_turn(api_client, user, pool, django_capture_on_commit_callbacks) for _ in "ab"
    )
    finish_as_scheduler(lost, prompt_tokens=40, output_tokens=4)
    # The replica died between the answer's end and the flush, and Redis lost the outbox.
    quota.client().delete(ledger.outbox_key())
    finish_as_scheduler(kept, prompt_tokens=50, output_tokens=5)

    report = services.usage_reconcile(now=later())

    # What the outbox held is flushed, what it lost is recorded from the generation.
    assert (report.events_flushed, report.events_recorded) == (1, 1)
    assert services.usage_reconcile(now=later()).events_recorded == 0
    assert ledger.ledger_flush() == 0
    events = UsageEvent.objects.filter(generation_id__in=[lost, kept])
    assert sorted(events.values_list("prompt_tokens", "output_tokens")) == [(40, 4), (50, 5)]


def test_a_failed_generation_is_charged_what_it_consumed(
    api_client: APIClient, user: User, pool: ModelPool
) -> None:
    price(pool)
    generation_id = new_turn(api_client, user, pool)

    # Swept after its scheduler died: some text, no usage report.
    finish(
        generation_id,
        status=Generation.Status.FAILED,
        text="Half an answer",
        prompt_tokens=None,
        output_tokens=None,
    )

    event = UsageEvent.objects.get(generation_id=generation_id)
    assert event.output_tokens > 0
    # The prompt was read to produce that text: charged at the estimate it reserved.
    assert event.prompt_tokens > 0
    assert event.cost_micros > 0


def test_the_ledger_equals_the_sum_of_the_generations(
    api_client: APIClient,
    user: User,
    other_user: User,
    other_api_client: APIClient,
    pool: ModelPool,
) -> None:
    price(pool)
    outcomes = [
        (Generation.Status.COMPLETE, "Done.", 120, 40),
        (Generation.Status.COMPLETE, "Done too.", 300, 200),
        (Generation.Status.CANCELLED, "Cut sh", 90, None),
        (Generation.Status.FAILED, "", None, None),
        (Generation.Status.REJECTED, "", None, None),
    ]
    for client, owner in ((api_client, user), (other_api_client, other_user)):
        for status, text, prompt, output in outcomes:
            finish(
                new_turn(client, owner, pool),
                status=status,
                text=text,
                prompt_tokens=prompt,
                output_tokens=output,
            )
    still_queued = new_turn(api_client, user, pool)

    final = Generation.objects.filter(status__in=Generation.FINAL_STATUSES)
    assert UsageEvent.objects.count() == final.count() == 10
    assert not UsageEvent.objects.filter(generation_id=still_queued).exists()
    ledger = UsageEvent.objects.aggregate(p=Sum("prompt_tokens"), o=Sum("output_tokens"))
    generations = final.aggregate(p=Sum("prompt_tokens"), o=Sum("output_tokens"))
    assert (ledger["p"], ledger["o"]) == (generations["p"], generations["o"])
    for event in UsageEvent.objects.all():
        assert event.cost_micros == generation_cost_micros(
            prompt_tokens=event.prompt_tokens,
            output_tokens=event.output_tokens,
            input_price=event.input_micros_per_million,
            output_price=event.output_micros_per_million,
        )


def test_reconcile_records_a_generation_whose_event_was_lost(
    api_client: APIClient, user: User, pool: ModelPool
) -> None:
    generation_id = new_turn(api_client, user, pool)
    finish(generation_id, prompt_tokens=50, output_tokens=10)
    UsageEvent.objects.all().delete()

    report = services.usage_reconcile(now=later())

    assert report.events_recorded == 1
    event = UsageEvent.objects.get(generation_id=generation_id)
    assert (event.prompt_tokens, event.output_tokens) == (50, 10)
    assert services.usage_reconcile(now=later()).events_recorded == 0


def test_reconcile_settles_a_final_generation_whose_process_died_before_settling(
    api_client: APIClient, user: User, pool: ModelPool
) -> None:
    generation_id = new_turn(api_client, user, pool)
    # The generation became final, then the process died before billing heard of it.
    Generation.objects.filter(pk=generation_id).update(
        status=Generation.Status.COMPLETE,
        prompt_tokens=30,
        output_tokens=3,
        finished_at=timezone.now(),
    )

    report = services.usage_reconcile(now=later())

    assert report.events_recorded == 1
    assert quota.held(user_id=user.pk, reservation_id=generation_id) is None
    assert quota.concurrency_in_use(user_id=user.pk, now=quota.now_ms()) == 0


def test_reconcile_releases_a_reservation_whose_generation_never_committed(user: User) -> None:
    ghost = str(uuid.uuid4())
    limits = quota.Limits(
        requests_per_minute=100,
        tokens_per_minute=10_000,
        max_concurrent=1,
        message_cap=5,
        message_cap_window_ms=3_600_000,
    )
    now = quota.now_ms()
    outcome = quota.reserve(
        user_id=user.pk,
        pool_id=1,
        reservation_id=ghost,
        prompt_tokens=10,
        tokens=500,
        limits=limits,
        now=now,
    )
    assert outcome.admitted

    # Too young: looked at the moment it was made, however long the test has taken since.
    assert services.usage_reconcile(now=at(now)).reservations_released == 0
    report = services.usage_reconcile(now=later())

    assert report.reservations_released == 1
    assert quota.held(user_id=user.pk, reservation_id=ghost) is None
    assert quota.concurrency_in_use(user_id=user.pk, now=now) == 0
    assert quota.cap_window(user_id=user.pk, pool_id=1, window_ms=3_600_000, now=now) == {}


def test_reconcile_keeps_the_slot_of_an_answer_still_in_flight(
    api_client: APIClient, user: User, pool: ModelPool
) -> None:
    generation_id = new_turn(api_client, user, pool)
    ttl_ms = django_settings.BILLING_SLOT_TTL_SECONDS * 1000
    first_expiry = quota.client().zscore(quota.concurrency_key(user.pk), generation_id)
    assert first_expiry is not None
    reserved_at = first_expiry - ttl_ms

    # Ten seconds before the slot would run out, on the clock that reserved it (not the time
    # the test happens to take).
    report = services.usage_reconcile(now=at(reserved_at + ttl_ms - 10_000))

    assert report.slots_kept == 1
    # Renewed from the reconciler's clock: still held past the first expiry.
    expiry = quota.client().zscore(quota.concurrency_key(user.pk), generation_id)
    assert expiry is not None and expiry > first_expiry


def test_reconcile_puts_back_cap_entries_redis_lost_and_removes_strays(
    api_client: APIClient, user: User, pool: ModelPool
) -> None:
    subscribe(user, message_cap=5)
    kept = new_turn(api_client, user, pool)
    finish(kept)
    key = quota.cap_key(user.pk, pool.pk)
    quota.client().delete(key)
    stray = str(uuid.uuid4())
    quota.client().zadd(key, {stray: quota.now_ms() - 600_000})

    report = services.usage_reconcile(now=timezone.now())

    assert (report.cap_entries_added, report.cap_entries_removed) == (1, 1)
    window = quota.cap_window(
        user_id=user.pk, pool_id=pool.pk, window_ms=3 * 3600_000, now=quota.now_ms()
    )
    assert set(window) == {kept}


def test_deleting_a_conversation_does_not_give_its_messages_back(
    api_client: APIClient, user: User, pool: ModelPool
) -> None:
    subscribe(user, message_cap=1)
    generation_id = new_turn(api_client, user, pool)
    finish(generation_id)
    conversation_remove(conversation=Generation.objects.get(pk=generation_id).conversation)

    services.usage_reconcile(now=timezone.now() + timedelta(minutes=5))

    assert UsageEvent.objects.filter(generation_id=generation_id).exists()
    window = quota.cap_window(
        user_id=user.pk, pool_id=pool.pk, window_ms=3 * 3600_000, now=quota.now_ms()
    )
    assert set(window) == {generation_id}


def test_reconcile_task_runs_and_is_in_the_beat_schedule() -> None:
    schedule = {entry["task"] for entry in django_settings.CELERY_BEAT_SCHEDULE.values()}

    assert {"billing.tasks.reconcile_usage", "billing.tasks.close_statements"} <= schedule
    assert "billing.tasks.reconcile_usage" in app.tasks
    assert tasks.reconcile_usage() == services.ReconcileReport().as_dict()


def test_an_owed_event_an_older_release_wrote_in_milliseconds_is_read() -> None:
    moment = datetime(2026, 12, 6, 12, 0, 0, 123456, tzinfo=UTC)
    assert ledger._occurred_at({"occurred_us": str(ledger._epoch_us(moment))}) == moment
    assert ledger._occurred_at({"occurred_ms": "1796558400123"}) == datetime(
        2026, 12, 6, 12, 0, 0, 123000, tzinfo=UTC
    )
