"""A process loads the classifiers' models as it starts, not during its first user's message:
the output guard's `warm` (the scheduler calls it before its loops) and the edge's
`EDGE_WARM_UP`, run as its ASGI module loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from chatsite.edge import warm_up
from chatsite.testing import budget
from moderation.classifiers import profanity
from moderation.output import StreamingOutputGuard

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def unloaded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(profanity, "_model", None)


@pytest.mark.usefixtures("unloaded")
def test_the_output_guard_loads_the_profanity_model_when_warmed() -> None:
    StreamingOutputGuard().warm()
    assert isinstance(profanity._model, profanity.ProfanityModel)


@pytest.mark.usefixtures("unloaded")
@override_settings(MODERATION_OUTPUT_ENABLED=False)
def test_with_output_checks_off_warming_loads_nothing() -> None:
    StreamingOutputGuard().warm()
    assert profanity._model is None


@pytest.mark.usefixtures("unloaded")
@override_settings(MODERATION_INPUT_ENABLED=False, INFERENCE_DIRECT_RELAY=False)
def test_an_edge_without_input_checks_loads_no_classifier() -> None:
    warm_up()
    assert profanity._model is None


@pytest.mark.usefixtures("unloaded")
@override_settings(MODERATION_INPUT_ENABLED=False, INFERENCE_DIRECT_RELAY=True)
def test_an_edge_that_relays_answers_loads_the_output_classifiers() -> None:
    """It checks the answers it reads from the workers itself (inference/edge_relay.py)."""
    warm_up()
    assert isinstance(profanity._model, profanity.ProfanityModel)


@override_settings(EDGE_WARM_UP=["moderation.engine.no_such_function"])
def test_a_warm_up_that_cannot_be_imported_stops_the_edge_with_the_setting_named() -> None:
    with pytest.raises(ImproperlyConfigured, match="EDGE_WARM_UP"):
        warm_up()


def test_an_edge_process_has_the_model_and_the_tokenizer_once_its_application_loads() -> None:
    probe = (
        "import chatsite.asgi\n"
        "from django.conf import settings\n"
        "from inference.tokens import load_tokenizer\n"
        "from moderation.classifiers import profanity\n"
        "print(profanity._model is not None, load_tokenizer.cache_info().currsize)\n"
    )
    done = subprocess.run(  # noqa: S603 (our own interpreter)
        [sys.executable, "-c", probe],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "chatsite.settings"},
        capture_output=True,
        text=True,
        timeout=budget(120),  # the failure point only: a hung interpreter
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    loaded, tokenizers = done.stdout.split()
    assert loaded == "True"
    # The default model's tokenizer, where it is prepared (`make test` prepares it).
    prepared = (Path(settings.MODEL_DIR) / "tokenizer.json").is_file()
    assert int(tokenizers) == int(prepared)
