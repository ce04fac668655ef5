"""Discovery: good plugins load, every kind of broken one is skipped with a warning."""

from __future__ import annotations

import logging

import pytest
from django.core.checks import Warning as CheckWarning

from plugins.checks import check_plugins
from plugins.registry import Problem, registry_build

from .conftest import FAKES, entry_point


def _skipped(registry):
    return {skipped.source: skipped.check_id for skipped in registry.skipped}


def test_builtin_and_entry_point_plugins_load():
    registry = registry_build(
        builtin=[f"{FAKES}:echo"],
        entry_points=[entry_point("factory", f"{FAKES}:misbehaving")],
    )
    assert set(registry.plugins) == {"echo", "misbehaving"}
    assert registry.plugins["echo"].builtin is True
    assert registry.plugins["misbehaving"].builtin is False
    assert registry.tools["hang"][0] == "misbehaving"
    spec = registry.tool_spec("echo")
    assert spec is not None
    assert spec.to_openai()["function"]["name"] == "echo"
    assert spec.to_openai()["function"]["parameters"]["required"] == ["text"]
    assert registry.skipped == []


def test_a_factory_is_called():
    registry = registry_build(
        builtin=[], entry_points=[entry_point("echo", f"{FAKES}:echo_factory")]
    )
    assert "echo" in registry.plugins


@pytest.mark.parametrize(
    ("value", "check_id", "reason"),
    [
        ("plugins.tests.fake_import_error:plugin", Problem.IMPORT_FAILED, "broken at import"),
        (
            "plugins.tests.fake_missing_dependency:plugin",
            Problem.MISSING_DEPENDENCY,
            "chatsite_no_such_dependency",
        ),
        (f"{FAKES}:incompatible", Problem.INCOMPATIBLE, "requires chatsite >=99.0"),
        (f"{FAKES}:bad_parameters", Problem.BAD_SCHEMA, "parameters of tool 'bad'"),
        (f"{FAKES}:bad_config", Problem.BAD_SCHEMA, "config field 'hosts'"),
        (f"{FAKES}:duplicate", Problem.DUPLICATE, "tool name 'echo' is already taken"),
        (f"{FAKES}:not_a_plugin", Problem.IMPORT_FAILED, "not a plugins.sdk.Plugin"),
        (f"{FAKES}:failing_factory", Problem.IMPORT_FAILED, "factory broke"),
        (f"{FAKES}:no_such_attribute", Problem.IMPORT_FAILED, "no_such_attribute"),
    ],
)
def test_a_broken_plugin_is_skipped_with_a_warning(caplog, value, check_id, reason):
    with caplog.at_level(logging.WARNING, logger="plugins.registry"):
        registry = registry_build(
            builtin=[f"{FAKES}:echo"], entry_points=[entry_point("broken", value)]
        )
    assert set(registry.plugins) == {"echo"}, "the good plugin still loads"
    assert registry.tools["echo"][0] == "echo"
    [skipped] = registry.skipped
    assert skipped.check_id == check_id
    assert reason in skipped.reason
    assert any(reason in record.getMessage() for record in caplog.records)


def test_a_missing_builtin_module_is_skipped():
    registry = registry_build(builtin=["plugins.builtin.not_written_yet:plugin"], entry_points=[])
    assert registry.plugins == {}
    assert registry.skipped[0].check_id == Problem.MISSING_DEPENDENCY


def test_skipped_plugins_are_system_check_warnings(install_registry):
    install_registry(
        [f"{FAKES}:echo"],
        [
            entry_point("future", f"{FAKES}:incompatible"),
            entry_point("dup", f"{FAKES}:duplicate"),
        ],
    )
    messages = check_plugins()
    assert [message.id for message in messages] == [Problem.INCOMPATIBLE, Problem.DUPLICATE]
    assert all(isinstance(message, CheckWarning) for message in messages)
    assert "future" in messages[0].msg


def test_the_installed_example_plugin_registers_by_entry_point():
    registry = registry_build(builtin=[])
    loaded = registry.plugins.get("dice")
    assert loaded is not None, "pip install -e examples/chatsite-example-plugin (make venv)"
    assert loaded.builtin is False
    assert "roll_dice" in registry.tools
