"""A window of the plug-in's status (serving/plugin_sensor.py): figures between two documents."""

from __future__ import annotations

import pytest

from serving.engine_site.engine_status import EngineStatus, StepRecord
from serving.plugin_sensor import window_figures


def document(status: EngineStatus) -> dict:
    return status.document({"state": "active"})


def test_the_share_of_steps_at_the_target_is_counted_between_two_documents():
    status = EngineStatus(None)
    status.step(StepRecord(batch_prefill=64, target_bound=True), 0.02)
    older = document(status)
    for bound in (True, False, False, True):
        status.step(StepRecord(batch_prefill=32 * bound, chat_decode=4, target_bound=bound), 0.02)
    f = window_figures(document(status), older)
    assert f["steps"] == 4 and f["target_bound_steps"] == 2
    assert f["target_bound_share"] == pytest.approx(0.5)


def test_a_status_from_before_the_count_leaves_the_share_unknown():
    status = EngineStatus(None)
    status.step(StepRecord(chat_decode=4), 0.01)
    older = document(status)
    del older["totals"]["target_bound_steps"]
    status.step(StepRecord(chat_decode=4), 0.01)
    f = window_figures(document(status), older)
    assert f["target_bound_share"] is None and f["steps"] == 1


def test_engine_status_shows_how_many_steps_of_the_last_interval_ran_at_the_target():
    from flows.cli_engine import plugin_line

    status = EngineStatus(None)
    for bound in (True, True, False):
        status.step(StepRecord(batch_prefill=64 * bound, chat_decode=2, target_bound=bound), 0.02)
    line = plugin_line("r0", status.document({"state": "active", "batch_step_target_ms": 20}))
    assert "3 steps (2 at the target)" in line and "target 20 ms" in line
