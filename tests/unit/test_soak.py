"""The soak's pure parts: its schedule, its memory roles and growth, its document ledger and the
figures it reports (bench/soak_plan.py, soak_memory.py, soak_report.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from bench.soak_memory import MEASURED, ProcessMemory, by_role, growth, role_of, unmeasured
from bench.soak_plan import (
    DOCS_PER_MINUTE,
    FAULT_FRACTIONS,
    RESUME_MARGIN_S,
    chat_period_s,
    deadline_hhmm,
    default_docs,
    end_sample_at,
    engine_config_for,
    fault_ready,
    fault_schedule,
    may_start_attempt,
    night_deadline,
)
from bench.soak_report import (
    failures,
    format_report,
    latest_status,
    ledger,
    metrics_outage,
    parse_run_summary,
    slo_windows_held,
)

# -- the schedule ---------------------------------------------------------------------------


def test_faults_land_at_their_fractions_in_time_order() -> None:
    schedule = fault_schedule(7200.0)
    assert [p.name for p in schedule] == sorted(FAULT_FRACTIONS, key=FAULT_FRACTIONS.get)
    assert [p.at_s for p in schedule] == sorted(p.at_s for p in schedule)
    assert all(0 < p.at_s < 7200 for p in schedule)


def test_a_shorter_night_compresses_the_schedule() -> None:
    long, short = fault_schedule(7200.0), fault_schedule(300.0)
    assert [p.name for p in long] == [p.name for p in short]
    assert all(a.at_s / 24 == pytest.approx(b.at_s) for a, b in zip(long, short, strict=True))


@pytest.mark.parametrize("fractions", [{"x": 0.0}, {"x": 1.0}, {"x": -0.1}])
def test_a_fault_outside_the_night_is_refused(fractions: dict) -> None:
    with pytest.raises(ValueError, match="strictly between"):
        fault_schedule(600.0, fractions)
    with pytest.raises(ValueError):
        fault_schedule(0.0)


def test_faults_on_a_run_wait_for_a_running_attempt_the_others_do_not() -> None:
    assert not fault_ready("worker-killed", run_running=False)
    assert not fault_ready("gate-killed", run_running=False)
    assert not fault_ready("run-killed", run_running=False)
    assert fault_ready("run-killed", run_running=True)
    assert fault_ready("prometheus-stopped", run_running=False)
    assert fault_ready("replica-restarted", run_running=False)


def test_the_deadline_is_the_nearest_whole_minute() -> None:
    start = datetime(2025, 1, 1, 1, 0, 20, tzinfo=UTC).timestamp()
    deadline = night_deadline(start, 120)
    assert deadline % 60 == 0
    assert deadline - start == pytest.approx(7200 - 20)
    assert deadline_hhmm(deadline) == "03:00"
    assert night_deadline(start + 40, 120) - (start + 40) == pytest.approx(7200 + 0)


def test_a_short_night_keeps_a_floor_and_a_too_short_one_is_refused() -> None:
    start = datetime(2025, 1, 1, 1, 0, 59, tzinfo=UTC).timestamp()
    assert night_deadline(start, 3) - start >= 120
    with pytest.raises(ValueError, match="at least"):
        night_deadline(start, 2)


def test_no_attempt_starts_close_to_the_deadline() -> None:
    assert may_start_attempt(1000.0, 1000.0 + RESUME_MARGIN_S)
    assert not may_start_attempt(1000.0, 1000.0 + RESUME_MARGIN_S - 1)


def test_corpus_config_and_chat_swing() -> None:
    assert default_docs(120) == 120 * DOCS_PER_MINUTE and default_docs(0.01) == 16
    assert engine_config_for(True) == Path("engine_configs/cpu-small-fp32.yaml")
    assert engine_config_for(False) == Path("engine_configs/cpu-small.yaml")
    assert chat_period_s(600.0) == 300.0
    assert end_sample_at(7200.0, 7200.0) == 7170.0
    assert end_sample_at(300.0, 300.0) == 285.0  # 5% of a short night


# -- memory -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("owner", "cmd", "root", "role"),
    [
        ("replica", "python -m serving.replica_guard 12 /e/python -m vllm", False, "replica guard"),
        ("replica", "/e/python -m vllm.entrypoints.openai.api_server --model m", False,
         "replica API server"),
        ("replica", "VLLM::EngineCore", False, "replica engine core"),
        ("replica", "/e/python -B -c from multiprocessing.resource_tracker import main;main(31)",
         False, "replica resource tracker"),
        ("replica", "/e/python -c from multiprocessing.spawn import spawn_main", False,
         "replica worker"),
        ("run", "/v/python -m flows.cli run --corpus c", True, "run driver"),
        ("run", "/v/lib/ray/core/src/ray/gcs/gcs_server --port 1", False, "ray GCS"),
        ("run", "/v/lib/ray/core/src/ray/raylet/raylet --gcs-address=x", False, "ray raylet"),
        ("run", "ray::MapWorker(MapBatches(Summarize))", False, "ray worker Summarize"),
        ("run", "ray::MapWorker(MapBatches(Summarize)).submit", False, "ray worker Summarize"),
        ("run", "ray::MapWorker(MapBatches(Tokenize))", False, "ray worker Tokenize"),
        ("run", "ray::GateActor.acquire", False, "ray GateActor"),
        ("run", "ray::IDLE", False, "ray idle worker"),
        ("run", "/v/python -m uvicorn --app-factory prefect.server.api.server:create_app", False,
         "prefect server"),
        ("run", "/v/python -u /v/lib/ray/dashboard/agent.py --x", False, "ray agent"),
        ("run", "/v/python -u /v/lib/ray/autoscaler/_private/monitor.py", False, "ray agent"),
        ("prometheus", "/usr/bin/prometheus --config.file=p", True, "prometheus"),
        ("chat-load", "/v/python -m flows.cli chat-load", True, "chat-load"),
    ],
)  # fmt: skip
def test_each_process_gets_its_role(owner: str, cmd: str, root: bool, role: str) -> None:
    assert role_of(ProcessMemory(1, owner, cmd, 100, root)) == role


def idle(pid: int, mib: float) -> ProcessMemory:
    return ProcessMemory(pid, "run", "ray::IDLE", int(mib * 1024))


def test_roles_sum_and_average_their_processes() -> None:
    roles = by_role([idle(1, 100), idle(2, 300), ProcessMemory(3, "prometheus", "p", 2048, True)])
    assert roles["ray idle worker"] == {
        "processes": 2, "pids": [1, 2], "rss_mib": 400.0, "per_process_mib": 200.0,
        "command": "ray::IDLE",
    }  # fmt: skip
    assert roles["prometheus"]["per_process_mib"] == 2.0


def test_growth_is_judged_per_process_and_only_where_a_role_is_at_both_ends() -> None:
    start = by_role([idle(1, 100), ProcessMemory(5, "prometheus", "p", 100 * 1024, True)])
    end = by_role([idle(1, 104), idle(2, 106), ProcessMemory(6, "chat-load", "c", 50 * 1024, True)])
    rows = {r["role"]: r for r in growth(start, end)}
    workers = rows["ray idle worker"]
    assert workers["growth"] == pytest.approx(0.05) and not workers["over_limit"]
    assert not workers["same_processes"]  # a second worker by the end
    assert rows["prometheus"]["growth"] is None and not rows["prometheus"]["over_limit"]
    assert rows["chat-load"]["start_mib"] is None


def test_prometheus_is_reported_but_not_judged() -> None:
    prom = [ProcessMemory(5, "prometheus", "p", 100 * 1024, True)]
    grown = [ProcessMemory(5, "prometheus", "p", 150 * 1024, True)]
    (row,) = growth(by_role(prom), by_role(grown))
    assert row["growth"] == 0.5 and not row["judged"] and not row["over_limit"]


def test_a_long_lived_role_missing_at_either_end_is_unmeasured() -> None:
    everyone = [ProcessMemory(i, "x", "c", 1024) for i in range(len(MEASURED))]
    roles = {role: by_role([p])["x"] for role, p in zip(MEASURED, everyone, strict=True)}
    assert unmeasured(roles, roles) == []
    assert unmeasured(roles, {r: v for r, v in roles.items() if r != "run driver"}) == [
        "run driver"
    ]
    figures = ledger(["a"], [doc("a", "done")], ["a"], {"a"}, night_complete=True)
    (why,) = failures(figures, [], ["run driver"])
    assert "not measured" in why and "run driver" in why


def test_growth_past_the_limit_is_marked() -> None:
    start, end = by_role([idle(1, 100)]), by_role([idle(1, 111)])
    (row,) = growth(start, end)
    assert row["over_limit"] and row["same_processes"]
    (row,) = growth(start, by_role([idle(1, 110)]))
    assert not row["over_limit"]


# -- the ledger -------------------------------------------------------------------------------


def doc(doc_id: str, status: str, reason: str | None = None) -> dict:
    return {"doc_id": doc_id, "status": status, "reason": reason}


def test_the_latest_row_of_a_document_wins_but_a_skipped_twin_does_not() -> None:
    rows = [doc("a", "failed"), doc("a", "done"), doc("b", "done"), doc("b", "skipped")]
    assert latest_status(rows) == {"a": "done", "b": "done"}


def test_a_clean_night_loses_and_repeats_nothing() -> None:
    figures = ledger(["a", "b", "c"], [doc("a", "done"), doc("b", "failed")], ["a"], {"a"},
                     night_complete=False, warehouse_summary_ids=["a"])  # fmt: skip
    assert (figures["done"], figures["failed"], figures["left_to_do"]) == (1, 1, 1)
    assert figures["lost"] == figures["duplicated"] == 0
    assert figures["warehouse_summaries"] == 1


def test_failures_are_counted_by_their_last_line_without_colours() -> None:
    remote = (
        'no batch seat: \x1b[36mray::GateActor.acquire()\x1b[39m (pid=1)\n  File "gate.py", '
        "line 482\n    raise RuntimeError(...)\nRuntimeError: every replica is marked down\n"
    )
    rows = [doc("a", "failed", remote), doc("b", "failed", remote), doc("c", "failed", "empty"),
            doc("d", "failed", remote), doc("d", "done")]  # fmt: skip
    figures = ledger(["a", "b", "c", "d"], rows, ["d"], {"d"}, night_complete=True)
    assert figures["failed_reasons"] == {
        "RuntimeError: every replica is marked down": 2,
        "empty": 1,
    }
    assert figures["failed"] == 3 and figures["done"] == 1


def test_lost_documents_are_named_by_how_they_were_lost() -> None:
    figures = ledger(
        ["a", "b", "c", "d"],
        [doc("a", "done"), doc("b", "done")],
        ["b"],
        {"b", "c"},
        night_complete=True,
    )
    assert figures["lost_docs"] == {
        "done_without_summary": ["a"],
        "summary_vanished": ["c"],
        "never_recorded": ["c", "d"],
    }
    assert figures["lost"] == 3 and figures["left_to_do"] == 0


def test_documents_without_a_row_are_left_to_do_at_a_deadline_not_lost() -> None:
    figures = ledger(["a", "b"], [doc("a", "done")], ["a"], {"a"}, night_complete=False)
    assert figures["lost"] == 0 and figures["left_to_do"] == 1


def test_a_second_summary_in_files_or_warehouse_is_a_duplicate() -> None:
    rows = [doc("a", "done"), doc("b", "done")]
    figures = ledger(["a", "b"], rows, ["a", "a", "b"], {"a", "b"}, night_complete=True,
                     warehouse_summary_ids=["a", "b", "b"])  # fmt: skip
    assert figures["duplicated_run_files"] == {"a": 2}
    assert figures["duplicated_warehouse"] == {"b": 2}
    assert figures["duplicated"] == 2 and figures["lost"] == 0


def test_the_run_summary_line_is_read_with_and_without_a_deadline() -> None:
    out = (
        "noise\nrun soak-1: 12 done, 1 failed, 0 skipped, 3 already done, PARTIAL: 40 left at "
        "the deadline; 9,000 batch tokens in 60 s\nreport: x\nsoak-1\n"
    )
    assert parse_run_summary(out) == {
        "done": 12, "failed": 1, "skipped": 0, "already_done": 3, "left_at_deadline": 40,
        "partial": True,
    }  # fmt: skip
    whole = parse_run_summary("run r: 5 done, 0 failed, 0 skipped, 0 already done; 1 batch tokens")
    assert whole["partial"] is False and whole["left_at_deadline"] == 0
    assert parse_run_summary("Traceback (most recent call last):") is None


# -- chat and the controller ---------------------------------------------------------------


def window(idx: int, met: bool, requests: int = 5, window_s: float = 60.0) -> dict:
    return {"window_idx": idx, "t_start": 1000.0 + idx * window_s, "slo_met": met,
            "requests": requests}  # fmt: skip


def test_windows_held_overall_and_away_from_the_faults() -> None:
    windows = [window(0, True), window(1, False), window(2, True), window(3, True)]
    held = slo_windows_held([*windows, window(4, True, requests=0)], [(1070.0, 1100.0)], 60.0)
    assert (held["held"], held["total"], held["without_chat"]) == (3, 4, 1)
    assert (held["held_outside_faults"], held["total_outside_faults"]) == (3, 3)
    assert held["missed_windows"] == [1]


def decision(t: float, reason: str, pause: bool) -> dict:
    return {"t": t, "reason": reason, "pause": pause}


def test_the_metrics_outage_is_read_from_the_decisions() -> None:
    rows = [
        decision(99, "grow", False), decision(102, "hold", False), decision(104, "stale", True),
        decision(106, "stale", True), decision(131, "cold-start", False),
    ]  # fmt: skip
    out = metrics_outage(rows, stopped_at=100.0, resumed_at=130.0)
    assert out == {
        "first_stale_after_s": 4.0, "stale_decisions": 2, "paused_after_first_stale": True,
        "reopened_after_s": 1.0, "reopened_reason": "cold-start",
    }  # fmt: skip
    assert metrics_outage(rows[:2], 100.0, 130.0)["first_stale_after_s"] is None


def test_failures_and_the_table() -> None:
    figures = ledger(["a"], [doc("a", "done")], ["a"], {"a"}, night_complete=True)
    rows = growth(by_role([idle(1, 100)]), by_role([idle(1, 120)]))
    assert failures(figures, []) == []
    (why,) = failures(figures, rows)
    assert "ray idle worker" in why and "+20%" in why
    report = {
        "run_id": "soak-1", "night_s": 480.0, "engine_config": "cpu-small.yaml",
        "interrupted": False, "documents": figures, "chat_requests": 10,
        "slo_windows": slo_windows_held([window(0, True)], [], 60.0),
        "memory": {"growth": rows},
        "faults": [{"at_s": 72.0, "fault": "worker-killed", "ok": True, "detail": "killed 5",
                    "recovered_after_s": 30.0}],
        "attempts": [{"attempt": 1, "rc": 0, "why": "the night starts"}],
        "failures": [why],
    }  # fmt: skip
    table = format_report(report)
    assert "lost 0" in table and "worker-killed" in table and table.endswith(why)
