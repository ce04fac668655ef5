"""Plans, pools and prices kept per process (`chatsite.catalog`): read once, read again after
any change, wherever it was made."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from redis.exceptions import ConnectionError as RedisConnectionError

from accounts.tests.factories import UserFactory
from billing.models import Plan, PlanPool, PoolPrice, Subscription
from billing.selectors import plan_of, pool_price
from billing.services import subscription_set
from billing.tests.factories import PlanFactory, price, subscribe
from chatsite import catalog
from chatsite.catalog import CATALOG, VERSION_KEY, catalog_changed
from chatsite.redis import sync_redis
from inference.models import ModelPool
from inference.services import pool_named

pytestmark = pytest.mark.django_db


def test_a_second_read_costs_no_statement(user: User, pool: ModelPool) -> None:
    subscribe(user)
    price(pool)
    plan_of(user_id=user.pk), pool_named(model=pool.name), pool_price(pool_id=pool.pk)

    with CaptureQueriesContext(connection) as statements:
        plan = plan_of(user_id=user.pk)
        kept_pool = pool_named(model=pool.name)
        kept_price = pool_price(pool_id=pool.pk)

    assert len(statements) == 0
    assert (plan.pk, kept_pool.pk) == (Subscription.objects.get(user=user).plan_id, pool.pk)
    assert kept_price is not None and kept_price.pool_id == pool.pk


def test_a_saved_plan_is_read_again(user: User) -> None:
    plan = subscribe(user, tokens_per_minute=1000)
    assert plan_of(user_id=user.pk).tokens_per_minute == 1000

    plan.tokens_per_minute = 2000
    plan.save()

    assert plan_of(user_id=user.pk).tokens_per_minute == 2000


def test_a_new_subscription_and_a_plans_pools_are_read_again(user: User, pool: ModelPool) -> None:
    before = plan_of(user_id=user.pk)
    assert before.is_default

    plan = subscribe(user)
    assert plan_of(user_id=user.pk).pk == plan.pk

    PlanPool.objects.create(plan=plan, pool=pool, message_cap=7)
    assert [entry.message_cap for entry in plan_of(user_id=user.pk).plan_pools.all()] == [7]


def test_a_changed_or_deactivated_pool_is_read_again(pool: ModelPool) -> None:
    assert pool_named(model=pool.name).max_output_tokens != 123
    pool.max_output_tokens = 123
    pool.save()
    assert pool_named(model=pool.name).max_output_tokens == 123

    pool.is_active = False
    pool.save()
    with pytest.raises(Exception, match="No model named"):
        pool_named(model=pool.name)


def test_a_price_added_or_removed_is_read_again(pool: ModelPool) -> None:
    assert pool_price(pool_id=pool.pk) is None
    added = price(pool, input_price=5)
    kept = pool_price(pool_id=pool.pk)
    assert kept is not None and kept.input_micros_per_million == 5
    PoolPrice.objects.filter(pk=added.pk).delete()
    assert pool_price(pool_id=pool.pk) is None


def test_a_change_another_process_announces_is_seen(user: User) -> None:
    """Another process's change reaches this one only through Redis: a new version token."""
    plan = subscribe(user, tokens_per_minute=1000)
    assert plan_of(user_id=user.pk).tokens_per_minute == 1000
    # As another process would: the row changes without this process's signal...
    Plan.objects.filter(pk=plan.pk).update(tokens_per_minute=3000)
    assert plan_of(user_id=user.pk).tokens_per_minute == 1000  # ...so this one still keeps it
    # ...until that process publishes the change.
    sync_redis().set(VERSION_KEY, "from-another-process")

    assert plan_of(user_id=user.pk).tokens_per_minute == 3000


def test_emptied_redis_means_a_new_version(user: User) -> None:
    plan = subscribe(user, tokens_per_minute=1000)
    plan_of(user_id=user.pk)
    Plan.objects.filter(pk=plan.pk).update(tokens_per_minute=4000)

    sync_redis().flushdb()

    assert plan_of(user_id=user.pk).tokens_per_minute == 4000


def test_without_redis_every_read_goes_to_the_database(
    user: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = subscribe(user, tokens_per_minute=1000)
    plan_of(user_id=user.pk)

    class Down:
        def get(self, *args: Any, **kwargs: Any) -> None:
            raise RedisConnectionError("down")

    monkeypatch.setattr(catalog, "sync_redis", lambda: Down())
    Plan.objects.filter(pk=plan.pk).update(tokens_per_minute=5000)

    assert plan_of(user_id=user.pk).tokens_per_minute == 5000


def test_each_user_gets_their_own_plan(user: User) -> None:
    other: User = UserFactory.create()
    pro = PlanFactory.create(tier="pro")
    subscription_set(user=user, plan=pro)

    assert plan_of(user_id=user.pk).pk == pro.pk
    assert plan_of(user_id=other.pk).is_default


def test_catalog_changed_drops_this_process_copy_at_once(user: User) -> None:
    plan = subscribe(user, tokens_per_minute=1000)
    plan_of(user_id=user.pk)
    Plan.objects.filter(pk=plan.pk).update(tokens_per_minute=6000)

    catalog_changed()

    assert plan_of(user_id=user.pk).tokens_per_minute == 6000
    CATALOG.forget()


def test_a_request_reads_each_version_once_and_sees_its_own_changes_at_once(
    user: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[str] = []
    read = catalog._current_version

    def counted(key: str = VERSION_KEY) -> str | None:
        reads.append(key)
        return read(key)

    monkeypatch.setattr(catalog, "_current_version", counted)
    plan = subscribe(user, tokens_per_minute=1000)
    with catalog.request_scope():
        assert plan_of(user_id=user.pk).tokens_per_minute == 1000
        plan_of(user_id=user.pk)
        assert reads == [VERSION_KEY]
        # Another process's change waits for the request's next read of the version...
        Plan.objects.filter(pk=plan.pk).update(tokens_per_minute=3000)
        sync_redis().set(VERSION_KEY, "from-another-process")
        assert plan_of(user_id=user.pk).tokens_per_minute == 1000
        # ...the request's own change does not.
        plan.tokens_per_minute = 2000
        plan.save()
        assert plan_of(user_id=user.pk).tokens_per_minute == 2000
    reads.clear()
    plan_of(user_id=user.pk)
    plan_of(user_id=user.pk)
    assert reads == [VERSION_KEY, VERSION_KEY], "outside a request every read asks Redis"


def test_a_long_request_reads_the_version_again(
    user: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(catalog, "REQUEST_MEMO_SECONDS", 0.0)
    plan = subscribe(user, tokens_per_minute=1000)
    with catalog.request_scope():
        assert plan_of(user_id=user.pk).tokens_per_minute == 1000
        Plan.objects.filter(pk=plan.pk).update(tokens_per_minute=3000)
        sync_redis().set(VERSION_KEY, "from-another-process")
        assert plan_of(user_id=user.pk).tokens_per_minute == 3000
