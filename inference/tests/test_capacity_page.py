"""The admin's capacity page: staff who may view workers see the per-tier figures, live
(its data refreshes the tables), read from the rows and Redis as the metrics are."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone

from accounts.tests.factories import UserFactory
from chatsite.redis import sync_redis
from conversations.services import message_send
from conversations.tests.factories import ConversationFactory
from inference import queue
from inference.models import Generation, ModelPool, Worker

pytestmark = pytest.mark.django_db

PAGE = "/admin/inference/worker/capacity/"
DATA = "/admin/inference/worker/capacity/data/"


def _staff(*permissions: str) -> Client:
    user = UserFactory.create(is_staff=True)
    for codename in permissions:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


def _generation(pool: ModelPool, **fields: Any) -> Generation:
    conversation = ConversationFactory.create()
    placeholder = message_send(conversation=conversation, content="Hi").placeholder
    generation = Generation.objects.create(
        message=placeholder,
        conversation=conversation,
        user=conversation.owner,
        pool=pool,
        tier="free",
        priority=10,
        max_tokens=64,
    )
    # `enqueued_at` is set on create: the times are written after it.
    Generation.objects.filter(pk=generation.pk).update(**fields)
    return generation


@pytest.fixture
def fleet() -> ModelPool:
    """One pool's last minutes: three answers, a rejection, one running, one long ago; two
    answers queued; a worker's reading."""
    pool = ModelPool.objects.create(name="cap-pool", served_model="m")
    worker = Worker.objects.create(
        pool=pool, name="cap-w", url="http://10.0.0.9:8000", state="healthy"
    )
    start = timezone.now() - timedelta(minutes=2)
    for queued_ms, ttft_ms, tokens in ((100, 500, 40), (200, 1000, 60), (300, 2000, 80)):
        first = start + timedelta(milliseconds=ttft_ms)
        _generation(
            pool,
            status=Generation.Status.COMPLETE,
            enqueued_at=start,
            admitted_at=start + timedelta(milliseconds=queued_ms),
            first_token_at=first,
            finished_at=first + timedelta(seconds=2),
            output_tokens=tokens,
        )
    _generation(
        pool,
        status=Generation.Status.REJECTED,
        enqueued_at=start,
        finished_at=start + timedelta(seconds=20),
    )
    _generation(pool, status=Generation.Status.RUNNING, enqueued_at=start)
    long_ago = start - timedelta(hours=2)
    _generation(
        pool,
        status=Generation.Status.COMPLETE,
        enqueued_at=long_ago,
        admitted_at=long_ago,
        first_token_at=long_ago + timedelta(seconds=50),
        finished_at=long_ago + timedelta(seconds=51),
        output_tokens=500,
    )
    redis = sync_redis()
    redis.zadd(queue.queue_key(pool.name, "free"), {"g1": 1, "g2": 2})
    future = queue.now_ms() + 30_000
    redis.zadd(queue.lease_key(worker.pk), {"a": future, "b": future})
    redis.hset(
        queue.metrics_key(worker.pk),
        mapping={
            "running": 3,
            "waiting": 1,
            "kv_cache_percent": 42,
            "prefix_cache_queries": 200,
            "prefix_cache_hits": 50,
        },
    )
    return pool


def test_staff_who_may_view_workers_see_the_figures_of_the_rows(fleet: ModelPool) -> None:
    client = _staff("view_worker")

    page = client.get(PAGE)
    data = client.get(DATA)

    assert page.status_code == 200
    assert data.status_code == 200
    tiers = {(row[0], row[1]): row for row in data.json()["tiers"]}
    # pool, tier, queued, running, answered, TTFT p50, p95, queue p50, p95, tokens/s, rejected
    assert tiers[("cap-pool", "free")] == [
        "cap-pool",
        "free",
        "2",
        "1",
        "3",
        "1000 ms",
        "2000 ms",
        "200 ms",
        "300 ms",
        "30.0",
        "1",
    ]
    assert tiers[("cap-pool", "pro")][2:] == ["0", "0", "0", "-", "-", "-", "-", "-", "0"]
    assert data.json()["workers"] == [
        ["cap-w", "cap-pool", "healthy", "2 / 256", "3", "1", "42 %", "25 %"]
    ]
    # The page shows the same cells, and refreshes itself from the data (a script file: CSP).
    html = page.content.decode()
    row = re.search(r"<tr><td>cap-pool</td><td>free</td>.*?</tr>", html)
    assert row is not None
    assert re.findall(r"<td>(.*?)</td>", row.group(0)) == tiers[("cap-pool", "free")]
    assert 'src="/static/js/admin/capacity.js"' in html
    assert f'data-url="{DATA}?minutes=5"' in html


def test_the_period_is_chosen_among_the_offered_ones(fleet: ModelPool) -> None:
    client = _staff("view_worker")

    # Over 60 minutes the answer of two hours ago is still out; an unknown period is 5.
    hour = client.get(DATA, {"minutes": "60"}).json()
    odd = client.get(DATA, {"minutes": "abc"})

    assert {(r[0], r[1]): r for r in hour["tiers"]}[("cap-pool", "free")][4] == "3"
    assert odd.status_code == 200


def test_staff_without_the_permission_are_refused(fleet: ModelPool) -> None:
    client = _staff("view_generation")

    assert client.get(PAGE).status_code == 403
    assert client.get(DATA).status_code == 403


def test_a_user_who_is_not_staff_is_sent_to_log_in(fleet: ModelPool) -> None:
    client = Client()
    client.force_login(UserFactory.create())

    response = client.get(PAGE)

    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")
