"""The catalogue of stream events is the one list: the page's JavaScript follows it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from chatsite.stream_events import INTERNAL_EVENTS, TERMINAL_EVENTS, StreamEvent, entry_fields

STREAM_JS = Path(__file__).resolve().parents[2] / "static" / "js" / "stream.js"


def _js_events() -> list[str]:
    found = re.search(r"^const EVENTS = \[(.*?)\];", STREAM_JS.read_text(), re.S | re.M)
    assert found, "static/js/stream.js no longer declares `const EVENTS = [...]`"
    return re.findall(r'"([^"]*)"', found.group(1))


def _client_events() -> list[StreamEvent]:
    return [event for event in StreamEvent if event not in INTERNAL_EVENTS]


def test_the_page_listens_for_exactly_the_catalogues_events() -> None:
    assert _js_events() == [event.value for event in _client_events()]


def test_the_page_handles_every_event_it_listens_for() -> None:
    source = STREAM_JS.read_text()
    for event in _client_events():
        assert f'case "{event.value}":' in source, f"stream.js does not apply {event.value!r}"


def test_done_is_the_terminal_event() -> None:
    assert frozenset({StreamEvent.DONE}) == TERMINAL_EVENTS


def test_an_entry_carries_the_events_name_and_its_json_payload() -> None:
    fields = entry_fields(StreamEvent.DELTA, {"text": "Hé"})

    assert fields == {"event": "delta", "data": json.dumps({"text": "Hé"})}
