"""OUT.json figures of a simulated run, and their agreement with the warehouse's SQL views."""

from __future__ import annotations

import duckdb
import pytest

from scheduler.admission import StaticCaps
from scheduler.slo import SLO
from simulator.config import SimConfig
from simulator.entities import Request, Segment
from simulator.recorder import Recorder
from simulator.run import simulate
from simulator.summary import RunTotals, summarize, window_count, window_verdicts
from warehouse.db import db_path
from warehouse.load import load_results
from warehouse.run_files import RunMeta, write_meta, write_table

SLO_50_1000 = SLO(chat_itl_p99_ms=50, chat_ttft_p99_ms=1000, window_s=60)


def finished(rec: Recorder, rid: str, cls: str, submit: float, times: list[float], **kw) -> None:
    req = Request(rid, cls, "chat", 0, submit, (Segment(rid, 100),), len(times), rid)
    req.token_times = list(times)
    req.output_tokens = len(times)
    rec.finish(req, times[-1] if times else submit, **kw)


def totals(seconds: float = 120.0) -> RunTotals:
    return RunTotals(seconds, 1.0, preemptions=0, kv_peak=0.5, docs_done=0, closed_at=seconds)


def test_an_itl_violation_fails_only_its_own_window():
    rec = Recorder("r")
    finished(rec, "fast", "chat", 1.0, [1.2 + 0.02 * i for i in range(100)])
    finished(rec, "slow", "chat", 70.0, [70.2 + 0.5 * i for i in range(20)])
    s = summarize(rec, totals(), SLO_50_1000)
    assert s["chat"]["slo_windows_met"] == 0.5
    assert s["chat"]["requests"] == 2


def test_ttft_counts_in_the_window_of_the_first_token():
    rec = Recorder("r")
    finished(rec, "late", "chat", 50.0, [61.5, 61.52])  # waited 11.5 s, answered in window 1
    s = summarize(rec, totals(), SLO_50_1000)
    assert s["chat"]["ttft_ms"]["p50"] == pytest.approx(11_500)
    assert s["chat"]["slo_windows_met"] == 0.5


def test_a_failed_chat_request_fails_its_window_and_counts_as_an_error():
    rec = Recorder("r")
    finished(rec, "ok", "chat", 1.0, [1.1, 1.12])
    finished(rec, "bad", "chat", 100.0, [], status="error", error="too long")
    s = summarize(rec, totals(), SLO_50_1000)
    assert s["chat"]["errors"] == 1
    assert s["chat"]["slo_windows_met"] == 0.5


def test_goodput_counts_batch_tokens_only_in_windows_that_held_the_slo():
    rec = Recorder("r")
    finished(rec, "slow", "chat", 70.0, [70.2 + 0.5 * i for i in range(20)])
    finished(rec, "b0", "batch", 0.0, [10.0, 10.1])  # 102 tokens, window 0 (met)
    finished(rec, "b1", "batch", 0.0, [80.0, 80.1])  # 102 tokens, window 1 (violated)
    s = summarize(rec, totals(), SLO_50_1000)
    assert s["batch"]["tokens_per_s"] == pytest.approx(204 / 120)
    assert s["batch"]["slo_batch_tokens_per_s"] == pytest.approx(102 / 120)


def test_a_partial_last_window_counts_like_the_warehouse_clock():
    assert window_count(120.0, 60.0) == 2
    assert window_count(130.0, 60.0) == 3
    assert window_count(30.0, 60.0) == 1


def test_slo_windows_agree_with_the_warehouse_views(tmp_path):
    cfg = SimConfig.model_validate(
        {
            "run_id": "agree",
            "duration_s": 300.0,
            "engine": {"kv_capacity_tokens": 120_000, "max_num_batched_tokens": 1024},
            "chat": {"rate": 3.0, "system_prompt_tokens": 2000, "context_tokens": 500},
            "batch": {"docs": 6, "doc_tokens": 30_000, "summary_tokens": 64, "mode": "whole"},
            "slo": {"chat_itl_p99_ms": 60.0, "chat_ttft_p99_ms": 500.0, "window_s": 30.0},
        }
    )

    class Steps:
        def step_seconds(self, batch):
            return 0.015 + 4e-5 * batch.total_tokens

    result = simulate(cfg, Steps())
    met = result.summary["chat"]["slo_windows_met"]
    assert 0 < met < 1  # a run with both kinds of windows tests the agreement
    run = tmp_path / "runs" / "agree"
    for name, table in result.tables().items():
        write_table(run, name, table, run_id="agree")
    write_meta(run, RunMeta("agree", slo=cfg.slo.model_dump(), started=0.0, ended=300.0))
    load_results(tmp_path, ["agree"])
    con = duckdb.connect(str(db_path(tmp_path)), read_only=True)
    sql_met = con.execute(
        "SELECT avg(slo_met::INT) FROM slo_windows WHERE run_id = 'agree' AND class = 'chat'"
    ).fetchone()[0]
    con.close()
    assert sql_met == pytest.approx(met)


def test_window_verdicts_keep_itl_and_ttft_apart():
    rec = Recorder("r")
    finished(rec, "gappy", "chat", 1.0, [1.2 + 0.5 * i for i in range(20)])  # ITL 500 ms, window 0
    finished(rec, "late", "chat", 70.0, [72.5, 72.52])  # TTFT 2.5 s, window 1
    v = window_verdicts(rec, totals(), SLO_50_1000)
    assert v.itl_met.tolist() == [False, True] and v.ttft_met.tolist() == [True, False]
    assert v.met.tolist() == [False, False]
    assert v.ttft_p99_ms[1] == pytest.approx(2500)


def test_batch_prefill_is_counted_in_the_window_its_step_ended():
    cfg = SimConfig.model_validate(
        {
            "duration_s": 60.0,
            "engine": {"kv_capacity_tokens": 100_000, "max_num_batched_tokens": 1000},
            "batch": {"docs": 1, "doc_tokens": 5000, "instruction_tokens": 0, "mode": "whole"},
            "slo": {"window_s": 10.0},
        }
    )

    class Steps:
        def step_seconds(self, batch):
            return 3.0  # chunks of 1000 end at 3, 6, 9 s (window 0), then 12 and 15 s (window 1)

    result = simulate(cfg, Steps(), lambda _name: StaticCaps(1, 1000))
    assert result.sim.batch_prefill_by_window == {0: 3000, 1: 2000}
