"""Imports run by a real Celery worker (real Redis broker, test database): the upload is
queued after commit, the worker reads it from Postgres and writes the conversations, and the
owner reads the progress from the API."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from rest_framework.test import APIClient

from conversations.models import Conversation, ImportJob

from . import chatgpt_samples
from .celery_worker import live_celery_worker, wait_until  # noqa: F401 (a fixture)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("live_celery_worker")
def test_an_upload_is_imported_by_the_worker_and_its_progress_ends_done(
    api_client: APIClient, user: Any, settings: Any
) -> None:
    settings.IMPORT_CHUNK_BYTES = 4096  # the file in several pieces
    data = json.dumps([chatgpt_samples.small(f"Chat {n}", f"Q{n}", f"A{n}") for n in range(30)])
    upload = io.BytesIO(data.encode())
    upload.name = "conversations.json"

    created = api_client.post("/api/v1/imports", {"file": upload}, format="multipart")
    assert created.status_code == 202, created.content
    job_id = created.json()["id"]

    seen = wait_until(
        lambda: (
            (body := api_client.get(f"/api/v1/imports/{job_id}").json())["status"]
            in ("done", "failed")
            and body
        )
    )
    assert seen  # (wait_until returns what held)
    assert (seen["status"], seen["total"], seen["done"], seen["imported"]) == ("done", 30, 30, 30)
    assert Conversation.objects.filter(owner=user).count() == 30
    assert not ImportJob.objects.get(pk=job_id).chunks.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("live_celery_worker")
def test_a_malformed_upload_fails_on_the_worker_with_nothing_written(
    api_client: APIClient, user: Any
) -> None:
    upload = io.BytesIO(json.dumps([chatgpt_samples.sourdough(), {"mapping": 3}]).encode())
    upload.name = "conversations.json"
    job_id = api_client.post("/api/v1/imports", {"file": upload}, format="multipart").json()["id"]

    seen = wait_until(
        lambda: (
            (body := api_client.get(f"/api/v1/imports/{job_id}").json())["status"]
            in ("done", "failed")
            and body
        )
    )
    assert seen  # (wait_until returns what held)
    assert seen["status"] == "failed"
    assert seen["error"]["code"] == "import_wrong_shape"
    assert seen["error"]["detail"] == {"conversation": 1}
    assert not Conversation.objects.filter(owner=user).exists()
