"""Moderation's trips are counted (`chatsite_moderation_trips_total`) by stage and action."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from prometheus_client import REGISTRY
from rest_framework.test import APIClient

from conversations.models import Conversation
from moderation import output

from .helpers import BENIGN, HARMFUL, send

pytestmark = pytest.mark.django_db


def trips(stage: str, action: str) -> float:
    labels = {"stage": stage, "action": action}
    return REGISTRY.get_sample_value("chatsite_moderation_trips_total", labels) or 0.0


def test_a_blocked_input_and_a_review_are_counted(
    api_client: APIClient, conversation: Conversation
) -> None:
    blocked, review = trips("input", "block"), trips("input", "review")

    send(api_client, conversation, HARMFUL)
    send(api_client, conversation, "My code is a fucking mess, can you help?")
    send(api_client, conversation, BENIGN)

    assert trips("input", "block") - blocked == 1
    assert trips("input", "review") - review == 1


def test_an_output_check_that_trips_is_counted() -> None:
    blocked = trips("output", "block")

    async_to_sync(output.check)(HARMFUL)
    async_to_sync(output.check)(BENIGN)

    assert trips("output", "block") - blocked == 1
