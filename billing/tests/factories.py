"""Factories for billing: plans with roomy limits unless a test says otherwise."""

from __future__ import annotations

from typing import Any

import factory
from django.contrib.auth.models import User

from billing.models import Plan, PoolPrice, Subscription
from billing.services import subscription_set
from inference.models import ModelPool


class PlanFactory(factory.django.DjangoModelFactory[Plan]):
    class Meta:
        model = Plan

    slug = factory.Sequence(lambda n: f"plan-{n}")
    name = factory.LazyAttribute(lambda plan: plan.slug.title())
    tier = "plus"
    monthly_price_micros = 20_000_000
    requests_per_minute = 1000
    tokens_per_minute = 10_000_000
    max_concurrent = 1000
    max_output_tokens = 256
    message_cap = None
    message_cap_window_seconds = 3 * 3600


class PoolPriceFactory(factory.django.DjangoModelFactory[PoolPrice]):
    class Meta:
        model = PoolPrice

    input_micros_per_million = 150_000
    output_micros_per_million = 600_000


def subscribe(user: User, **plan_fields: Any) -> Plan:
    """Put `user` on a new plan with `plan_fields` over the roomy defaults."""
    plan = PlanFactory.create(**plan_fields)
    subscription: Subscription = subscription_set(user=user, plan=plan)
    return subscription.plan


def price(pool: ModelPool, *, input_price: int = 150_000, output_price: int = 600_000) -> PoolPrice:
    return PoolPriceFactory.create(
        pool=pool, input_micros_per_million=input_price, output_micros_per_million=output_price
    )
