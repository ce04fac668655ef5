"""Settings that stop every process at start when wrong (chatsite/settings.py): without its
own key for plugin secrets the service does not run unless DEBUG, and a proxy's TLS header
must name a request.META key; on a Redis Cluster, the cache and Celery need a plain Redis."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from chatsite.testing import budget

ROOT = Path(__file__).resolve().parents[2]


def start(**env: str) -> subprocess.CompletedProcess[str]:
    """Load the settings and the apps in a fresh interpreter, with only `env` set."""
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); print('started')"],
        cwd=ROOT,
        env={"PATH": os.environ["PATH"], "DJANGO_SETTINGS_MODULE": "chatsite.settings", **env},
        capture_output=True,
        text=True,
        timeout=budget(120),  # the failure point only: a hung interpreter
        check=False,
    )


def test_without_a_plugins_key_the_service_refuses_to_start() -> None:
    for key in (None, "", " , "):
        env = {"SECRET_KEY": "a secret", "DEBUG": "0"}
        if key is not None:
            env["PLUGINS_ENCRYPTION_KEY"] = key
        refused = start(**env)
        assert refused.returncode != 0
        assert "ImproperlyConfigured: PLUGINS_ENCRYPTION_KEY must be set" in refused.stderr
        assert "started" not in refused.stdout


def test_with_a_plugins_key_or_in_debug_it_starts() -> None:
    keyed = start(SECRET_KEY="a secret", DEBUG="0", PLUGINS_ENCRYPTION_KEY="a plugins key")
    assert keyed.returncode == 0, keyed.stderr
    assert "started" in keyed.stdout
    debug = start(DEBUG="1")
    assert debug.returncode == 0, debug.stderr


def test_a_proxy_header_given_as_an_http_header_name_is_refused() -> None:
    base = {"SECRET_KEY": "a secret", "DEBUG": "0", "PLUGINS_ENCRYPTION_KEY": "a plugins key"}
    refused = start(**base, SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto")
    assert refused.returncode != 0
    assert "SECURE_PROXY_SSL_HEADER names a request.META key" in refused.stderr
    accepted = start(**base, SECURE_PROXY_SSL_HEADER="HTTP_X_FORWARDED_PROTO")
    assert accepted.returncode == 0, accepted.stderr


def test_on_a_redis_cluster_the_cache_and_celery_must_name_a_plain_redis() -> None:
    base = {
        "SECRET_KEY": "a secret",
        "DEBUG": "0",
        "PLUGINS_ENCRYPTION_KEY": "a plugins key",
        "REDIS_URL": "redis://10.0.0.5:7000",
        "REDIS_CLUSTER": "1",
    }
    refused = start(**base, CELERY_BROKER_URL="redis://10.0.0.9/1")
    assert refused.returncode != 0
    assert "ImproperlyConfigured: REDIS_CLUSTER=1 needs CACHE_REDIS_URL" in refused.stderr
    plain = "redis://10.0.0.9:6379/1"
    names = ("CACHE_REDIS_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND")
    started = start(**base, **dict.fromkeys(names, plain))
    assert started.returncode == 0, started.stderr
    assert "started" in started.stdout
