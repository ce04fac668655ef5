"""Fixtures shared by every app's tests."""

from __future__ import annotations

import io
import json
import logging
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from accounts.models import ApiKey
from accounts.services import api_key_create
from accounts.tests.factories import UserFactory
from chatsite import catalog, logs
from chatsite.redis import sync_redis
from chatsite.tests.redis_cluster import LocalCluster

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


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--redis-cluster",
        action="store_true",
        help="run the tests against a local Redis Cluster of three masters, which the suite "
        "starts (redis-server --cluster-enabled yes) and stops",
    )


@pytest.fixture(scope="session")
def redis_cluster(django_db_setup: Any) -> Iterator[LocalCluster]:
    """A Redis Cluster of three masters for the session, stopped before the test database
    is dropped (it requests the database's set-up, so it is torn down first)."""
    cluster = LocalCluster().start()
    try:
        yield cluster
    finally:
        cluster.stop()


@contextmanager
def redis_cluster_settings(cluster: LocalCluster) -> Iterator[None]:
    """Settings, and the environment the suite's processes inherit, pointing the client
    factory at `cluster` (Django's cache and Celery stay on the plain Redis); restored after."""
    before = settings.REDIS_URL, settings.REDIS_CLUSTER
    env: dict[str, str] = {
        "REDIS_URL": cluster.url,
        "REDIS_CLUSTER": "1",
        "CACHE_REDIS_URL": settings.CACHE_REDIS_URL,
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "CELERY_RESULT_BACKEND": settings.CELERY_RESULT_BACKEND,
    }
    saved_env = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    settings.REDIS_URL, settings.REDIS_CLUSTER = cluster.url, True
    try:
        yield
    finally:
        settings.REDIS_URL, settings.REDIS_CLUSTER = before
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(scope="session", autouse=True)
def _suite_on_redis_cluster(request: pytest.FixtureRequest) -> Iterator[None]:
    """With `--redis-cluster`, every test of the run talks to the local cluster."""
    if not request.config.getoption("--redis-cluster"):
        yield
        return
    cluster = request.getfixturevalue("redis_cluster")
    with redis_cluster_settings(cluster):
        yield


@pytest.fixture
def on_redis_cluster(redis_cluster: LocalCluster) -> Iterator[LocalCluster]:
    """This test on the local Redis Cluster, emptied before and after it."""
    with redis_cluster_settings(redis_cluster):
        sync_redis().flushdb()
        try:
            yield redis_cluster
        finally:
            sync_redis().flushdb()


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
    versions: dict[str, str] = {}

    def current(key: str = catalog.VERSION_KEY) -> str:
        return versions.setdefault(key, uuid.uuid4().hex)

    def new(key: str = catalog.VERSION_KEY) -> None:
        versions[key] = uuid.uuid4().hex

    monkeypatch.setattr(catalog, "_current_version", current)
    monkeypatch.setattr(catalog, "_new_version", new)


@pytest.fixture(autouse=True)
def _fresh_memos() -> None:
    """Each test scores and counts its texts afresh: what an earlier test computed (with
    another backend or tokenizer patched in, say) is not reused (`chatsite.memo`)."""
    from conversations.turns import TOKEN_COUNTS
    from inference.prompts import PIECES
    from moderation.engine import SCORES

    SCORES.clear()
    TOKEN_COUNTS.clear()
    PIECES.clear()


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
