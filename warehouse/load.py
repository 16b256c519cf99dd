"""Load a run's files into the warehouse, idempotently: loading a run again replaces its rows.

A load is one transaction: readers see the old run or the new one, never half of each, and a
load that fails leaves the warehouse as it was.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa

from scheduler.run_schemas import RUN_TABLES
from warehouse.db import connect, db_path
from warehouse.queries import QueryError, rows, run_script
from warehouse.run_files import RunMeta, check_table_files, list_runs, read_meta, run_dir


@dataclass
class LoadResult:
    """What one load put into the warehouse."""

    run_id: str
    rows: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


def runs_row(meta: RunMeta) -> pa.Table:
    """run.json as the one row the `runs` table keeps, SLO fields flattened for SQL."""
    return pa.Table.from_pylist(
        [
            {
                "run_id": meta.run_id,
                "engine_config": meta.engine_config,
                "policy": meta.policy,
                "hardware_count": meta.hardware_count,
                "replicas": meta.replicas,
                "hourly_usd": meta.hourly_usd,
                "slo_itl_p99_ms": meta.slo["chat_itl_p99_ms"],
                "slo_ttft_p99_ms": meta.slo["chat_ttft_p99_ms"],
                "slo_e2e_p99_ms": meta.slo["chat_e2e_p99_ms"],
                "window_s": meta.slo["window_s"],
                "started": meta.started,
                "ended": meta.ended,
                "corpus_path": meta.corpus_path,
                "corpus_fingerprint": meta.corpus_fingerprint,
            }
        ],
        schema=pa.schema(
            [
                ("run_id", pa.string()),
                ("engine_config", pa.string()),
                ("policy", pa.string()),
                ("hardware_count", pa.int64()),
                ("replicas", pa.int64()),
                ("hourly_usd", pa.float64()),
                ("slo_itl_p99_ms", pa.float64()),
                ("slo_ttft_p99_ms", pa.float64()),
                ("slo_e2e_p99_ms", pa.float64()),
                ("window_s", pa.float64()),
                ("started", pa.float64()),
                ("ended", pa.float64()),
                ("corpus_path", pa.string()),
                ("corpus_fingerprint", pa.string()),
            ]
        ),
    )


# What load_run.sql reads: one relation per table of the run, and run.json as the `runs` row.
INCOMING: tuple[str, ...] = (*(f"incoming_{t}" for t in RUN_TABLES), "incoming_runs")


class LoadError(RuntimeError):
    """A run that cannot go into the warehouse; the message names the run and what to fix."""


def load_run(con: duckdb.DuckDBPyConnection, directory: Path | str) -> LoadResult:
    """Replace run `<directory>/run.json`'s rows in every table with the contents of its files.

    DuckDB streams the Parquet files straight into the tables (nothing is held in memory here), so
    a night with hundreds of millions of token gaps loads as well as a small one.
    """
    start = time.perf_counter()
    meta = read_meta(directory)
    try:
        _register_incoming(con, directory, meta)
        _refuse_foreign_rows(con, meta.run_id)
        con.begin()
        try:
            run_script(con, "load_run", run_id=meta.run_id)
            run_script(con, "rollup_run", run_id=meta.run_id)
            con.commit()
        except BaseException:
            con.rollback()
            raise
    except (duckdb.Error, QueryError) as err:
        raise LoadError(
            f"run {meta.run_id} from {directory}: {err}; fix the files and load again"
        ) from err
    finally:
        for name in INCOMING:
            con.unregister(name)  # a name never registered is ignored
    counts = rows(con, "run_row_counts", run_id=meta.run_id)[0]
    return LoadResult(meta.run_id, counts, time.perf_counter() - start)


def _register_incoming(
    con: duckdb.DuckDBPyConnection, directory: Path | str, meta: RunMeta
) -> None:
    """Expose each table's files as `incoming_<table>` (an empty table when the run wrote none)."""
    for table, schema in RUN_TABLES.items():
        files = check_table_files(directory, table)
        source = (
            con.read_parquet([str(f) for f in files], union_by_name=True)
            if files
            else schema.empty_table()
        )
        con.register(f"incoming_{table}", source)
    con.register("incoming_runs", runs_row(meta))


def _refuse_foreign_rows(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    foreign = rows(con, "incoming_foreign_rows", run_id=run_id)[0]
    bad = {table: n for table, n in foreign.items() if n}
    if bad:
        raise LoadError(
            f"run {run_id}: rows with another or no run_id in {bad}; "
            "each run directory must hold only its own rows"
        )


def load_results(results: Path | str, run_ids: list[str] | None = None) -> list[LoadResult]:
    """Load runs under `results/runs/` (all of them by default) into `results/nightshift.duckdb`."""
    run_ids = run_ids if run_ids else list_runs(results)
    con = connect(db_path(results))
    try:
        return [load_run(con, run_dir(results, run_id)) for run_id in run_ids]
    finally:
        con.close()
