"""The hook registry: subscribers named in settings, called in order; a bad name stops the
process at start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.core.exceptions import ImproperlyConfigured

from chatsite.testing import budget
from inference.hooks import HookManager, InferenceHooks, load_hooks

ROOT = Path(__file__).resolve().parents[2]


class Recorder(InferenceHooks):
    calls: list[tuple[str, Any]] = []

    def generation_first_token(self, *, generation_id: Any) -> None:
        self.calls.append(("first", generation_id))


class SecondRecorder(Recorder):
    def generation_first_token(self, *, generation_id: Any) -> None:
        self.calls.append(("second", generation_id))


class Refuser(InferenceHooks):
    def generation_tool_round(self, **kwargs: Any) -> bool:
        return False


class NotAHook:
    pass


def test_subscribers_are_called_in_the_order_the_setting_names_them() -> None:
    Recorder.calls = []
    manager = load_hooks(
        ["inference.tests.test_hooks.Recorder", "inference.tests.test_hooks.SecondRecorder"]
    )

    manager.generation_first_token(generation_id="g1")

    assert Recorder.calls == [("first", "g1"), ("second", "g1")]


def test_a_tool_round_is_kept_only_if_every_subscriber_keeps_it() -> None:
    round_: dict[str, Any] = {"generation_id": "g", "text": "", "tool_calls": [], "results": []}
    assert HookManager([InferenceHooks()]).generation_tool_round(**round_) is True
    assert HookManager([InferenceHooks(), Refuser()]).generation_tool_round(**round_) is False


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("inference.tests.test_hooks.Missing", "cannot import"),
        ("inference.tests.test_hooks.NotAHook", "is not a class implementing"),
        ("nowhere", "cannot import"),
    ],
)
def test_an_unknown_hook_stops_the_process_at_start(settings: Any, value: str, why: str) -> None:
    settings.INFERENCE_HOOKS = ["conversations.finish.ConversationHooks", value]
    with pytest.raises(ImproperlyConfigured, match="INFERENCE_HOOKS") as refused:
        apps.get_app_config("inference").ready()
    assert why in str(refused.value)
    assert repr(value) in str(refused.value)


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("INFERENCE_HOOKS", "billing.inference_hooks.Nope"),
        ("SCHEDULER_PLACEMENT", "stickiest"),
        ("INFERENCE_TOOL_RUNNER", "plugins.runner.Nope"),
        ("INFERENCE_OUTPUT_GUARD", "moderation.output.Nope"),
        ("CONVERSATION_TOOLS_PROVIDER", "plugins.selectors.nope"),
    ],
)
def test_a_process_refuses_to_start_with_a_bad_dotted_setting(setting: str, value: str) -> None:
    env = {**os.environ, setting: value, "SECRET_KEY": "test-only"}
    started = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=budget(300),  # a failure point: it ends in seconds
        check=False,
    )

    assert started.returncode != 0
    assert "ImproperlyConfigured" in started.stderr
    assert f"{setting}:" in started.stderr and repr(value) in started.stderr
