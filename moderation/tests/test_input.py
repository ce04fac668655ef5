"""Input moderation and sanctions on the request path: a blocked message is refused before
anything is written, reserved or queued, and leaves a flag; a suspended account is refused
every send."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from billing import quota
from billing.models import UsageEvent
from billing.selectors import default_plan
from chatsite.redis import sync_redis
from chatsite.testing import assert_error
from conversations.models import Conversation, Message
from conversations.turns import turn_send
from inference import queue
from inference.models import Generation, ModelPool
from moderation import services
from moderation.models import AuditEntry, Flag, Sanction

from .helpers import API, BENIGN, HARMFUL, INSULT, finish_all, send

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_blocked_input_is_refused_costs_nothing_and_leaves_a_flag(
    api_client: APIClient, user: User, conversation: Conversation
) -> None:
    messages_before = Message.objects.filter(conversation=conversation).count()

    response = send(api_client, conversation, HARMFUL)

    error = assert_error(response, 400, "content_blocked")
    assert error["detail"]["categories"] == ["S9"]
    assert "S9 Indiscriminate Weapons" in error["message"]
    # Nothing written, nothing queued, nothing reserved or charged.
    assert Message.objects.filter(conversation=conversation).count() == messages_before
    assert not Generation.objects.filter(user=user).exists()
    assert sync_redis().zcard(queue.queue_key(conversation.model, "free")) == 0
    assert quota.concurrency_in_use(user_id=user.pk, now=quota.now_ms()) == 0
    assert not UsageEvent.objects.filter(user=user).exists()
    # The flag survived the refusal (this test runs without a wrapping transaction).
    flag = Flag.objects.get(user=user)
    assert flag.direction == Flag.Direction.INPUT
    assert flag.action == Flag.Action.BLOCKED
    assert flag.status == Flag.Status.OPEN
    assert flag.conversation_id == conversation.pk and flag.message_id is None
    assert flag.excerpt == HARMFUL
    assert flag.categories == ["S9"] and flag.scores["S9"] == 1.0
    assert flag.backend == "local"


def test_a_blocked_v1_request_leaves_a_flag_and_no_conversation(
    user: User, pool: ModelPool
) -> None:
    from django.test import Client

    from accounts.services import api_key_create

    client = Client(HTTP_AUTHORIZATION=f"Bearer {api_key_create(user=user, name='t')[1]}")
    body = {"model": pool.name, "messages": [{"role": "user", "content": HARMFUL}]}

    response = client.post("/v1/chat/completions", body, "application/json")

    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "content_blocked"
    # The conversation would have been written with the turn: there is none, and nothing
    # was queued or reserved; the flag survives, pointing at no conversation.
    assert not Conversation.objects.filter(owner=user).exists()
    assert not Generation.objects.filter(user=user).exists()
    assert quota.concurrency_in_use(user_id=user.pk, now=quota.now_ms()) == 0
    flag = Flag.objects.get(user=user)
    assert (flag.direction, flag.action) == (Flag.Direction.INPUT, Flag.Action.BLOCKED)
    assert flag.conversation_id is None and flag.excerpt == HARMFUL


def test_an_edit_into_blocked_text_is_refused(
    api_client: APIClient, user: User, conversation: Conversation
) -> None:
    turn = turn_send(user=user, conversation=conversation, content=BENIGN)
    assert turn.user_message is not None
    finish_all(user)

    response = api_client.post(
        f"{API}/{conversation.pk}/messages/{turn.user_message.pk}/edit",
        {"content": INSULT},
        format="json",
    )

    assert_error(response, 400, "content_blocked")
    assert Generation.objects.filter(user=user).count() == 1
    assert Flag.objects.get(user=user).categories == ["harassment"]


def test_benign_text_with_tricky_words_goes_through(
    api_client: APIClient, user: User, conversation: Conversation
) -> None:
    for text in (BENIGN, "My cousin lives in Scunthorpe.", "Shoot a portrait in low light?"):
        response = send(api_client, conversation, text)
        assert response.status_code == 201, (text, response.content)
        finish_all(user)
    assert not Flag.objects.exists()


def test_a_review_level_input_is_sent_and_flagged_with_its_message(
    api_client: APIClient, user: User, conversation: Conversation
) -> None:
    # Profanity addressed to someone scores as harassment below the block threshold.
    response = send(api_client, conversation, "My code is a fucking mess, can you help?")

    assert response.status_code == 201, response.content
    flag = Flag.objects.get(user=user)
    assert flag.action == Flag.Action.REVIEW
    assert flag.categories == ["harassment"]
    assert str(flag.message_id) == response.json()["user_message"]["id"]


def test_thresholds_change_behaviour(
    api_client: APIClient, user: User, staff: User, conversation: Conversation
) -> None:
    # Casual swearing passes by default (profanity neither blocks nor asks for review)...
    assert send(api_client, conversation, "Holy shit, this pizza is good.").status_code == 201
    finish_all(user)
    # ...until staff make profanity block at a low score.
    services.threshold_set(category="profanity", block_at=0.5, review_at=None, by=staff)
    assert_error(
        send(api_client, conversation, "Holy shit, this pizza is good."), 400, "content_blocked"
    )
    # And a category staff switch off no longer blocks.
    services.threshold_set(category="S9", block_at=None, review_at=None, by=staff)
    assert send(api_client, conversation, HARMFUL).status_code == 201
    changes = AuditEntry.objects.filter(action=AuditEntry.Action.THRESHOLD_CHANGED, actor=staff)
    assert changes.count() == 2


def test_a_staff_rule_blocks_at_once(
    api_client: APIClient, user: User, staff: User, conversation: Conversation
) -> None:
    from moderation.models import Rule

    assert send(api_client, conversation, "Tell me about frobnicating widgets.").status_code == 201
    finish_all(user)
    services.rule_save(rule=Rule(category="S2", kind="term", pattern="frobnicating"), by=staff)

    error = assert_error(
        send(api_client, conversation, "Tell me about FROBNICATING widgets."),
        400,
        "content_blocked",
    )
    assert error["detail"]["categories"] == ["S2"]
    assert AuditEntry.objects.filter(action=AuditEntry.Action.RULE_CHANGED).count() == 1


def test_thresholds_and_rules_are_kept_per_process_until_staff_change_one(
    user: User, staff: User
) -> None:
    from moderation import selectors
    from moderation.engine import policy
    from moderation.models import Rule

    services.threshold_set(category="harassment", block_at=0.6, review_at=None, by=staff)
    first = policy()  # reads the thresholds and staff's rules, then keeps them
    with CaptureQueriesContext(connection) as later:
        assert policy().thresholds == first.thresholds
    assert len(later) == 0
    assert first.thresholds["harassment"] == selectors.Threshold(block=0.6, review=None)
    rule = services.rule_save(rule=Rule(category="S2", kind="term", pattern="zorbing"), by=staff)
    assert [kept.source for kept in selectors.staff_rules()] == [f"rule:{rule.pk}"]
    services.rule_delete(rule=rule, by=staff)
    assert selectors.staff_rules() == ()


@pytest.mark.parametrize("action", ["send", "edit", "regenerate"])
def test_a_suspended_user_is_refused_every_send_until_lifted(
    api_client: APIClient, user: User, staff: User, conversation: Conversation, action: str
) -> None:
    turn = turn_send(user=user, conversation=conversation, content=BENIGN)
    assert turn.user_message is not None
    finish_all(user)
    sanction = services.user_suspend(user=user, by=staff, hours=24, reason="spam")

    user_message = turn.user_message

    def attempt() -> Any:
        if action == "send":
            return send(api_client, conversation, BENIGN)
        if action == "edit":
            return api_client.post(
                f"{API}/{conversation.pk}/messages/{user_message.pk}/edit",
                {"content": BENIGN},
                format="json",
            )
        return api_client.post(
            f"{API}/{conversation.pk}/messages/{turn.assistant_message.pk}/regenerate"
        )

    error = assert_error(attempt(), 403, "account_suspended")
    assert sanction.ends_at is not None
    assert error["detail"]["until"] == sanction.ends_at.isoformat()
    assert sanction.ends_at.strftime("%Y-%m-%d") in error["message"]
    assert Generation.objects.filter(user=user).count() == 1

    services.sanction_lift(sanction=sanction, by=staff)
    assert attempt().status_code == 201
    assert AuditEntry.objects.filter(
        action=AuditEntry.Action.SANCTION_LIFTED, actor=staff, target_user=user
    ).exists()


def test_a_banned_user_is_refused_and_the_web_chat_session_too(
    session_client: APIClient, user: User, staff: User, conversation: Conversation
) -> None:
    services.user_ban(user=user, by=staff, reason="abuse")
    session_client.get("/")  # the CSRF cookie, as the page gets it
    token = session_client.cookies["csrftoken"].value

    response = send(session_client, conversation, BENIGN, HTTP_X_CSRFTOKEN=token)

    error = assert_error(response, 403, "account_banned")
    assert error["detail"]["until"] is None


@pytest.mark.usefixtures("own_catalog_version")
def test_a_ban_and_its_lifting_apply_at_once_though_standing_is_kept_per_process(
    api_client: APIClient, user: User, staff: User, conversation: Conversation
) -> None:
    default_plan()  # made by the first send otherwise: a catalog change, read again after
    # The first send keeps "no sanction" for this user in the process's catalog...
    assert send(api_client, conversation, BENIGN).status_code == 201
    finish_all(user)
    with CaptureQueriesContext(connection) as captured:
        assert send(api_client, conversation, BENIGN).status_code == 201
    assert not [q for q in captured.captured_queries if "moderation_sanction" in q["sql"]]
    finish_all(user)

    # ...which a sanction imposed or lifted drops at once.
    ban = services.user_ban(user=user, by=staff, reason="abuse")
    assert_error(send(api_client, conversation, BENIGN), 403, "account_banned")
    services.sanction_lift(sanction=ban, by=staff)
    assert send(api_client, conversation, BENIGN).status_code == 201


def test_an_expired_suspension_no_longer_refuses(
    api_client: APIClient, user: User, staff: User, conversation: Conversation
) -> None:
    sanction = services.user_suspend(user=user, by=staff, hours=1)
    # Refused, and the suspension kept per process; then it runs out (no change is signalled).
    assert_error(send(api_client, conversation, BENIGN), 403, "account_suspended")
    Sanction.objects.filter(pk=sanction.pk).update(ends_at=sanction.created_at)
    assert send(api_client, conversation, BENIGN).status_code == 201


def test_a_failing_backend_fails_open_or_closed_by_setting(
    api_client: APIClient, user: User, conversation: Conversation, settings: Any
) -> None:
    settings.MODERATION_BACKENDS = ["moderation.tests.test_backends.BrokenClassifier"]
    settings.MODERATION_FAIL_CLOSED = False
    assert send(api_client, conversation, BENIGN).status_code == 201
    finish_all(user)

    settings.MODERATION_FAIL_CLOSED = True
    error = assert_error(send(api_client, conversation, BENIGN), 503, "moderation_unavailable")
    assert error["detail"]["failed"] == ["broken"]
    assert Generation.objects.filter(user=user).count() == 1
