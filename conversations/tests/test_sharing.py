"""Share links: a snapshot of the branch on screen, served read-only to anyone holding the
link, listed and revoked by its owner, gone with its conversation."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import pytest
from django.test import Client, override_settings
from rest_framework.test import APIClient

from accounts.tests.factories import UserFactory
from chatsite.errors import NotFound, ServiceError
from chatsite.testing import assert_error
from conversations.models import Conversation, Message, Share
from conversations.removal import conversation_remove
from conversations.selectors import shared_snapshot
from conversations.services import (
    branch_switch,
    message_edit,
    message_regenerate,
    message_send,
    share_create,
    share_revoke,
)
from conversations.share_tokens import share_id_from_token, share_token

from .factories import ConversationFactory, exchange, finish, sent

pytestmark = pytest.mark.django_db


@pytest.fixture
def conversation(user: Any) -> Conversation:
    conversation = ConversationFactory.create(owner=user, title="Trip to Lisbon")
    exchange(conversation, "Where to eat?", answer="Try **pastéis** de nata.")
    exchange(conversation, "And to see?", answer="The Alfama.")
    return conversation


def snapshot_texts(share: Share) -> list[tuple[str, str]]:
    return [(message["role"], message["content"]) for message in share.messages]


def path_of(share: Share) -> str:
    return f"/s/{share_token(share_id=share.pk)}"


def test_a_share_copies_the_branch_on_screen(conversation: Conversation) -> None:
    share = share_create(conversation=conversation)

    assert share.title == "Trip to Lisbon"
    assert snapshot_texts(share) == [
        ("user", "Where to eat?"),
        ("assistant", "Try **pastéis** de nata."),
        ("user", "And to see?"),
        ("assistant", "The Alfama."),
    ]
    assert [m["model"] for m in share.messages] == ["", conversation.model, "", conversation.model]
    stored = Message.objects.get(content="The Alfama.")
    assert share.messages[3]["created_at"] == stored.created_at.isoformat()


def test_later_edits_regenerations_and_branch_switches_leave_a_share_as_it_was(
    conversation: Conversation,
) -> None:
    share = share_create(conversation=conversation)
    before = snapshot_texts(share)
    question = Message.objects.get(content="And to see?")
    answer = Message.objects.get(content="The Alfama.")

    finish(message_regenerate(message=answer).placeholder, "Belém.")
    finish(sent(message_edit(message=question, content="And to drink?"))[1], "Ginjinha.")
    branch_switch(message=answer)
    Message.objects.filter(pk=answer.pk).update(content="rewritten")

    assert snapshot_texts(Share.objects.get(pk=share.pk)) == before
    newer = share_create(conversation=conversation)
    assert snapshot_texts(newer)[-1] == ("assistant", "rewritten")


def test_a_share_leaves_out_tool_rounds_unfinished_failed_and_withheld_answers(
    user: Any,
) -> None:
    conversation = ConversationFactory.create(owner=user, title="Tools")
    question, placeholder = sent(message_send(conversation=conversation, content="Weather?"))
    caller = Message.objects.create(
        conversation=conversation,
        parent=question,
        role=Message.Role.ASSISTANT,
        content="Let me look.",
        metadata={"tool_calls": [{"id": "1", "function": {"name": "w", "arguments": "{}"}}]},
    )
    tool = Message.objects.create(
        conversation=conversation, parent=caller, role=Message.Role.TOOL, content="secret"
    )
    Message.objects.filter(pk=placeholder.pk).update(parent=tool)
    placeholder.refresh_from_db()
    finish(placeholder, "Sunny.")
    assert snapshot_texts(share_create(conversation=conversation)) == [
        ("user", "Weather?"),
        ("assistant", "Sunny."),
    ]

    for status in (Message.Status.FAILED, Message.Status.BLOCKED, Message.Status.STREAMING):
        Message.objects.filter(pk=placeholder.pk).update(status=status)
        assert snapshot_texts(share_create(conversation=conversation)) == [("user", "Weather?")]


def test_a_conversation_without_messages_cannot_be_shared(user: Any) -> None:
    with pytest.raises(ServiceError) as caught:
        share_create(conversation=ConversationFactory.create(owner=user))
    assert caught.value.code == "nothing_to_share"


def test_a_token_is_the_id_and_its_hmac_and_nothing_else_opens_the_share(
    conversation: Conversation,
) -> None:
    share = share_create(conversation=conversation)
    token = share_token(share_id=share.pk)

    assert re.fullmatch(r"[0-9a-f]{64}", token) and token.startswith(share.pk.hex)
    assert token not in str(Share.objects.filter(pk=share.pk).values().get())
    assert share_id_from_token(token=token) == share.pk
    assert shared_snapshot(token=token).pk == share.pk
    forged = share.pk.hex + ("0" * 32 if token[32:] != "0" * 32 else "1" * 32)
    for bad in (forged, token.upper(), token[:-1], token + "0", "", "../" + token):
        assert share_id_from_token(token=bad) is None
        with pytest.raises(NotFound):
            shared_snapshot(token=bad)
    # Another key signs differently; a key being rotated out still opens the links.
    with override_settings(SECRET_KEY="another-key"):
        assert share_id_from_token(token=token) is None
    with override_settings(SECRET_KEY="another-key", SECRET_KEY_FALLBACKS=["test-only-secret-key"]):
        assert share_id_from_token(token=token) == share.pk


def test_the_shared_page_is_served_to_a_logged_out_visitor_without_owner_data(
    conversation: Conversation, user: Any
) -> None:
    share = share_create(conversation=conversation)

    response = Client().get(path_of(share))

    assert response.status_code == 200
    assert response["X-Robots-Tag"] == "noindex, nofollow"
    assert response["Referrer-Policy"] == "no-referrer"
    assert response["Cache-Control"] == "no-store"
    assert "script-src 'self'" in response["Content-Security-Policy"]
    html = response.content.decode()
    assert '<meta name="robots" content="noindex, nofollow">' in html
    assert "Trip to Lisbon" in html and "The Alfama." in html
    assert '<script id="shared-data" type="application/json">' in html
    for owner_data in (user.username, user.email, str(conversation.pk)):
        assert owner_data not in html
    found = re.search(r'id="shared-data" type="application/json">(.*?)</script>', html)
    assert found is not None
    data = json.loads(found[1])
    assert set(data) == {"title", "createdAt", "messages"}
    assert {key for message in data["messages"] for key in message} == {
        "role",
        "content",
        "model",
        "created_at",
    }
    # No inline script: the only scripts are the data block and the module file.
    scripts = re.findall(r"<script([^>]*)>", html)
    assert all("src=" in attrs or 'type="application/json"' in attrs for attrs in scripts)


def test_markup_in_a_message_reaches_the_page_only_as_escaped_json(user: Any) -> None:
    conversation = ConversationFactory.create(owner=user, title="<script>alert(1)</script>")
    exchange(conversation, "<script>alert(2)</script>", answer="<img src=x onerror=alert(3)>")
    share = share_create(conversation=conversation)

    html = Client().get(path_of(share)).content.decode()

    assert "<script>alert" not in html and "<img src=x" not in html
    assert "\\u003Cscript\\u003Ealert(2)" in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_a_revoked_share_and_a_deleted_conversations_share_are_404(
    conversation: Conversation, user: Any
) -> None:
    revoked = share_create(conversation=conversation)
    kept = share_create(conversation=conversation)
    share_revoke(share=revoked)
    share_revoke(share=revoked)  # again: nothing changes

    assert Client().get(path_of(revoked)).status_code == 404
    assert Client().get(path_of(kept)).status_code == 200
    assert Client().get("/s/not-a-token").status_code == 404
    assert Client().get(f"/s/{uuid.uuid4().hex}{'a' * 32}").status_code == 404

    conversation_remove(conversation=conversation)
    assert Client().get(path_of(kept)).status_code == 404
    assert not Share.objects.filter(conversation=conversation).exists()


def test_dropping_a_conversation_drops_its_shares(conversation: Conversation) -> None:
    share = share_create(conversation=conversation)
    conversation_remove(conversation=conversation, keep_tombstone=False)
    assert not Share.objects.filter(pk=share.pk).exists()


# The API

SHARES = "/api/v1/shares"


def test_the_owner_creates_lists_and_revokes_shares_over_the_api(
    api_client: APIClient, conversation: Conversation, user: Any
) -> None:
    other = ConversationFactory.create(owner=user, title="Other")
    exchange(other, "hi")

    created = api_client.post(f"/api/v1/conversations/{conversation.pk}/shares")
    api_client.post(f"/api/v1/conversations/{other.pk}/shares")

    assert created.status_code == 201, created.content
    body = created.json()
    assert body["title"] == "Trip to Lisbon" and body["revoked"] is False
    assert body["url"].startswith("http://testserver/s/")
    assert Client().get(body["url"].removeprefix("http://testserver")).status_code == 200

    listed = api_client.get(SHARES).json()["results"]
    assert [s["title"] for s in listed] == ["Other", "Trip to Lisbon"]
    assert listed[1]["url"] == body["url"]  # the same link, copied again
    only = api_client.get(SHARES, {"conversation_id": str(conversation.pk)}).json()["results"]
    assert [s["id"] for s in only] == [body["id"]]

    revoked = api_client.post(f"{SHARES}/{body['id']}/revoke")
    assert revoked.status_code == 200 and revoked.json()["revoked"] is True
    assert api_client.get(SHARES).json()["results"][1]["revoked"] is True
    assert Client().get(body["url"].removeprefix("http://testserver")).status_code == 404


def test_someone_elses_conversation_and_share_are_404(
    api_client: APIClient, other_user: Any
) -> None:
    theirs = ConversationFactory.create(owner=other_user)
    exchange(theirs, "private")
    share = share_create(conversation=theirs)

    assert_error(api_client.post(f"/api/v1/conversations/{theirs.pk}/shares"), 404, "not_found")
    assert_error(api_client.post(f"{SHARES}/{share.pk}/revoke"), 404, "not_found")
    assert_error(api_client.get(SHARES, {"conversation_id": str(theirs.pk)}), 404, "not_found")
    assert api_client.get(SHARES).json()["results"] == []
    assert Share.objects.get(pk=share.pk).revoked_at is None
    assert Share.objects.filter(conversation=theirs).count() == 1


def test_sharing_an_empty_or_deleted_conversation_is_refused(
    api_client: APIClient, user: Any, conversation: Conversation
) -> None:
    empty = ConversationFactory.create(owner=user)
    assert_error(
        api_client.post(f"/api/v1/conversations/{empty.pk}/shares"), 400, "nothing_to_share"
    )
    conversation_remove(conversation=conversation)
    assert_error(
        api_client.post(f"/api/v1/conversations/{conversation.pk}/shares"),
        400,
        "conversation_deleted",
    )
    assert_error(
        api_client.get(SHARES, {"conversation_id": "nope"}), 400, "invalid_conversation_id"
    )


def test_session_share_writes_need_the_csrf_token(
    session_client: APIClient, conversation: Conversation
) -> None:
    url = f"/api/v1/conversations/{conversation.pk}/shares"
    refused = session_client.post(url)
    assert_error(refused, 403, "permission_denied")
    assert not Share.objects.exists()

    session_client.get("/")
    token = session_client.cookies["csrftoken"].value
    created = session_client.post(url, HTTP_X_CSRFTOKEN=token)
    assert created.status_code == 201
    share_id = created.json()["id"]
    assert_error(session_client.post(f"{SHARES}/{share_id}/revoke"), 403, "permission_denied")
    assert session_client.post(f"{SHARES}/{share_id}/revoke", HTTP_X_CSRFTOKEN=token).json()[
        "revoked"
    ]


def test_listing_shares_stays_within_its_query_budget(
    api_client: APIClient, conversation: Conversation, django_assert_max_num_queries: Any
) -> None:
    for _ in range(5):
        share_create(conversation=conversation)
    api_client.get(SHARES)  # the key's first use of the day is written once
    # The key, then the shares (their snapshots left unread).
    with django_assert_max_num_queries(2):
        response = api_client.get(SHARES)
    assert len(response.json()["results"]) == 5


def test_staff_see_shares_read_only_in_the_admin(conversation: Conversation) -> None:
    share = share_create(conversation=conversation)
    staff = Client()
    staff.force_login(UserFactory.create(is_staff=True, is_superuser=True))

    listing = staff.get("/admin/conversations/share/")
    page = staff.get(f"/admin/conversations/share/{share.pk}/change/")

    assert listing.status_code == 200 and "Share of Trip to Lisbon" in listing.content.decode()
    assert page.status_code == 200 and "The Alfama." in page.content.decode()
    assert share_token(share_id=share.pk) not in page.content.decode()
    assert staff.post(f"/admin/conversations/share/{share.pk}/delete/").status_code == 403


def test_shares_from_one_address_are_rate_limited(
    api_client: APIClient, conversation: Conversation, settings: Any
) -> None:
    settings.BILLING_ABUSE_RATES = {**settings.BILLING_ABUSE_RATES, "share_create": "2/h"}
    url = f"/api/v1/conversations/{conversation.pk}/shares"

    statuses = [api_client.post(url).status_code for _ in range(2)]
    refused = api_client.post(url)

    assert statuses == [201, 201]
    assert_error(refused, 429, "rate_limited")
    assert Share.objects.count() == 2
