"""A run starts each replica at the slack mark the last controlled run on it left."""

from __future__ import annotations

import logging

from pipelines.slack_marks import last_slack_marks
from warehouse.run_files import SLO_DEFAULTS, RunMeta, run_dir, write_meta, write_table

SLO = dict(SLO_DEFAULTS)


def a_run(results, run_id, started, marks, engine="cpu-small", policy="slo", slo=SLO):
    """A run folder whose decisions record `marks`: (t, replica, slack mark) rows."""
    directory = run_dir(results, run_id)
    directory.mkdir(parents=True)
    meta = RunMeta(run_id, engine_config=engine, policy=policy, slo=slo, started=started)
    write_meta(directory, meta)
    rows = [dict(t=t, replica=r, batch_seats=1, chunk_tokens=0, slack_mark=m) for t, r, m in marks]
    write_table(directory, "decisions", rows, run_id=run_id, part="1")
    return directory


def test_each_replica_starts_where_its_last_controlled_run_left_it(tmp_path):
    a_run(tmp_path, "night-1", 100, [(101, "a", 0.70), (102, "b", 0.90), (150, "a", 0.72)])
    a_run(tmp_path, "night-2", 200, [(201, "a", 0.75), (260, "a", 0.78), (230, "a", 0.60)])
    marks = last_slack_marks(tmp_path, "cpu-small", ["a", "b", "c"], SLO)
    # a: night 2's latest decision; b: only night 1 measured it; c: never measured, left out.
    assert marks == {"a": 0.78, "b": 0.90}


def test_other_engine_configs_baselines_and_unmeasured_rows_are_not_read(tmp_path):
    a_run(tmp_path, "night-1", 100, [(101, "a", 0.70)])
    a_run(tmp_path, "other-model", 200, [(201, "a", 0.95)], engine="cpu-long")
    a_run(tmp_path, "baseline", 300, [(301, "a", None)], policy="static")
    a_run(tmp_path, "night-2", 400, [(401, "a", None), (402, "a", float("nan"))])
    assert last_slack_marks(tmp_path, "cpu-small", ["a"], SLO) == {"a": 0.70}


def test_a_damaged_run_is_skipped_with_a_warning_and_loses_nothing(tmp_path, caplog):
    a_run(tmp_path, "night-1", 100, [(101, "a", 0.70)])
    damaged = a_run(tmp_path, "night-2", 200, [(201, "a", 0.90)])
    (damaged / "decisions" / "1.parquet").write_bytes(b"not parquet")
    broken_meta = a_run(tmp_path, "night-3", 300, [(301, "a", 0.95)])
    (broken_meta / "run.json").write_text("{")
    with caplog.at_level(logging.WARNING, logger="pipelines.slack_marks"):
        assert last_slack_marks(tmp_path, "cpu-small", ["a"], SLO) == {"a": 0.70}
    skipped = " ".join(r.getMessage() for r in caplog.records)
    assert "night-2" in skipped and "night-3" in skipped
    assert (damaged / "decisions" / "1.parquet").read_bytes() == b"not parquet"


def test_no_results_folder_yet_means_no_marks(tmp_path):
    assert last_slack_marks(tmp_path / "absent", "cpu-small", ["a"], SLO) == {}


def test_a_run_that_read_other_pressures_or_other_windows_is_not_read(tmp_path):
    """An E2E p99 from a window's few answers, or any p99 over shorter windows, spreads wider
    than what this run will read: its mark is not this run's margin."""
    a_run(tmp_path, "itl-ttft", 100, [(101, "a", 0.80)])
    a_run(tmp_path, "with-e2e", 200, [(201, "a", 0.36)], slo={**SLO, "chat_e2e_p99_ms": 1500.0})
    a_run(tmp_path, "short-windows", 300, [(301, "a", 0.50)], slo={**SLO, "window_s": 15.0})
    other_values = {**SLO, "chat_itl_p99_ms": 61.7, "chat_ttft_p99_ms": 205.0}
    assert last_slack_marks(tmp_path, "cpu-small", ["a"], other_values) == {"a": 0.80}
    e2e = {**SLO, "chat_e2e_p99_ms": 4000.0}
    assert last_slack_marks(tmp_path, "cpu-small", ["a"], e2e) == {"a": 0.36}
