"""Loading runs: idempotent, all-or-nothing, one writer; named queries fail with clear errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.unit.test_warehouse_views import RUN, write_sample_run
from warehouse.db import WarehouseError, connect, db_path
from warehouse.load import LoadError, load_results, load_run
from warehouse.queries import QueryError, query, rows, sql_text
from warehouse.run_files import read_table, run_dir, write_table

SAMPLE_ROWS = {
    "runs": 1,
    "documents": 5,
    "summaries": 3,
    "requests": 9,
    "token_gaps": 13,
    "decisions": 5,
    "engine_itl": 0,
    "engine_ttft": 0,
    "engine_steps": 0,
}


def counts(results: Path, run_id: str = RUN) -> dict[str, int]:
    con = connect(db_path(results), read_only=True)
    try:
        return rows(con, "run_row_counts", run_id=run_id)[0]
    finally:
        con.close()


def test_loading_twice_keeps_one_copy(tmp_path: Path) -> None:
    write_sample_run(tmp_path)
    (first,) = load_results(tmp_path)
    (second,) = load_results(tmp_path, [RUN])
    assert first.rows == second.rows == SAMPLE_ROWS
    assert counts(tmp_path) == SAMPLE_ROWS


def test_reload_replaces_rows_and_rollups_and_spares_other_runs(tmp_path: Path) -> None:
    write_sample_run(tmp_path)
    write_sample_run(tmp_path, "other")
    load_results(tmp_path)
    directory = run_dir(tmp_path, RUN)
    requests = read_table(directory, "requests")
    write_table(directory, "requests", requests.slice(0, 3))  # c1, c2, b1 only
    load_results(tmp_path, [RUN])
    assert counts(tmp_path)["requests"] == 3
    assert counts(tmp_path, "other") == SAMPLE_ROWS
    con = connect(db_path(tmp_path), read_only=True)
    latency = {r["class"]: r for r in rows(con, "report_latency", run_id=RUN)}
    con.close()
    assert latency["chat"]["requests"] == 2
    # gaps of the dropped requests now belong to no request: kept, but no class claims them
    assert latency["chat"]["token_gaps"] == 5 and latency["batch"]["token_gaps"] == 2


def test_a_failed_load_leaves_the_warehouse_as_it_was(tmp_path: Path) -> None:
    write_sample_run(tmp_path)
    load_results(tmp_path)
    directory = run_dir(tmp_path, RUN)
    bad = read_table(directory, "requests").to_pylist()
    bad[-1]["t_submit"] = None  # required: the insert fails after earlier tables were replaced
    pq.write_table(pa.Table.from_pylist(bad), directory / "requests.parquet")
    with pytest.raises(LoadError, match=f"run {RUN}"):
        load_results(tmp_path)
    assert counts(tmp_path) == SAMPLE_ROWS


def test_rows_of_another_run_are_refused_on_load(tmp_path: Path) -> None:
    write_sample_run(tmp_path)
    directory = run_dir(tmp_path, RUN)
    stray = pa.table(
        {"run_id": ["intruder"], "request_id": ["c1"], "idx": [9], "gap_s": [0.1], "t": [1000.0]}
    )
    (directory / "token_gaps").mkdir()
    pq.write_table(stray, directory / "token_gaps" / "late.parquet")
    con = connect(db_path(tmp_path))
    with pytest.raises(LoadError, match="another or no run_id in {'token_gaps': 1}"):
        load_run(con, directory)
    con.close()


def test_reader_needs_an_existing_warehouse(tmp_path: Path) -> None:
    with pytest.raises(WarehouseError, match="no warehouse at .*nightshift ingest"):
        connect(db_path(tmp_path), read_only=True)


def test_a_second_writer_is_told_to_wait(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    connect(path).close()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import duckdb, sys; c = duckdb.connect(sys.argv[1]); print('ready', flush=True); "
            "sys.stdin.read()",
            str(path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(WarehouseError, match="another process"):
            connect(path)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


def test_named_query_errors(tmp_path: Path) -> None:
    con = connect(db_path(tmp_path))
    with pytest.raises(QueryError, match="no SQL named 'nope'.*report_windows"):
        sql_text("nope")
    with pytest.raises(QueryError, match=r"needs parameter\(s\) \['run_id'\]"):
        query(con, "report_cost")
    with pytest.raises(QueryError, match="holds 18 statements"):
        query(con, "load_run", run_id="x")
    con.close()


def test_a_request_recorded_twice_does_not_double_its_gaps(tmp_path: Path) -> None:
    write_sample_run(tmp_path)
    directory = run_dir(tmp_path, RUN)
    requests = read_table(directory, "requests")
    write_table(directory, "requests", pa.concat_tables([requests, requests.slice(0, 1)]))
    load_results(tmp_path)
    assert counts(tmp_path)["token_gaps"] == SAMPLE_ROWS["token_gaps"]


def test_a_warehouse_made_before_the_prefill_budget_column_loads_runs_that_carry_it(
    tmp_path: Path,
) -> None:
    old = duckdb.connect(str(db_path(tmp_path)))
    old.execute(
        "CREATE TABLE decisions (run_id VARCHAR NOT NULL, t DOUBLE NOT NULL, replica VARCHAR NOT "
        "NULL, batch_seats BIGINT NOT NULL, chunk_tokens BIGINT NOT NULL, pause BOOLEAN, "
        "observed_itl_p99_s DOUBLE, observed_ttft_p99_s DOUBLE, observed_kv_usage DOUBLE, "
        "predicted_step_ms DOUBLE, reason VARCHAR)"
    )
    old.close()
    write_sample_run(tmp_path)
    directory = run_dir(tmp_path, RUN)
    decisions = read_table(directory, "decisions")
    budgets = pa.array([2048 if i % 2 else None for i in range(decisions.num_rows)], pa.int64())
    i = decisions.schema.get_field_index("prefill_budget_tokens")
    write_table(directory, "decisions", decisions.set_column(i, "prefill_budget_tokens", budgets))
    load_results(tmp_path)
    con = connect(db_path(tmp_path), read_only=True)
    got = con.execute(
        "SELECT count(prefill_budget_tokens), max(prefill_budget_tokens) FROM decisions"
    )
    assert got.fetchone() == (decisions.num_rows // 2, 2048)
    con.close()
