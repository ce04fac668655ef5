"""The stale-generation sweeper and answers whose conversation goes while it works: the sweep
returns quietly (no traceback, no retry) and writes nothing for them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from billing.models import UsageEvent
from chatsite.testing import run_task_quietly
from conversations.models import Conversation, Message
from conversations.removal import conversation_remove
from inference import services
from inference.models import Generation
from inference.tasks import sweep_stale_generations
from inference.tests.fixtures import register_pool, send_turn

pytestmark = pytest.mark.django_db


def _stale(user: Any) -> Any:
    """A turn whose answer no scheduler serves: queued long ago, its job never enqueued (the
    test's transaction never commits)."""
    register_pool()
    turn = send_turn(user)
    Generation.objects.filter(pk=turn.generation.pk).update(
        enqueued_at=timezone.now() - timedelta(minutes=5)
    )
    return turn


@pytest.mark.parametrize("keep_tombstone", [False, True], ids=["dropped", "tombstone"])
def test_the_sweeper_passes_over_an_answer_whose_conversation_goes_as_it_is_failed(
    user: Any,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    keep_tombstone: bool,
) -> None:
    turn = _stale(user)
    real_stream_text = services._stream_text
    removed: list[str] = []

    def removed_meanwhile(redis: Any, generation_id: str) -> str:
        # Between the sweep's listing of the generation and its final write.
        conversation = Conversation.objects.get(pk=turn.conversation.pk)
        conversation_remove(conversation=conversation, keep_tombstone=keep_tombstone)
        removed.append(generation_id)
        return real_stream_text(redis, generation_id)

    monkeypatch.setattr(services, "_stream_text", removed_meanwhile)

    assert run_task_quietly(sweep_stale_generations, caplog=caplog) == 0
    assert removed == [str(turn.generation.pk)]
    assert not Generation.objects.exists()
    assert not Message.objects.filter(conversation=turn.conversation).exists()
    assert not UsageEvent.objects.exists()


def test_the_sweeper_fails_a_stale_answer_left_alone(user: Any) -> None:
    """The control of the test above: the same answer, its conversation kept, is failed."""
    turn = _stale(user)

    result = sweep_stale_generations.apply()
    assert result.state == "SUCCESS" and result.result == 1
    assert Generation.objects.get(pk=turn.generation.pk).status == Generation.Status.FAILED
