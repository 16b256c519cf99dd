"""A run's files: schemas in step with the producers' records, writing, reading, and bad input."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from scheduler.records import RequestRecord, TokenGap
from scheduler.run_schemas import REQUESTS, RUN_TABLES, TOKEN_GAPS
from scheduler.slo import SLO
from warehouse.run_files import (
    RunFilesError,
    RunMeta,
    check_table_files,
    conform,
    corpus_fingerprint,
    list_runs,
    read_meta,
    read_table,
    run_dir,
    table_files,
    write_meta,
    write_table,
)


def record(rid: str = "q1", run_id: str = "run-1") -> RequestRecord:
    r = RequestRecord(run_id, rid, "chat", "chat", "r0", prompt_tokens=10, t_submit=100.0)
    r.finish([100.2, 100.25, 100.3], 100.3)
    return r


def test_schemas_match_the_producers_records() -> None:
    assert sorted(REQUESTS.names) == sorted(record().row())
    gap_fields = [f.name for f in dataclasses.fields(TokenGap)]
    assert TOKEN_GAPS.names == ["run_id", *gap_fields]


def test_run_meta_slo_matches_the_slo_model() -> None:
    assert set(RunMeta("x").slo) == set(SLO.model_fields)
    assert RunMeta("x", slo=SLO(chat_itl_p99_ms=40).model_dump()).slo["chat_itl_p99_ms"] == 40


def test_requests_round_trip(tmp_path: Path) -> None:
    rows = [record("a").row(), record("b").row()]
    write_table(tmp_path, "requests", rows)
    back = read_table(tmp_path, "requests")
    assert back.schema == REQUESTS
    assert back.to_pylist() == rows


def test_gaps_get_the_run_id_filled_in(tmp_path: Path) -> None:
    gaps = [dataclasses.asdict(g) for g in record().gaps]
    write_table(tmp_path, "token_gaps", gaps, run_id="run-1")
    back = read_table(tmp_path, "token_gaps")
    assert back.column("run_id").to_pylist() == ["run-1", "run-1"]
    assert back.column("gap_s").to_pylist() == pytest.approx([0.05, 0.05])


def test_missing_optional_columns_become_null(tmp_path: Path) -> None:
    write_table(tmp_path, "documents", [{"doc_id": "d1", "status": "skipped"}], run_id="run-1")
    (row,) = read_table(tmp_path, "documents").to_pylist()
    assert row == {
        "run_id": "run-1",
        "doc_id": "d1",
        "status": "skipped",
        "reason": None,
        "prompt_tokens": None,
        "sections": None,
        "summary_tokens": None,
        "t_done": None,
    }


def test_unknown_column_is_named() -> None:
    with pytest.raises(RunFilesError, match="unknown column.*'colour'"):
        conform("documents", [{"run_id": "x", "doc_id": "d", "status": "done", "colour": 1}])


def test_missing_required_column_is_named() -> None:
    with pytest.raises(RunFilesError, match="required column 'status'"):
        conform("documents", [{"run_id": "x", "doc_id": "d"}])
    with pytest.raises(RunFilesError, match="'doc_id' has 1 null"):
        conform("documents", [{"run_id": "x", "doc_id": None, "status": "done"}])


def test_wrong_type_is_named() -> None:
    table = pa.table({"run_id": ["x"], "doc_id": ["d"], "status": ["done"], "sections": ["many"]})
    with pytest.raises(RunFilesError, match="'sections' is string"):
        conform("documents", table)


def test_rows_of_another_run_are_refused(tmp_path: Path) -> None:
    with pytest.raises(RunFilesError, match="rows of run.*other"):
        write_table(tmp_path, "requests", [record(run_id="other").row()], run_id="run-1")


def test_parts_append_after_the_main_file(tmp_path: Path) -> None:
    write_table(tmp_path, "requests", [record("a").row()])
    write_table(tmp_path, "requests", [record("c").row()], part="0002")
    write_table(tmp_path, "requests", [record("b").row()], part="0001")
    assert [p.name for p in table_files(tmp_path, "requests")] == [
        "requests.parquet",
        "0001.parquet",
        "0002.parquet",
    ]
    assert read_table(tmp_path, "requests").column("request_id").to_pylist() == ["a", "b", "c"]


def test_a_table_never_written_reads_empty(tmp_path: Path) -> None:
    for name, schema in RUN_TABLES.items():
        assert read_table(tmp_path, name).schema == schema
        assert read_table(tmp_path, name).num_rows == 0


def test_unknown_table_is_named(tmp_path: Path) -> None:
    with pytest.raises(RunFilesError, match="unknown table 'request'"):
        write_table(tmp_path, "request", [])


def test_check_table_files_reads_footers_only(tmp_path: Path) -> None:
    pq.write_table(
        pa.table({"run_id": ["x"], "doc_id": ["d"], "status": ["done"]}),
        tmp_path / "documents.parquet",
    )
    assert check_table_files(tmp_path, "documents") == [tmp_path / "documents.parquet"]
    pq.write_table(
        pa.table({"run_id": ["x"], "doc_id": ["d"], "status": ["done"], "t_done": ["now"]}),
        tmp_path / "documents.parquet",
    )
    with pytest.raises(RunFilesError, match="'t_done' is string"):
        check_table_files(tmp_path, "documents")
    pq.write_table(pa.table({"run_id": ["x"], "doc_id": ["d"]}), tmp_path / "documents.parquet")
    with pytest.raises(RunFilesError, match=r"required column\(s\) \['status'\]"):
        check_table_files(tmp_path, "documents")


def test_meta_round_trip(tmp_path: Path) -> None:
    meta = RunMeta(
        "night-1",
        engine_config="h200-70b",
        hardware_count=8,
        hourly_usd=98.0,
        slo={"chat_itl_p99_ms": 40.0},
        started=1.0,
        ended=2.0,
        corpus_path="c.parquet",
        corpus_fingerprint="sha256:00",
    )
    write_meta(tmp_path, meta)
    back = read_meta(tmp_path)
    assert back == meta
    assert back.slo == {
        "chat_itl_p99_ms": 40.0,
        "chat_ttft_p99_ms": 1000.0,
        "window_s": 60.0,
        "chat_e2e_p99_ms": None,
    }


def test_meta_errors_say_what_to_fix(tmp_path: Path) -> None:
    with pytest.raises(RunFilesError, match="no run.json"):
        read_meta(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "x", "hourly_usd": 1, "gpus": 8}))
    with pytest.raises(RunFilesError, match=r"unknown key\(s\) \['gpus'\]"):
        read_meta(tmp_path)
    (tmp_path / "run.json").write_text("{not json")
    with pytest.raises(RunFilesError, match="not valid JSON"):
        read_meta(tmp_path)
    with pytest.raises(RunFilesError, match="unknown SLO key"):
        RunMeta("x", slo={"itl_ms": 1})


@pytest.mark.parametrize("bad", ["", "../up", "a/b", ".hidden", "sp ace"])
def test_run_id_must_be_a_plain_name(bad: str) -> None:
    with pytest.raises(RunFilesError, match="not usable as a directory name"):
        RunMeta(bad)


def test_list_runs_and_run_dir(tmp_path: Path) -> None:
    for run_id in ("b", "a"):
        directory = run_dir(tmp_path, run_id)
        directory.mkdir(parents=True)
        write_meta(directory, RunMeta(run_id))
    (tmp_path / "runs" / "stray").mkdir()
    assert list_runs(tmp_path) == ["a", "b"]
    assert list_runs(tmp_path / "nowhere") == []


def test_corpus_fingerprint(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"doc_id": "1", "text": "x"}\n')
    first = corpus_fingerprint(path, chunk_bytes=4)
    assert first == corpus_fingerprint(path) and first.startswith("sha256:")
    path.write_text('{"doc_id": "1", "text": "y"}\n')
    assert corpus_fingerprint(path) != first
