from datetime import UTC, datetime

import pytest

from pipelines.night import NightError, deadline_after, night_run_id


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def test_run_id_is_the_scheduled_date_in_the_night_timezone() -> None:
    start = at("2025-03-01T23:30:00+00:00")
    assert night_run_id(start) == "nightly-2025-03-01"
    assert night_run_id(start, "Europe/Berlin") == "nightly-2025-03-02"


def test_deadline_is_the_first_such_time_after_the_start() -> None:
    assert deadline_after(at("2025-03-01T01:00:00+00:00"), "06:30") == at(
        "2025-03-01T06:30:00+00:00"
    )
    assert deadline_after(at("2025-03-01T23:00:00+00:00"), "6:30") == at(
        "2025-03-02T06:30:00+00:00"
    )
    berlin = deadline_after(at("2025-03-01T01:00:00+00:00"), "06:30", "Europe/Berlin")
    assert berlin.astimezone(UTC) == at("2025-03-01T05:30:00+00:00")


def test_a_late_retry_keeps_the_night_s_deadline() -> None:
    # the deadline follows the scheduled start, not the moment the retry runs
    scheduled = at("2025-03-01T01:00:00+00:00")
    assert deadline_after(scheduled, "06:30") < at("2025-03-01T07:00:00+00:00")


@pytest.mark.parametrize("text", ["6.30", "25:00", "06:60", "tomorrow", ""])
def test_bad_deadlines_show_the_form(text: str) -> None:
    with pytest.raises(NightError, match="HH:MM"):
        deadline_after(at("2025-03-01T01:00:00+00:00"), text)


def test_unknown_timezone_names_an_example() -> None:
    with pytest.raises(NightError, match="IANA"):
        night_run_id(at("2025-03-01T01:00:00+00:00"), "Mars/Olympus")
