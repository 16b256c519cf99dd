"""A run's morning figures from the warehouse: latency per class, batch goodput, cost.

What a platform team reads first after a night (the demo prints them): one query per view, all
rows of the run, as plain dicts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from warehouse.db import connect, db_path


@dataclass(frozen=True)
class RunFigures:
    """The run's `class_latency` rows, and its `batch_goodput` and `cost` rows."""

    db: Path
    latency: list[dict]
    goodput: dict
    cost: dict


def run_figures(results: Path | str, run_id: str) -> RunFigures:
    """The figures of `run_id` from the DuckDB file under `results` (read-only)."""
    db = db_path(results)
    con = connect(db, read_only=True)
    try:

        def records(sql: str) -> list[dict]:
            return con.execute(sql, [run_id]).fetch_df().to_dict("records")

        latency = records("SELECT * FROM class_latency WHERE run_id = ? ORDER BY class")
        goodput = records("SELECT * FROM batch_goodput WHERE run_id = ?")[0]
        cost = records("SELECT * FROM cost WHERE run_id = ?")[0]
    finally:
        con.close()
    return RunFigures(db, latency, goodput, cost)
