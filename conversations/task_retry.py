"""The retry policy of conversations' Celery tasks, in a module of its own so that a task
module low in the app (attachment_tasks, portability.tasks) shares it without importing the
tasks that need the app's services."""

from __future__ import annotations

from typing import Any

import httpx
from django.db import InterfaceError, OperationalError
from redis.exceptions import RedisError

from inference.client import WorkerFault

RETRYABLE = (WorkerFault, httpx.HTTPError, OperationalError, InterfaceError, RedisError)
RETRY_POLICY: dict[str, Any] = {
    "autoretry_for": RETRYABLE,
    "retry_backoff": 2,
    "retry_backoff_max": 120,
    "retry_jitter": True,
    "max_retries": 5,
    "acks_late": True,
    "ignore_result": True,
}
