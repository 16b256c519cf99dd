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


@pytest.mark.parametrize("slowest_s", [0.076, 0.128, 0.41, 1.2])
def test_a_windows_ttft_p99_reads_within_five_percent_of_its_slowest_chat(slowest_s):
    """A window holds a few chats, so its p99 is read from the bucket of the slowest: a bucket
    wider than the controller's margins would read a chat well inside the SLO as pressure."""
    status = EngineStatus(None)
    older = document(status)
    for ttft in (0.02, 0.03, slowest_s):
        status.chat_ttft.observe(ttft)
    f = window_figures(document(status), older)
    assert f["chat_ttft_p99_s"] == pytest.approx(slowest_s, rel=0.05)


@pytest.mark.parametrize("slowest_s", [0.9, 4.2, 37.0])
def test_a_windows_chat_e2e_p99_reads_within_five_percent_and_is_unknown_before_the_count(
    slowest_s,
):
    status = EngineStatus(None)
    older = document(status)
    for e2e in (0.3, 0.5, slowest_s):
        status.chat_e2e.observe(e2e)
    assert window_figures(document(status), older)["chat_e2e_p99_s"] == pytest.approx(
        slowest_s, rel=0.05
    )
    del older["chat_e2e_seconds"]  # a plug-in from before the count
    assert window_figures(document(status), older)["chat_e2e_p99_s"] is None


def test_the_model_is_corrected_only_by_the_steps_that_carried_a_batch_chunk():
    """A step without batch is mostly fixed cost, which the fit prices less well, and its time
    moves with chat's load: counted, it would move the target of the chunks it never carried."""
    status = EngineStatus(None)
    older = document(status)
    status.step(StepRecord(chat_decode=4, predicted_s=0.01, model_s=0.01), 0.03)  # 3x the model
    f = window_figures(document(status), older)
    assert f["step_time_ratio"] is None, "no batch step: the window says nothing about the model"
    for _ in range(3):
        status.step(StepRecord(batch_prefill=64, chat_decode=4, predicted_s=0.04, model_s=0.02),
                    0.018)  # fmt: skip
    f = window_figures(document(status), older)
    assert f["step_time_ratio"] == pytest.approx(0.9), "measured over the model before any scale"


def test_the_first_document_read_reports_the_engines_record_of_its_batch_steps(tmp_path):
    """A run's first read has no window yet, but an engine that timed batch steps before (an
    earlier run on the same replica) already knows how far the model is off on its host."""
    import asyncio
    import json

    from serving.engine_control import ControlTarget
    from serving.engine_site.control_files import STATUS_FILE
    from serving.plugin_sensor import PluginStatusSensor

    status = EngineStatus(None, wall=lambda: 100.0)
    status.step(StepRecord(chat_decode=4, predicted_s=0.01, model_s=0.01), 0.05)  # not batch
    for measured in (0.05, 0.07):
        status.step(StepRecord(batch_prefill=64, predicted_s=0.02, model_s=0.02), measured)
    (tmp_path / STATUS_FILE).write_text(json.dumps(document(status)))
    sensor = PluginStatusSensor({"r0": ControlTarget("r0", folder=tmp_path)})
    first = asyncio.run(sensor.observe())["r0"]
    assert first.engine_step_time_ratio == pytest.approx(3.0)
    assert first.step_time_ratio is None and first.chat_itl_p99_s is None and first.window_s is None
    assert sensor.step_rows == [], "one document is no window"


def test_engine_status_shows_how_many_steps_of_the_last_interval_ran_at_the_target():
    from flows.cli_engine import plugin_line

    status = EngineStatus(None)
    for bound in (True, True, False):
        status.step(StepRecord(batch_prefill=64 * bound, chat_decode=2, target_bound=bound), 0.02)
    line = plugin_line("r0", status.document({"state": "active", "batch_step_target_ms": 20}))
    assert "3 steps (2 at the target)" in line and "target 20 ms" in line
    assert "model x" not in line  # a status written before the plug-in reported its scale
    doc = status.document({"state": "active", "batch_step_target_ms": 20, "model_scale": 1.07})
    assert "model x1.07 here" in plugin_line("r0", doc)
    doc = status.document(
        {"state": "active", "batch_step_target_ms": 40, "mean_step_target_ms": 12}
    )
    assert "target 40 ms, mean 12 ms" in plugin_line("r0", doc)


def test_chats_cached_histories_reach_the_controller_and_engine_status(tmp_path):
    """The newest status's count, not a difference: it is a size, not a counter."""
    import asyncio
    import json

    from flows.cli_engine import plugin_line
    from serving.engine_control import ControlTarget
    from serving.engine_site.control_files import STATUS_FILE
    from serving.plugin_sensor import PluginStatusSensor

    clock = iter([100.0, 101.0])
    status = EngineStatus(None, wall=lambda: next(clock))
    sensor = PluginStatusSensor({"r0": ControlTarget("r0", folder=tmp_path)})
    for tokens in (4096, 2048):
        status.step(StepRecord(chat_decode=4), 0.02)
        doc = status.document({"state": "active", "chat_cache_tokens": tokens})
        (tmp_path / STATUS_FILE).write_text(json.dumps(doc))
        seen = asyncio.run(sensor.observe())
    assert seen["r0"].chat_cache_tokens == 2048
    assert sensor.step_rows[-1]["chat_cache_tokens"] == 2048
    assert "chat's cached histories 2048 tokens" in plugin_line("r0", doc)


def test_a_status_is_written_as_the_engine_drains_so_its_idle_spell_starts_counted(tmp_path):
    """Written once a second while the engine steps, and at once when it has nothing left to
    run after steps not yet written; never again while it stays drained."""
    import json

    path = tmp_path / "status.json"
    status = EngineStatus(path)
    control = lambda: {"state": "active"}  # noqa: E731
    status.step(StepRecord(chat_decode=4), 0.01)
    assert status.maybe_write(10.0, control)  # the first write is due
    status.chat_itl.observe(0.3)
    status.step(StepRecord(chat_decode=4), 0.01)
    assert not status.maybe_write(10.2, control)  # busy, and not yet a second since
    assert status.maybe_write(10.3, control, drained=True)  # drained: at once
    assert json.loads(path.read_text())["chat_itl_seconds"]["count"] == 1
    assert not status.maybe_write(10.4, control, drained=True)  # nothing new since


@pytest.mark.parametrize("longest", [12, 96, 1000])
def test_chats_answer_length_p99_is_the_engines_record_from_the_first_read(tmp_path, longest):
    """Read over every answer since the engine started, not one window's few: a run's first
    decision already knows it (chat ran before the backlog), within a bucket's 5%."""
    import asyncio
    import json

    from serving.engine_control import ControlTarget
    from serving.engine_site.control_files import STATUS_FILE
    from serving.plugin_sensor import PluginStatusSensor

    status = EngineStatus(None, wall=lambda: 100.0)
    for tokens in (*[4] * 98, longest, longest):  # the p99 of 100 falls on the longest two
        status.chat_answer_tokens.observe(tokens)
    doc = document(status)
    (tmp_path / STATUS_FILE).write_text(json.dumps(doc))
    sensor = PluginStatusSensor({"r0": ControlTarget("r0", folder=tmp_path)})
    p99 = asyncio.run(sensor.observe())["r0"].chat_answer_tokens_p99
    assert p99 == pytest.approx(longest, rel=0.05)
    del doc["chat_answer_tokens"]  # a plug-in from before the count
    (tmp_path / STATUS_FILE).write_text(json.dumps(doc))
    fresh = PluginStatusSensor({"r0": ControlTarget("r0", folder=tmp_path)})
    assert asyncio.run(fresh.observe())["r0"].chat_answer_tokens_p99 is None
