"""The request journal: what a killed attempt did is recorded once, marked for what it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.request_journal import (
    GATE_DIED_IN_FLIGHT,
    KILLED_IN_FLIGHT,
    WORKER_DIED_IN_FLIGHT,
    RequestJournal,
    journaled_rows,
    read_events,
    unrecorded_requests,
)
from pipelines.run_store import RunStore
from warehouse.run_files import RunMeta, read_table


def _row(request_id: str, doc_id: str, status: str = "ok") -> dict:
    return {
        "run_id": "r",
        "request_id": request_id,
        "class": "batch",
        "stage": "map",
        "replica": "a",
        "doc_id": doc_id,
        "prompt_tokens": 100,
        "output_tokens": 8,
        "t_submit": 1.0,
        "status": status,
    }


def _journal(path: Path) -> None:
    j = RequestJournal(path)
    j.granted("p1", "done-doc", "whole", "a", 100, 1.0)  # recorded with its document
    j.released("p1", _row("q1", "done-doc"))
    j.granted("p2", "half-doc", "map", "a", 100, 2.0)  # section finished, document did not
    j.released("p2", _row("q2", "half-doc"))
    j.granted("p3", "half-doc", "map", "a", 90, 3.0)  # in flight at the kill
    j.close()
    with path.open("a") as f:
        f.write('{"event": "gran')  # the last line, cut short by the kill


def test_unfinished_work_is_marked_and_recorded_work_skipped(tmp_path: Path) -> None:
    _journal(tmp_path / "j.jsonl")
    events = read_events(tmp_path / "j.jsonl")
    rows = unrecorded_requests("r", events, recorded={"q1"}, finished_docs={"done-doc"})
    by_id = {r["request_id"]: r for r in rows}
    assert set(by_id) == {"q2", "p3"}
    assert by_id["q2"]["status"] == "cancelled" and by_id["q2"]["error"].startswith("killed:")
    assert "ended ok" in by_id["q2"]["error"] and by_id["q2"]["output_tokens"] == 8
    assert by_id["p3"]["status"] == "cancelled" and by_id["p3"]["error"] == KILLED_IN_FLIGHT
    assert by_id["p3"]["stage"] == "map" and by_id["p3"]["prompt_tokens"] == 90


def test_a_record_lost_for_a_finished_document_keeps_its_status() -> None:
    events = [
        {"event": "granted", "permit_id": "p1", "doc_id": "d", "stage": "whole", "replica": "a",
         "prompt_tokens": 5, "t": 1.0},
        {"event": "released", "permit_id": "p1", "row": _row("q1", "d")},
    ]  # fmt: skip
    (row,) = unrecorded_requests("r", events, recorded=set(), finished_docs={"d"})
    assert row["status"] == "ok" and row["error"].startswith("recovered:")


def test_store_records_the_journal_once_and_removes_it(tmp_path: Path) -> None:
    store = RunStore(tmp_path, "r")
    store.begin(RunMeta(run_id="r", corpus_fingerprint="f"))
    assert (store.dir.stat().st_mode & 0o777) == 0o700
    _journal(store.new_journal())
    first = store.recover_journal()
    assert {r["request_id"] for r in first} == {"q1", "q2", "p3"}  # nothing was recorded yet
    assert not list((store.dir / "journal").glob("*.jsonl"))
    assert store.recover_journal() == []
    assert read_table(store.dir, "requests").num_rows == 3


def test_what_ended_the_attempt_names_the_requests_never_released(tmp_path: Path) -> None:
    store = RunStore(tmp_path, "r")
    store.begin(RunMeta(run_id="r", corpus_fingerprint="f"))
    _journal(store.new_journal())
    rows = {r["request_id"]: r for r in store.recover_journal(GATE_DIED_IN_FLIGHT)}
    assert rows["p3"]["error"] == GATE_DIED_IN_FLIGHT and rows["p3"]["status"] == "cancelled"
    assert rows["q2"]["error"].startswith("killed: the run stopped before document half-doc")


def test_a_permit_given_back_without_a_record_keeps_the_reason_it_was_given_back() -> None:
    events = [
        {"event": "granted", "permit_id": "p1", "doc_id": "d", "stage": "whole", "replica": "a",
         "prompt_tokens": 5, "t": 1.0},
        {"event": "released", "permit_id": "p1", "row": None, "reason": WORKER_DIED_IN_FLIGHT},
    ]  # fmt: skip
    (row,) = unrecorded_requests("r", events, recorded=set(), finished_docs={"d"})
    assert (row["status"], row["error"]) == ("cancelled", WORKER_DIED_IN_FLIGHT)


def test_the_gates_own_rows_are_recorded_from_the_journal_once(tmp_path: Path) -> None:
    store = RunStore(tmp_path, "r")
    store.begin(RunMeta(run_id="r", corpus_fingerprint="f"))
    path = store.new_journal()
    j = RequestJournal(path)
    decision = {"run_id": "r", "t": 1.0, "replica": "a", "batch_seats": 2, "chunk_tokens": 0,
                "pause": False, "reason": "hold", "batch_step_target_ms": 20.0}  # fmt: skip
    j.recorded("decisions", decision)
    j.recorded("decisions", {**decision, "t": 3.0, "reason": "cut"})
    j.recorded("engine_steps", {"run_id": "r", "t": 2.0, "replica": "a", "steps": 40})
    j.close()  # a Gate killed here: its rows are in the journal, nowhere else
    events = read_events(path)
    assert [r["t"] for r in journaled_rows(events)["decisions"]] == [1.0, 3.0]
    store.recover_journal()
    store.recover_journal()  # the journal is gone: nothing recorded twice
    decisions = read_table(store.dir, "decisions").to_pylist()
    assert [(d["t"], d["reason"]) for d in decisions] == [(1.0, "hold"), (3.0, "cut")]
    assert read_table(store.dir, "engine_steps").column("steps").to_pylist() == [40]


def test_only_the_gates_tables_are_journaled(tmp_path: Path) -> None:
    j = RequestJournal(tmp_path / "j.jsonl")
    with pytest.raises(ValueError, match="'summaries' is not journaled"):
        j.recorded("summaries", {})
