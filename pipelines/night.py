"""The night's calendar: its run id and its deadline, from when the night was scheduled to start.

Both follow from the scheduled start, never from the moment a process happens to run, so a retry
of the night, or a rerun of it after a crash, gets the same run id (and resumes the documents it
finished) and the same deadline (a night restarted late has less time, not a fresh allowance).
Pure: times in, times out; the flow reads the scheduled start from Prefect.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

RUN_ID_PREFIX = "nightly-"
_HHMM = re.compile(r"^([01]?\d|2[0-3]):([0-5]\d)$")


class NightError(ValueError):
    """A deadline or timezone that cannot be used; the message shows the form that works."""


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise NightError(
            f"timezone {name!r} is unknown; use an IANA name such as UTC or Europe/Berlin"
        ) from None


def night_run_id(start: datetime, timezone: str = "UTC") -> str:
    """`nightly-YYYY-MM-DD`: the date the night was scheduled to start on, in `timezone`."""
    return f"{RUN_ID_PREFIX}{start.astimezone(zone(timezone)).date().isoformat()}"


def parse_deadline(text: str) -> tuple[int, int]:
    """(hour, minute) of a `HH:MM` deadline."""
    match = _HHMM.match(text.strip())
    if match is None:
        raise NightError(f"deadline {text!r}: give a time of day as HH:MM, e.g. 06:30")
    return int(match.group(1)), int(match.group(2))


def deadline_after(start: datetime, text: str, timezone: str = "UTC") -> datetime:
    """The first `HH:MM` (in `timezone`) after the night's scheduled `start`: 06:30 for a night
    starting at 01:00 is the same morning, for one starting at 23:00 the next. Aware datetimes
    only: a naive one has no defined instant."""
    if start.tzinfo is None:
        raise ValueError("the night's start must carry its timezone")
    hour, minute = parse_deadline(text)
    local = start.astimezone(zone(timezone))
    at = local.replace(hour=hour, minute=minute, second=0, microsecond=0)
    if at <= local:
        at = (local + timedelta(days=1)).replace(hour=hour, minute=minute, second=0, microsecond=0)
    return at
