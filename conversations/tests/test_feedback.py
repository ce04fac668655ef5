"""Feedback on answers: thumbs up or down with an optional reason, one per user and answer,
changeable and removable; and the staff's report per model and pool in the admin."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.tests.factories import UserFactory
from chatsite.errors import ServiceError
from chatsite.testing import assert_error
from conversations.models import Conversation, Feedback, Message
from conversations.selectors import FeedbackRow, feedback_report
from conversations.services import (
    feedback_remove,
    feedback_set,
    message_regenerate,
    message_send,
)
from inference.models import Generation, ModelPool

from .factories import ConversationFactory, exchange, finish, sent

pytestmark = pytest.mark.django_db


@pytest.fixture
def conversation(user: Any) -> Conversation:
    return ConversationFactory.create(owner=user, title="Questions")


@pytest.fixture
def answer(conversation: Conversation) -> Message:
    return exchange(conversation, "Why is the sky blue?", answer="Rayleigh scattering.")[1]


def url(message: Message) -> str:
    return f"/api/v1/conversations/{message.conversation_id}/messages/{message.pk}/feedback"


def test_feedback_is_one_per_user_and_answer_and_can_change_and_go(
    answer: Message, user: Any
) -> None:
    first = feedback_set(message=answer, user=user, rating="up")
    changed = feedback_set(
        message=answer, user=user, rating="down", reason="inaccurate", comment="  Too vague. "
    )

    assert changed.pk == first.pk
    stored = Feedback.objects.get(message=answer)
    assert (stored.rating, stored.reason, stored.comment) == ("down", "inaccurate", "Too vague.")
    feedback_set(message=answer, user=user, rating="up")
    assert Feedback.objects.get(message=answer).reason == ""
    assert feedback_remove(message=answer, user=user) is True
    assert feedback_remove(message=answer, user=user) is False
    assert not Feedback.objects.exists()


@pytest.mark.parametrize(
    ("rating", "reason", "comment", "code"),
    [
        ("sideways", "", "", "invalid_rating"),
        ("", "", "", "invalid_rating"),
        ("up", "inaccurate", "", "invalid_reason"),
        ("down", "boring", "", "invalid_reason"),
        ("down", "", "x" * 501, "comment_too_long"),
    ],
)
def test_malformed_feedback_is_refused(
    answer: Message, user: Any, rating: str, reason: str, comment: str, code: str
) -> None:
    with pytest.raises(ServiceError) as caught:
        feedback_set(message=answer, user=user, rating=rating, reason=reason, comment=comment)
    assert caught.value.code == code
    assert not Feedback.objects.exists()


def test_only_a_finished_answer_takes_feedback(conversation: Conversation, user: Any) -> None:
    question, placeholder = sent(message_send(conversation=conversation, content="Hello?"))

    with pytest.raises(ServiceError) as on_question:
        feedback_set(message=question, user=user, rating="up")
    with pytest.raises(ServiceError) as on_queued:
        feedback_set(message=placeholder, user=user, rating="up")

    assert on_question.value.code == "not_an_assistant_message"
    assert (on_queued.value.code, on_queued.value.status) == ("not_a_finished_answer", 409)
    finish(placeholder, "Hi.")
    assert feedback_set(message=placeholder, user=user, rating="up").rating == "up"


def test_the_api_sets_changes_shows_and_removes_feedback(
    api_client: APIClient, answer: Message, conversation: Conversation
) -> None:
    given = api_client.put(url(answer), {"rating": "down", "reason": "unhelpful"}, format="json")
    assert given.status_code == 200, given.content
    assert given.json()["rating"] == "down" and given.json()["reason"] == "unhelpful"

    detail = api_client.get(f"/api/v1/conversations/{conversation.pk}").json()
    shown = {m["id"]: m["feedback"] for m in detail["messages"] if m["role"] != "system"}
    assert shown[str(answer.pk)] == {"rating": "down", "reason": "unhelpful", "comment": ""}
    assert shown[str(answer.parent_id)] is None

    changed = api_client.put(url(answer), {"rating": "up"}, format="json")
    assert changed.json()["rating"] == "up" and Feedback.objects.count() == 1
    assert api_client.delete(url(answer)).status_code == 204
    assert not Feedback.objects.exists()
    assert_error(api_client.put(url(answer), {"rating": 1}, format="json"), 400, "invalid_rating")
    assert_error(api_client.put(url(answer), {}, format="json"), 400, "missing_field")


def test_feedback_on_someone_elses_answer_is_404(
    api_client: APIClient, user: Any, other_user: Any
) -> None:
    theirs = ConversationFactory.create(owner=other_user)
    their_answer = exchange(theirs, "private")[1]
    feedback_set(message=their_answer, user=other_user, rating="up")
    mine = ConversationFactory.create(owner=user)
    exchange(mine, "mine")
    # Their answer under my conversation's URL: 404 as well.
    mixed = f"/api/v1/conversations/{mine.pk}/messages/{their_answer.pk}/feedback"

    for target in (url(their_answer), mixed):
        assert_error(api_client.put(target, {"rating": "down"}, format="json"), 404, "not_found")
        assert_error(api_client.delete(target), 404, "not_found")
    assert Feedback.objects.get(message=their_answer).rating == "up"


def test_session_feedback_needs_the_csrf_token(session_client: APIClient, answer: Message) -> None:
    refused = session_client.put(url(answer), {"rating": "up"}, format="json")
    assert_error(refused, 403, "permission_denied")
    assert not Feedback.objects.exists()

    session_client.get("/")
    token = session_client.cookies["csrftoken"].value
    given = session_client.put(url(answer), {"rating": "up"}, format="json", HTTP_X_CSRFTOKEN=token)
    assert given.status_code == 200
    assert_error(session_client.delete(url(answer)), 403, "permission_denied")
    assert session_client.delete(url(answer), HTTP_X_CSRFTOKEN=token).status_code == 204


# The staff's report

BIG = "big-model"


def generated(
    conversation: Conversation,
    placeholder: Message,
    text: str,
    *,
    pool: ModelPool,
    served: ModelPool | None = None,
) -> Message:
    """Record the generation that wrote `placeholder`, as the inference plane does."""
    Generation.objects.create(
        message=placeholder,
        conversation=conversation,
        user=conversation.owner,
        pool=pool,
        served_pool=served,
        tier="free",
        priority=0,
        max_tokens=100,
        status=Generation.Status.COMPLETE,
    )
    if served is not None:
        Message.objects.filter(pk=placeholder.pk).update(model=served.name)
        placeholder.refresh_from_db()
    return finish(placeholder, text)


@pytest.fixture
def seeded(user: Any, default_pool: ModelPool) -> None:
    """Five answers of the default model in the period (two regenerated once, one of them
    after a tool round) and one the overload policy sent to the big pool; one more answer 40
    days old; one without a generation (written whole, as `/v1` history is)."""
    big = ModelPool.objects.create(name=BIG, served_model=BIG)
    conversation = ConversationFactory.create(owner=user)

    def ask(content: str, **kwargs: Any) -> Message:
        _, placeholder = sent(message_send(conversation=conversation, content=content))
        return generated(conversation, placeholder, f"Re: {content}", pool=default_pool, **kwargs)

    first = ask("one")
    again = message_regenerate(message=first).placeholder
    again = generated(conversation, again, "Re: one, again", pool=default_pool)
    second = ask("two")
    # An answer after a tool round hangs under the tool's result; asked again, the new answer
    # starts under the question.
    question, placeholder = sent(message_send(conversation=conversation, content="weather?"))
    caller = Message.objects.create(
        conversation=conversation,
        parent=question,
        role=Message.Role.ASSISTANT,
        metadata={"tool_calls": [{"id": "1", "function": {"name": "w", "arguments": "{}"}}]},
    )
    result = Message.objects.create(
        conversation=conversation, parent=caller, role=Message.Role.TOOL, content="sunny"
    )
    Message.objects.filter(pk=placeholder.pk).update(parent=result)
    placeholder.refresh_from_db()
    after_tools = generated(conversation, placeholder, "Sunny.", pool=default_pool)
    asked_again = message_regenerate(message=after_tools).placeholder
    assert asked_again.parent_id == question.pk
    generated(conversation, asked_again, "Sunny, still.", pool=default_pool)
    routed = ask("three", served=big)
    old = ask("four")
    Message.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=40))
    exchange(conversation, "five")  # no generation: not an answer the report counts

    for message, rating in ((first, "down"), (again, "up"), (second, "up"), (routed, "down")):
        feedback_set(message=message, user=user, rating=rating)
    feedback_set(message=old, user=user, rating="up")


def test_the_report_counts_answers_regenerations_and_thumbs_per_model_and_pool(
    seeded: None,
) -> None:
    now = timezone.now()

    rows = feedback_report(since=now - timedelta(days=30), until=now + timedelta(minutes=1))

    model = settings.DEFAULT_MODEL
    assert rows == [
        FeedbackRow(model=BIG, pool=BIG, answers=1, regenerated=0, thumbs_up=0, thumbs_down=1),
        FeedbackRow(model=model, pool=model, answers=5, regenerated=2, thumbs_up=2, thumbs_down=1),
    ]
    assert rows[1].regenerate_rate == pytest.approx(2 / 5)
    everything = feedback_report(since=now - timedelta(days=60), until=now + timedelta(days=1))
    assert everything[1] == FeedbackRow(
        model=model, pool=model, answers=6, regenerated=2, thumbs_up=3, thumbs_down=1
    )
    assert feedback_report(since=now + timedelta(days=1), until=now + timedelta(days=2)) == []


REPORT = "/admin/conversations/feedback/report/"


def compact(html: str) -> str:
    return re.sub(r">\s+<", "><", html)


def staff_client(*permissions: str) -> Client:
    staff = UserFactory.create(is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(codename__in=permissions))
    client = Client()
    client.force_login(staff)
    return client


def test_staff_without_the_view_permission_on_feedback_get_403(seeded: None) -> None:
    client = staff_client("view_conversation")

    assert client.get(REPORT).status_code == 403
    assert client.get("/admin/conversations/feedback/").status_code == 403


def test_staff_with_the_view_permission_see_the_report_with_its_figures(seeded: None) -> None:
    client = staff_client("view_feedback")

    response = client.get(REPORT)
    listing = client.get("/admin/conversations/feedback/")

    assert response.status_code == 200
    html = compact(response.content.decode())
    model = settings.DEFAULT_MODEL
    assert (
        f"<td>{model}</td><td>{model}</td><td>5</td><td>2</td><td>40&nbsp;%</td>"
        "<td>2</td><td>1</td>"
    ) in html
    assert (
        f"<td>{BIG}</td><td>{BIG}</td><td>1</td><td>0</td><td>0&nbsp;%</td><td>0</td><td>1</td>"
        in html
    )
    assert listing.status_code == 200 and REPORT in listing.content.decode()
    assert f'<td class="field-answer_model">{BIG}</td>' in listing.content.decode()
    # A chosen period: the 40-day-old answer counts too.
    today = timezone.now().date()
    since = (today - timedelta(days=60)).isoformat()
    wider = compact(client.get(REPORT, {"since": since}).content.decode())
    assert f"<td>{model}</td><td>{model}</td><td>6</td><td>2</td><td>33&nbsp;%</td>" in wider
    backwards = client.get(REPORT, {"since": today.isoformat(), "until": since})
    assert "The period ends before it starts." in backwards.content.decode()
