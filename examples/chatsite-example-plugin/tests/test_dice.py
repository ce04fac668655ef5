"""The example plugin's own tests: the handler alone, then through Chatsite's tool_run."""

from __future__ import annotations

import json

import pytest
from chatsite_dice import parse, plugin, roll_dice, sign

from plugins.registry import registry_build, registry_reset
from plugins.sdk import ToolContext, ToolError
from plugins.services import plugin_config_update, tool_run


def context(**config):
    return ToolContext(user_id=1, conversation_id=None, config=config, timeout_seconds=5)


@pytest.mark.parametrize(
    ("notation", "expected"),
    [("d20", (1, 20, 0)), ("3d6", (3, 6, 0)), ("2d8+1", (2, 8, 1)), (" 4 D 10 - 2 ", (4, 10, -2))],
)
def test_notation(notation, expected):
    assert parse(notation) == expected


@pytest.mark.parametrize("notation", ["", "d", "2x6", "1d6+", "d6; drop table", "99999d6"])
def test_bad_notation_is_a_tool_error(notation):
    with pytest.raises(ToolError):
        parse(notation)


def test_rolls_stay_on_the_dice():
    for _ in range(200):
        result = roll_dice(context(), {"notation": "3d6+2"})
        assert len(result["rolls"]) == 3
        assert all(1 <= roll <= 6 for roll in result["rolls"])
        assert result["total"] == sum(result["rolls"]) + 2
        assert "signature" not in result


def test_limits_come_from_the_settings():
    with pytest.raises(ToolError, match="between 1 and 4 dice"):
        roll_dice(context(max_dice=4), {"notation": "5d6"})
    with pytest.raises(ToolError, match="2 and 12 sides"):
        roll_dice(context(max_sides=12), {"notation": "d20"})


def test_a_signing_key_signs_the_roll():
    key = "a-very-secret-signing-key"
    result = roll_dice(context(signing_key=key), {"notation": "2d6", "label": "damage"})
    signature = result.pop("signature")
    assert signature == sign(key, result)
    assert signature != sign("another-key-entirely", result)
    assert key not in json.dumps(result)


@pytest.mark.django_db
def test_through_the_service_with_staff_settings(user):
    registry_reset(registry_build(builtin=[]))
    try:
        denied = tool_run(user_id=user.pk, conversation_id=None, name="roll_dice", arguments="{}")
        assert denied.error_code == "unavailable", "installed plugins start switched off"
        plugin_config_update(
            slug=plugin.slug, enabled=True, values={"max_dice": 3, "signing_key": "k" * 16}
        )
        ok = tool_run(
            user_id=user.pk,
            conversation_id=None,
            name="roll_dice",
            arguments='{"notation": "3d4"}',
        )
        assert ok.ok, ok
        rolled = json.loads(ok.content)
        signature = rolled.pop("signature")
        assert signature == sign("k" * 16, rolled)
        too_many = tool_run(
            user_id=user.pk,
            conversation_id=None,
            name="roll_dice",
            arguments='{"notation": "4d4"}',
        )
        assert too_many.error_code == "failed"
        assert "between 1 and 3 dice" in too_many.content
    finally:
        registry_reset()
