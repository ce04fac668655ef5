"""clock: the current time, conversions and spans in IANA zones, DST included."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from plugins.builtin.clock import plugin
from plugins.sdk import ToolContext, ToolError

TOOLS = {tool.name: tool.handler for tool in plugin.tools}


def call(name: str, args: dict, **config) -> dict:
    ctx = ToolContext(user_id=1, conversation_id=None, config=config, timeout_seconds=10)
    return TOOLS[name](ctx, args)


def test_now_is_the_current_time_in_the_zone() -> None:
    # Read between two readings of the clock (to the second it is given in), at any speed.
    before = datetime.now(tz=ZoneInfo("UTC")).replace(microsecond=0)
    result = call("clock_now", {"timezone": "Asia/Kolkata"})
    after = datetime.now(tz=ZoneInfo("UTC"))
    moment = datetime.fromisoformat(result["iso"])
    assert before <= moment <= after
    assert result["utc_offset"] == "+05:30"
    assert result["timezone"] == "Asia/Kolkata"


def test_now_uses_the_configured_zone_then_utc() -> None:
    assert call("clock_now", {}, default_timezone="Europe/Paris")["timezone"] == "Europe/Paris"
    assert call("clock_now", {})["utc_offset"] == "+00:00"


def test_zone_names_are_matched_without_case() -> None:
    assert call("clock_now", {"timezone": "america/new_york"})["timezone"] == "America/New_York"


def test_convert_between_zones() -> None:
    result = call(
        "clock_convert",
        {
            "time": "2025-03-30T14:00",
            "from_timezone": "America/New_York",
            "to_timezone": "Asia/Tokyo",
        },
    )
    assert result["from"]["iso"] == "2025-03-30T14:00:00-04:00"
    assert result["to"]["iso"] == "2025-03-31T03:00:00+09:00"
    assert result["to"]["weekday"] == "Monday"


def test_a_time_with_an_offset_is_that_instant() -> None:
    result = call("clock_convert", {"time": "2025-01-01T12:00:00+02:00", "to_timezone": "UTC"})
    assert result["to"]["iso"] == "2025-01-01T10:00:00+00:00"


def test_a_time_skipped_by_daylight_saving_is_refused() -> None:
    with pytest.raises(ToolError, match="does not exist in Europe/Paris"):
        call(
            "clock_convert",
            {"time": "2025-03-30T02:30", "from_timezone": "Europe/Paris", "to_timezone": "UTC"},
        )


def test_difference_counts_real_hours_across_a_dst_change() -> None:
    result = call(
        "clock_difference",
        {"start": "2025-03-29", "end": "2025-03-31", "timezone": "Europe/Paris"},
    )
    assert result["total_seconds"] == 47 * 3600
    assert result["calendar_days"] == 2
    assert result["human"] == "1 days, 23 hours, 0 minutes, 0 seconds"


def test_difference_can_be_negative() -> None:
    result = call("clock_difference", {"start": "2025-01-02", "end": "2025-01-01T12:00"})
    assert result["total_seconds"] == -12 * 3600
    assert result["human"].startswith("-0 days, 12 hours")


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("clock_now", {"timezone": "Mars/Olympus_Mons"}, "Unknown time zone"),
        ("clock_now", {"timezone": "../../etc/passwd"}, "Unknown time zone"),
        ("clock_convert", {"time": "2025-01-01", "to_timezone": "Nowhere"}, "Unknown time zone"),
        ("clock_convert", {"time": "yesterday", "to_timezone": "UTC"}, "not an ISO 8601 time"),
        ("clock_difference", {"start": "2025-13-01", "end": "2025-01-01"}, "not an ISO 8601"),
        ("clock_convert", {"time": 5, "to_timezone": "UTC"}, "ISO 8601"),
    ],
)
def test_bad_zones_and_times_get_clear_errors(name: str, args: dict, message: str) -> None:
    with pytest.raises(ToolError, match=message):
        call(name, args)
