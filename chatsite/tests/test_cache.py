"""The Redis cache stores JSON, never pickles (chatsite/cache.py), and what the project keeps in
it still works: moderation's thresholds and rules version, django-ratelimit's counters."""

from __future__ import annotations

import json
import pickle
from datetime import UTC, datetime
from typing import Any

import pytest
from django.core.cache import cache
from django.urls import reverse
from django_redis import get_redis_connection

from chatsite.tests.ratelimit_window import one_ratelimit_window


def stored(key: str) -> bytes:
    """The bytes Redis holds for the cache's `key`."""
    raw = get_redis_connection("default").get(cache.make_key(key))
    assert isinstance(raw, bytes)
    return raw


def test_a_cached_value_is_stored_as_json_and_comes_back_equal() -> None:
    value = {"name": "ünïcode", "scores": [0.5, None, 3], "on": True}
    cache.set("chatsite-test", value, None)  # no expiry: read back however slowly

    raw = stored("chatsite-test")
    assert json.loads(raw) == value
    assert not raw.startswith(b"\x80")  # a pickle's protocol marker
    assert cache.get("chatsite-test") == value


def test_a_value_json_cannot_hold_is_refused_when_set() -> None:
    with pytest.raises(TypeError):
        cache.set("chatsite-test", {"at": datetime.now(tz=UTC)}, 30)
    with pytest.raises(ValueError, match="JSON"):
        cache.set("chatsite-test", float("nan"), 30)
    assert cache.get("chatsite-test") is None


def test_a_pickle_written_into_redis_is_not_unpickled() -> None:
    """Whoever can write to Redis cannot make a reader run a pickle's code."""
    get_redis_connection("default").set(
        cache.make_key("chatsite-test"), pickle.dumps({"a": 1}, protocol=5)
    )
    with pytest.raises(UnicodeDecodeError):
        cache.get("chatsite-test")


def test_counters_stay_integers_that_redis_increments() -> None:
    cache.add("chatsite-count", 1, None)  # no expiry: incremented however slowly
    assert cache.incr("chatsite-count") == 2
    assert stored("chatsite-count") == b"2"


@pytest.mark.django_db
def test_the_log_in_limit_still_counts_on_the_cache(
    client: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.BILLING_ABUSE_RATES = {**settings.BILLING_ABUSE_RATES, "login": "2/m"}
    one_ratelimit_window(monkeypatch)
    form = {"username": "nobody", "password": "wrong"}
    statuses = [client.post(reverse("accounts:login"), form).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
