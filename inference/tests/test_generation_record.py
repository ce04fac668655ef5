"""What Postgres learns of a generation's run: the admission and first token in one write
beside the answer (`generation_mark_started`), and the same facts with the final state, so
that an answer ending before that write, or overtaking it, loses none of them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from inference import services
from inference.models import Generation, Worker

from .fixtures import register_pool, send_turn

pytestmark = pytest.mark.django_db


@pytest.fixture
def worker() -> Worker:
    pool = register_pool()
    return Worker.objects.create(
        pool=pool, name="w", url="http://127.0.0.1:9", state=Worker.State.HEALTHY
    )


def test_the_first_token_marks_it_running_once(user: Any, worker: Worker) -> None:
    generation = send_turn(user).generation
    admitted = timezone.now() - timedelta(seconds=2)
    first = timezone.now() - timedelta(seconds=1)
    services.generation_mark_started(
        generation_id=generation.pk,
        admission=services.Admission(
            worker_id=worker.pk, attempt=1, admitted_at=admitted, first_token_at=first
        ),
    )
    # A retry elsewhere: its own worker and admission, the answer's first token kept.
    services.generation_mark_started(
        generation_id=generation.pk,
        admission=services.Admission(
            worker_id=worker.pk, attempt=2, admitted_at=first, first_token_at=timezone.now()
        ),
    )

    generation.refresh_from_db()
    assert generation.status == Generation.Status.RUNNING
    assert (generation.worker_id, generation.attempts) == (worker.pk, 2)
    assert generation.admitted_at == first and generation.first_token_at == first
    assert generation.message.status == "streaming"


def test_the_final_state_carries_an_admission_never_written(user: Any, worker: Worker) -> None:
    generation = send_turn(user).generation
    admitted = timezone.now()

    services.generation_finish(
        generation_id=generation.pk,
        status=Generation.Status.FAILED,
        text="",
        finish_reason="error",
        error_code="worker_error",
        admission=services.Admission(worker_id=worker.pk, attempt=1, admitted_at=admitted),
    )

    generation.refresh_from_db()
    assert generation.status == Generation.Status.FAILED
    assert (generation.worker_id, generation.attempts) == (worker.pk, 1)
    assert generation.admitted_at == admitted and generation.first_token_at is None


def test_a_late_first_token_write_leaves_a_final_state_alone(user: Any, worker: Worker) -> None:
    generation = send_turn(user).generation
    services.generation_finish(
        generation_id=generation.pk,
        status=Generation.Status.CANCELLED,
        text="",
        finish_reason="cancelled",
    )

    services.generation_mark_started(
        generation_id=generation.pk,
        admission=services.Admission(
            worker_id=worker.pk,
            attempt=1,
            admitted_at=timezone.now(),
            first_token_at=timezone.now(),
        ),
    )

    generation.refresh_from_db()
    assert generation.status == Generation.Status.CANCELLED
    assert generation.worker_id is None and generation.first_token_at is None
    assert generation.message.status == "cancelled"
