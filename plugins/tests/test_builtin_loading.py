"""The shipped plugins load through the registry like any third party's, and run there."""

from __future__ import annotations

import json

import pytest
from django.conf import settings

from plugins.registry import registry_build


def test_every_shipped_plugin_loads() -> None:
    registry = registry_build(builtin=settings.PLUGINS_BUILTIN, entry_points=[])
    assert registry.skipped == []
    assert set(registry.plugins) == {"calculator", "clock", "url_fetch", "conversation_search"}
    assert set(registry.tools) == {
        "calculator",
        "clock_now",
        "clock_convert",
        "clock_difference",
        "url_fetch",
        "conversation_search",
    }


@pytest.mark.django_db
def test_the_calculator_runs_through_tool_run(user, install_registry) -> None:
    from plugins.services import plugin_config_update, tool_run

    install_registry(["plugins.builtin.calculator:plugin"])
    plugin_config_update(slug="calculator", enabled=True, values={})
    result = tool_run(
        user_id=user.pk,
        conversation_id=None,
        name="calculator",
        arguments=json.dumps({"expression": "6 * 7"}),
    )
    assert result.ok, result
    assert json.loads(result.content) == {"expression": "6 * 7", "result": "42"}
    refused = tool_run(
        user_id=user.pk,
        conversation_id=None,
        name="calculator",
        arguments=json.dumps({"expression": "1 / 0"}),
    )
    assert not refused.ok
    assert "Division by zero" in refused.content
