"""The tools of a conversation over the JSON API: owner only, CSRF for sessions."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from billing.tests.factories import subscribe
from chatsite.testing import assert_error
from conversations.models import Conversation
from conversations.tests.factories import ConversationFactory
from plugins.models import ConversationTool
from plugins.selectors import tools_for_conversation
from plugins.services import conversation_tools_set, plugin_config_update

pytestmark = pytest.mark.django_db

SECRET = "sk-api-leak-check-91"


def url(conversation):
    return f"/api/v1/conversations/{conversation.pk}/tools"


def by_name(response):
    return {tool["name"]: tool for tool in response.json()["tools"]}


def test_lists_the_plan_tools_with_their_switches(api_client, user, fake_registry):
    conversation = ConversationFactory.create(owner=user)
    tools = by_name(api_client.get(url(conversation)))
    assert set(tools) == {"echo", "hang", "explode", "refuse", "huge", "malformed"}
    assert tools["echo"] == {
        "name": "echo",
        "description": "Echo a text.",
        "plugin": "echo",
        "enabled": True,
    }


def test_tools_start_off_unless_the_site_turns_them_on(api_client, user, fake_registry, settings):
    settings.PLUGINS_TOOLS_ON_BY_DEFAULT = False
    conversation = ConversationFactory.create(owner=user)
    assert not any(tool["enabled"] for tool in by_name(api_client.get(url(conversation))).values())
    assert tools_for_conversation(user=user, conversation=conversation) == []
    api_client.patch(url(conversation), {"tools": {"echo": True}}, format="json")
    conversation.refresh_from_db()  # as the next turn reads it
    names = {spec.name for spec in tools_for_conversation(user=user, conversation=conversation)}
    assert names == {"echo"}


def test_a_conversation_says_whether_a_tool_is_on_and_a_turn_without_reads_no_switch(
    api_client, user, fake_registry, settings, django_assert_num_queries
):
    settings.PLUGINS_TOOLS_ON_BY_DEFAULT = False
    conversation = ConversationFactory.create(owner=user)
    with django_assert_num_queries(0):
        assert tools_for_conversation(user=user, conversation=conversation) == []

    def switch(**tools):
        response = api_client.patch(url(conversation), {"tools": tools}, format="json")
        assert response.status_code == 200, response.content
        conversation.refresh_from_db()
        return conversation.tools_on

    assert switch(echo=True, hang=True)
    assert switch(echo=False), "hang is still on"
    assert not switch(hang=False)
    with django_assert_num_queries(0):
        assert tools_for_conversation(user=user, conversation=conversation) == []


def test_switching_a_tool_off_and_on(api_client, user, fake_registry):
    conversation = ConversationFactory.create(owner=user)
    response = api_client.patch(url(conversation), {"tools": {"echo": False}}, format="json")
    assert response.status_code == 200
    assert by_name(response)["echo"]["enabled"] is False
    names = {spec.name for spec in tools_for_conversation(user=user, conversation=conversation)}
    assert "echo" not in names
    api_client.patch(url(conversation), {"tools": {"echo": True}}, format="json")
    assert ConversationTool.objects.get(conversation=conversation, tool_name="echo").enabled
    assert by_name(api_client.get(url(conversation)))["echo"]["enabled"] is True


def test_a_tool_outside_the_plan_cannot_be_switched(api_client, user, fake_registry):
    conversation = ConversationFactory.create(owner=user)
    response = api_client.patch(url(conversation), {"tools": {"whoami": True}}, format="json")
    assert_error(response, 400, "unknown_tool")
    assert not ConversationTool.objects.exists()


def test_a_bad_body_is_refused(api_client, user, fake_registry):
    conversation = ConversationFactory.create(owner=user)
    response = api_client.patch(url(conversation), {"tools": {"echo": "maybe"}}, format="json")
    assert response.status_code == 400
    # Nothing of a body with one bad switch is kept, the good ones before it included.
    both = {"tools": {"hang": True, "echo": "maybe"}}
    assert api_client.patch(url(conversation), both, format="json").status_code == 400
    assert not ConversationTool.objects.exists()
    conversation.refresh_from_db()
    assert not conversation.tools_on


def test_another_users_conversation_is_not_found(api_client, other_user, fake_registry):
    conversation = ConversationFactory.create(owner=other_user)
    assert_error(api_client.get(url(conversation)), 404, "not_found")
    response = api_client.patch(url(conversation), {"tools": {"echo": False}}, format="json")
    assert_error(response, 404, "not_found")
    assert not ConversationTool.objects.exists()


def test_session_writes_need_the_csrf_token(session_client, user, fake_registry):
    conversation = ConversationFactory.create(owner=user)
    assert session_client.get(url(conversation)).status_code == 200
    response = session_client.patch(url(conversation), {"tools": {"echo": False}}, format="json")
    assert response.status_code == 403
    assert not ConversationTool.objects.exists()


def test_anonymous_is_refused(user, fake_registry):
    conversation = ConversationFactory.create(owner=user)
    assert APIClient().get(url(conversation)).status_code in (401, 403)


def test_a_plan_limited_plugin_is_listed_only_on_its_plan(
    api_client, other_api_client, user, other_user, fake_registry
):
    plan = subscribe(user, tier="plus")
    plugin_config_update(
        slug="secretive", enabled=True, all_plans=False, plans=[plan], values={"api_key": SECRET}
    )
    mine = ConversationFactory.create(owner=user)
    theirs = ConversationFactory.create(owner=other_user)
    response = api_client.get(url(mine))
    assert "whoami" in by_name(response)
    assert SECRET not in response.content.decode()
    assert "whoami" not in by_name(other_api_client.get(url(theirs)))


def test_the_chat_page_has_the_tools_control(client, user):
    client.force_login(user)
    html = client.get("/").content.decode()
    assert 'id="tools-menu"' in html
    assert 'id="tools-list"' in html


def test_a_switch_from_an_old_copy_of_the_conversation_keeps_its_flag_right(
    user, fake_registry, settings
):
    """Two tabs: one read the conversation while a tool was on, the other then switched it
    off; the first's switch of another tool on must turn the flag on again."""
    settings.PLUGINS_TOOLS_ON_BY_DEFAULT = False
    conversation = ConversationFactory.create(owner=user)
    conversation_tools_set(user=user, conversation=conversation, switches={"hang": True})
    old_copy = Conversation.objects.get(pk=conversation.pk)
    conversation_tools_set(user=user, conversation=conversation, switches={"hang": False})

    conversation_tools_set(user=user, conversation=old_copy, switches={"echo": True})

    conversation.refresh_from_db()
    assert conversation.tools_on, "echo is on"
