"""The staff console: conversations and messages are there to look at, not to rewrite."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from accounts.tests.factories import UserFactory
from conversations.models import BranchSummary, Conversation, Message

from .factories import ConversationFactory, exchange

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client() -> Client:
    client = Client()
    client.force_login(UserFactory.create(is_staff=True, is_superuser=True))
    return client


@pytest.fixture
def conversation(user: Any) -> Conversation:
    conversation = ConversationFactory.create(owner=user, title="Holiday plans")
    exchange(conversation, "Where should we go?", answer="Lisbon is lovely.")
    return conversation


def test_conversations_are_searchable_by_owner_and_title(
    staff_client: Client, conversation: Conversation, user: Any
) -> None:
    ConversationFactory.create(title="Unrelated")

    by_title = staff_client.get("/admin/conversations/conversation/", {"q": "holiday"})
    by_owner = staff_client.get("/admin/conversations/conversation/", {"q": user.email})

    for response in (by_title, by_owner):
        assert response.status_code == 200
        assert list(response.context["cl"].result_list) == [conversation]


def test_messages_are_searchable_and_filterable(
    staff_client: Client, conversation: Conversation
) -> None:
    by_content = staff_client.get("/admin/conversations/message/", {"q": "lisbon"})
    by_role = staff_client.get(
        "/admin/conversations/message/",
        {"role__exact": "user", "conversation__id__exact": str(conversation.pk)},
    )

    assert [m.content for m in by_content.context["cl"].result_list] == ["Lisbon is lovely."]
    assert [m.content for m in by_role.context["cl"].result_list] == ["Where should we go?"]


def test_the_conversation_page_is_read_only_and_links_to_its_messages(
    staff_client: Client, conversation: Conversation
) -> None:
    url = f"/admin/conversations/conversation/{conversation.pk}/change/"

    page = staff_client.get(url)
    post = staff_client.post(url, {"title": "Rewritten"})

    assert page.status_code == 200
    assert f"conversation__id__exact={conversation.pk}" in page.content.decode()
    assert "3 messages" in page.content.decode()
    assert post.status_code == 403
    conversation.refresh_from_db()
    assert conversation.title == "Holiday plans"


def test_nothing_can_be_added_and_messages_cannot_be_deleted(
    staff_client: Client, conversation: Conversation
) -> None:
    message = Message.objects.filter(conversation=conversation).last()
    assert message is not None

    assert staff_client.get("/admin/conversations/conversation/add/").status_code == 403
    assert staff_client.get("/admin/conversations/message/add/").status_code == 403
    delete = staff_client.post(
        f"/admin/conversations/message/{message.pk}/delete/", {"post": "yes"}
    )
    assert delete.status_code == 403
    assert Message.objects.filter(pk=message.pk).exists()


def test_deleting_from_the_admin_keeps_a_tombstone(
    staff_client: Client, conversation: Conversation
) -> None:
    response = staff_client.post(
        f"/admin/conversations/conversation/{conversation.pk}/delete/", {"post": "yes"}
    )

    assert response.status_code == 302
    conversation.refresh_from_db()
    assert conversation.deleted_at is not None
    assert conversation.title == ""
    assert not Message.objects.filter(conversation=conversation).exists()


def test_branch_summaries_are_listed_read_only(
    staff_client: Client, conversation: Conversation
) -> None:
    answer = Message.objects.get(conversation=conversation, role=Message.Role.ASSISTANT)
    summary = BranchSummary.objects.create(
        conversation=conversation,
        through_message=answer,
        content="They chose Lisbon.",
        tokens=5,
        covered_messages=2,
        model="smollm2-135m",
    )

    listing = staff_client.get("/admin/conversations/branchsummary/", {"q": "holiday"})
    page = staff_client.get(f"/admin/conversations/branchsummary/{summary.pk}/change/")

    assert listing.status_code == 200
    assert str(summary) in listing.content.decode()
    assert "They chose Lisbon." in page.content.decode()
    assert 'name="content"' not in page.content.decode()
    assert staff_client.get("/admin/conversations/branchsummary/add/").status_code == 403
