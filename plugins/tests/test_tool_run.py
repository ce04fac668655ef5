"""tool_run: arguments checked, limits enforced, every failure a result, never an exception."""

from __future__ import annotations

import json
import time

import pytest

from billing.tests.factories import subscribe
from chatsite.testing import wait_until
from conversations.tests.factories import ConversationFactory
from plugins import services
from plugins.models import ConversationTool
from plugins.selectors import tools_for_conversation
from plugins.services import plugin_config_update, tool_run

from . import fakes

pytestmark = pytest.mark.django_db


def run(user, name, arguments="{}", conversation=None):
    return tool_run(
        user_id=user.pk,
        conversation_id=str(conversation.pk) if conversation else None,
        name=name,
        arguments=arguments,
    )


def test_a_tool_runs_with_its_arguments_and_settings(user, fake_registry):
    result = run(user, "echo", json.dumps({"text": "hi"}))
    assert result.ok, result
    assert json.loads(result.content) == {"text": "hi", "user": user.pk, "greeting": "hello"}
    assert result.error_code == ""


def test_a_hung_tool_times_out_within_the_limit(user, fake_registry, settings):
    settings.PLUGINS_TOOL_TIMEOUT_SECONDS = 0.5
    started = time.monotonic()
    result = run(user, "hang")
    elapsed = time.monotonic() - started
    assert not result.ok
    assert result.error_code == "timeout"
    # Not before the limit; and back while the handler still hangs (it hangs HANG_SECONDS),
    # so it did not wait for it: bounds that hold at any speed.
    assert 0.5 <= elapsed < fakes.HANG_SECONDS
    assert services._running >= 1, "the hung handler's thread still holds its slot"


def test_hung_tools_cannot_pile_up_threads(user, fake_registry, settings):
    settings.PLUGINS_TOOL_TIMEOUT_SECONDS = 0.2
    settings.PLUGINS_MAX_RUNNING = services._running + 1
    assert run(user, "hang").error_code == "timeout"
    result = run(user, "echo", json.dumps({"text": "hi"}))
    assert result.error_code == "unavailable"
    fakes.release_hang.set()
    wait_until(lambda: run(user, "echo", json.dumps({"text": "hi"})).ok, what="the slot came back")


def test_a_raising_tool_fails_without_leaking_its_message(user, fake_registry, caplog):
    result = run(user, "explode")
    assert (result.ok, result.error_code) == (False, "failed")
    assert "RuntimeError" in result.error_message
    assert "do-not-show" not in result.content
    assert "do-not-show" not in caplog.text


def test_a_tool_error_is_shown_to_the_model(user, fake_registry):
    result = run(user, "refuse")
    assert result.error_code == "failed"
    assert "The city is unknown." in result.content


def test_a_huge_result_is_refused(user, fake_registry, settings):
    settings.PLUGINS_RESULT_MAX_CHARS = 1000
    result = run(user, "huge")
    assert result.error_code == "too_large"
    assert len(result.content) < 200


def test_a_result_that_is_not_json_is_malformed(user, fake_registry):
    assert run(user, "malformed").error_code == "malformed"


@pytest.mark.parametrize(
    "arguments",
    ['{"text": "hi"', "[1, 2]", '{"text": 5}', "{}", '{"text": "hi", "extra": 1}'],
)
def test_bad_arguments_are_refused_before_the_handler(user, fake_registry, arguments):
    result = run(user, "echo", arguments)
    assert result.error_code == "bad_arguments"
    assert result.content.startswith("Tool error (bad_arguments)")


def test_an_unknown_tool(user, fake_registry):
    assert run(user, "nothing_here").error_code == "unknown_tool"


def test_an_entry_point_plugin_is_off_until_staff_enable_it(user, fake_registry):
    assert run(user, "whoami").error_code == "unavailable"
    plugin_config_update(slug="secretive", enabled=True)
    assert run(user, "whoami").error_code == "unavailable", "its required key is not set"
    plugin_config_update(slug="secretive", values={"api_key": "k" * 12})
    result = run(user, "whoami")
    assert result.ok, result
    assert result.content == "key length 12, region eu"


def test_a_plugin_limited_to_plans(user, other_user, fake_registry):
    plan = subscribe(user, tier="plus")
    subscribe(other_user, tier="plus")
    plugin_config_update(slug="echo", all_plans=False, plans=[plan])
    assert run(user, "echo", '{"text": "a"}').ok
    assert run(other_user, "echo", '{"text": "a"}').error_code == "unavailable"
    names = {spec.name for spec in tools_for_conversation(user=other_user, conversation=None)}
    assert "echo" not in names
    assert "hang" in names


def test_a_disabled_plugin_is_unavailable(user, fake_registry):
    plugin_config_update(slug="echo", enabled=False)
    assert run(user, "echo", '{"text": "a"}').error_code == "unavailable"


def test_a_tool_switched_off_in_the_conversation(user, fake_registry):
    conversation = ConversationFactory.create(owner=user)
    ConversationTool.objects.create(conversation=conversation, tool_name="echo", enabled=False)
    names = {spec.name for spec in tools_for_conversation(user=user, conversation=conversation)}
    assert "echo" not in names
    assert "hang" in names
    assert run(user, "echo", '{"text": "a"}', conversation).error_code == "unavailable"
    assert run(user, "echo", '{"text": "a"}').ok, "other conversations keep it"


def test_another_users_conversation_is_unavailable(user, other_user, fake_registry):
    conversation = ConversationFactory.create(owner=other_user)
    assert run(user, "echo", '{"text": "a"}', conversation).error_code == "unavailable"


def test_an_unknown_user_is_unavailable(fake_registry, db):
    result = tool_run(user_id=987654, conversation_id=None, name="echo", arguments="{}")
    assert result.error_code == "unavailable"
