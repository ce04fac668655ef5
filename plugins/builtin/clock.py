"""Time and time zones: the one thing a language model can never know by itself.

Three tools on the IANA database (`zoneinfo`): the current time in a zone, a wall-clock time
converted from one zone to another, and the span between two dates or times. Daylight saving
is the database's business, not the model's: a local time that a DST jump skips is refused
instead of being silently shifted (a repeated one is read as its first occurrence).
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from plugins.sdk import Plugin, Tool, ToolContext, ToolError

DEFAULT_ZONE = "UTC"
MAX_ZONE_CHARS = 64
MAX_TIME_CHARS = 64


def zone(name: Any) -> ZoneInfo:
    """The IANA zone called `name`, or ToolError naming the mistake."""
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_ZONE_CHARS:
        raise ToolError("A time zone is an IANA name such as 'Europe/Paris' or 'UTC'.")
    name = name.strip()
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        pass
    # Models often get the case wrong ("europe/paris"); the database is case-sensitive.
    matches = [known for known in available_timezones() if known.lower() == name.lower()]
    if len(matches) == 1:
        return ZoneInfo(matches[0])
    raise ToolError(f"Unknown time zone '{name}'. Use an IANA name such as 'America/New_York'.")


def _zone_arg(ctx: ToolContext, args: dict[str, Any], key: str) -> ZoneInfo:
    return zone(args.get(key) or ctx.config.get("default_timezone") or DEFAULT_ZONE)


def _parse(value: Any, *, tz: ZoneInfo | None = None) -> datetime:
    """An ISO 8601 date or date-time; a naive one is read as wall-clock time in `tz`."""
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_TIME_CHARS:
        raise ToolError("A time is ISO 8601 text, e.g. '2025-03-30 14:00' or '2025-03-30'.")
    text = value.strip()
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        try:
            parsed = datetime.combine(date.fromisoformat(text), datetime.min.time())
        except ValueError as exc:
            raise ToolError(
                f"'{text}' is not an ISO 8601 time such as '2025-03-30T14:00'."
            ) from exc
    if parsed.tzinfo is None:
        parsed = _localize(parsed, tz or ZoneInfo(DEFAULT_ZONE))
    return parsed


def _localize(naive: datetime, tz: ZoneInfo) -> datetime:
    """Attach `tz`, refusing a wall-clock time that the zone skips (a DST gap)."""
    aware = naive.replace(tzinfo=tz)
    # zoneinfo accepts times inside a gap; a round trip through UTC moves them, which tells.
    round_trip = aware.astimezone(UTC).astimezone(tz).replace(tzinfo=None)
    if round_trip != naive:
        raise ToolError(f"{naive.isoformat()} does not exist in {tz.key} (a daylight-saving jump).")
    return aware


def _describe(moment: datetime) -> dict[str, Any]:
    offset = moment.utcoffset() or timedelta(0)
    zone_name = getattr(moment.tzinfo, "key", None) or moment.tzname() or "UTC"
    return {
        "iso": moment.isoformat(timespec="seconds"),
        "timezone": zone_name,
        "abbreviation": moment.tzname(),
        "utc_offset": _format_offset(offset),
        "weekday": moment.strftime("%A"),
        "human": moment.strftime("%A %d %B %Y, %H:%M:%S"),
    }


def _format_offset(offset: timedelta) -> str:
    minutes = int(offset.total_seconds()) // 60
    sign = "+" if minutes >= 0 else "-"
    hours, minutes = divmod(abs(minutes), 60)
    return f"{sign}{hours:02d}:{minutes:02d}"


def time_now(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Handler of `clock_now`: the current time in a zone (the configured default otherwise)."""
    return _describe(datetime.now(tz=_zone_arg(ctx, args, "timezone")))


def time_convert(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Handler of `clock_convert`: a time read in one zone, shown in another."""
    source = _zone_arg(ctx, args, "from_timezone")
    target = zone(args.get("to_timezone"))
    # A time written with an offset ("...+02:00") is that instant whatever from_timezone says.
    moment = _parse(args.get("time"), tz=source)
    return {
        "from": _describe(moment.astimezone(source)),
        "to": _describe(moment.astimezone(target)),
    }


def time_difference(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Handler of `clock_difference`: the exact span between two times, and in calendar days."""
    tz = _zone_arg(ctx, args, "timezone")
    start = _parse(args.get("start"), tz=tz)
    end = _parse(args.get("end"), tz=tz)
    # Subtracting two datetimes of one tzinfo ignores their offsets (wall-clock arithmetic);
    # in UTC the span is the time that really passes, DST jumps included.
    span = end.astimezone(UTC) - start.astimezone(UTC)
    seconds = int(span.total_seconds())
    sign = "-" if seconds < 0 else ""
    days, rest = divmod(abs(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return {
        "start": start.isoformat(timespec="seconds"),
        "end": end.isoformat(timespec="seconds"),
        "total_seconds": seconds,
        "calendar_days": (end.astimezone(tz).date() - start.astimezone(tz).date()).days,
        "human": f"{sign}{days} days, {hours} hours, {minutes} minutes, {secs} seconds",
    }


_ZONE_PROPERTY = {
    "type": "string",
    "maxLength": MAX_ZONE_CHARS,
    "description": "IANA time zone, e.g. 'Europe/Paris', 'America/New_York', 'UTC'.",
}
_TIME_PROPERTY = {
    "type": "string",
    "maxLength": MAX_TIME_CHARS,
    "description": "ISO 8601 date or date-time, e.g. '2025-03-30T14:00' or '2025-03-30'.",
}

plugin = Plugin(
    slug="clock",
    name="Clock",
    version="1.0",
    description="The current time in any time zone, conversions between zones, date spans.",
    tools=[
        Tool(
            name="clock_now",
            description="The current date and time in a time zone.",
            parameters={
                "type": "object",
                "properties": {"timezone": _ZONE_PROPERTY},
                "additionalProperties": False,
            },
            handler=time_now,
        ),
        Tool(
            name="clock_convert",
            description=(
                "Convert a date-time from one time zone to another (a time without an offset "
                "is read as wall-clock time in from_timezone)."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "time": _TIME_PROPERTY,
                    "from_timezone": _ZONE_PROPERTY,
                    "to_timezone": _ZONE_PROPERTY,
                },
                "required": ["time", "to_timezone"],
                "additionalProperties": False,
            },
            handler=time_convert,
        ),
        Tool(
            name="clock_difference",
            description="The time between two dates or date-times (end minus start).",
            parameters={
                "type": "object",
                "properties": {
                    "start": _TIME_PROPERTY,
                    "end": _TIME_PROPERTY,
                    "timezone": {
                        **_ZONE_PROPERTY,
                        "description": "Zone of times given without an offset.",
                    },
                },
                "required": ["start", "end"],
                "additionalProperties": False,
            },
            handler=time_difference,
        ),
    ],
    config_schema={
        "type": "object",
        "properties": {
            "default_timezone": {
                "type": "string",
                "title": "Default time zone",
                "description": "Used when the model names none (IANA name).",
                "default": DEFAULT_ZONE,
            }
        },
    },
)
