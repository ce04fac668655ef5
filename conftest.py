"""Fixtures shared by every app's tests."""

from __future__ import annotations

import io
import json
import logging
import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from accounts.models import ApiKey
from accounts.services import api_key_create
from accounts.tests.factories import UserFactory
from chatsite import catalog, logs
from chatsite.redis import sync_redis

# Session-wide fixtures (a live edge, real vLLM workers, the browser) start once per run,
# shared by every app's tests.
pytest_plugins = ["inference.tests.fixtures", "conversations.tests.browser_conftest"]

# The suite's workers and MCP servers listen on 127.0.0.1, which the address policy
# (chatsite/netpolicy.py) refuses unless allowed: allowed here for the processes the suite
# starts (a live edge, a scheduler), and by `_loopback_workers_and_mcp_servers` in this one.
LOOPBACK_NETWORKS = "127.0.0.0/8,::1/128"
for _setting in ("INFERENCE_WORKER_ALLOWED_NETWORKS", "PLUGINS_MCP_ALLOWED_NETWORKS"):
    os.environ.setdefault(_setting, LOOPBACK_NETWORKS)
# The scheduler replicas the suite starts as processes serve no endpoints (several would want
# one port); the tests of the endpoints give each replica a free port of its own.
os.environ.setdefault("SCHEDULER_METRICS_PORT", "0")


@pytest.fixture(autouse=True)
def _clean_redis() -> Iterator[None]:
    """Each test starts with an empty Redis database (the suite's own, never the site's)."""
    if settings.REDIS_URL.rstrip("/").rsplit("/", 1)[-1] in {"0", "6379"}:
        pytest.fail("The suite flushes Redis: point REDIS_URL at a database other than 0.")
    redis = sync_redis()
    try:
        redis.flushdb()
        yield
        redis.flushdb()
    finally:
        redis.close()


@pytest.fixture
def own_catalog_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """The catalog's version (chatsite.catalog) as only this process changes it: the suite's
    other processes (a live edge, a Celery worker) share its Redis database and may change
    the shared one at any moment, so that a test counting what a request reads would see the
    catalog reloaded now and then."""
    version = [uuid.uuid4().hex]
    monkeypatch.setattr(catalog, "_current_version", lambda: version[0])
    monkeypatch.setattr(catalog, "_new_version", lambda: version.__setitem__(0, uuid.uuid4().hex))


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings: Any) -> None:
    """Real hashing costs ~1 s a user; the suite tests our code, not PBKDF2."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _loopback_workers_and_mcp_servers(settings: Any) -> None:
    """Workers and MCP servers on loopback are allowed (or what the environment says)."""
    for name in ("INFERENCE_WORKER_ALLOWED_NETWORKS", "PLUGINS_MCP_ALLOWED_NETWORKS"):
        setattr(settings, name, [net for net in os.environ[name].split(",") if net.strip()])


@pytest.fixture(autouse=True)
def _sync_code_on_the_test_thread(settings: Any) -> None:
    """In-process clients see the test's transaction only on the thread that opened it: a
    turn's database work stays there (`EDGE_SYNC_THREADS`). The live edge, a process of its
    own, runs it in its pool of threads as production does."""
    settings.EDGE_SYNC_THREADS = False


@pytest.fixture
def user(db: Any) -> Any:
    return UserFactory()


@pytest.fixture
def other_user(db: Any) -> Any:
    return UserFactory()


@pytest.fixture
def api_client(user: Any) -> APIClient:
    """A client authenticated with one of `user`'s API keys, a full-scope one (the whole
    account; accounts/tests/test_scopes.py has chat keys)."""
    _, raw_key = api_key_create(user=user, name="tests", scope=ApiKey.Scope.FULL)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client


@pytest.fixture
def other_api_client(other_user: Any) -> APIClient:
    _, raw_key = api_key_create(user=other_user, name="tests", scope=ApiKey.Scope.FULL)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client


@pytest.fixture
def session_client(user: Any) -> APIClient:
    """A browser-like client: logged in by session, CSRF enforced as in a real browser."""
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(user)
    return client


@pytest.fixture
def json_lines() -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """What `LOG_FORMAT=json` writes, as parsed lines; the inference plane at DEBUG, whose
    lines say where a generation went."""
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.addFilter(logs.ContextFilter())
    handler.setFormatter(logs.JsonFormatter())
    root, inference = logging.getLogger(), logging.getLogger("inference")
    root.addHandler(handler)
    level = inference.level
    inference.setLevel(logging.DEBUG)
    yield lambda: [json.loads(line) for line in buffer.getvalue().splitlines()]
    inference.setLevel(level)
    root.removeHandler(handler)
