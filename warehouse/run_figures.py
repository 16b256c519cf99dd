"""A run's morning figures from the warehouse: latency per class, batch goodput, cost.

What a platform team reads first after a night (the demo prints them): one query per view, all
rows of the run, as plain dicts; and, for a night of a handful of windows and documents (`make
demo-long`), chat's p99s per SLO window and what each document's requests were.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from warehouse.db import connect, db_path


@dataclass(frozen=True)
class RunFigures:
    """The run's `class_latency` rows, its `batch_goodput` and `cost` rows, its chat rows of
    `slo_windows` in window order, and its documents in id order, each with the count and token
    sums of its batch requests that finished (`requests`, `request_prompt_tokens`,
    `cached_tokens`; 0 and NULL for a document with none) and their `stages`."""

    db: Path
    latency: list[dict]
    goodput: dict
    cost: dict
    windows: list[dict]
    documents: list[dict]


def run_figures(results: Path | str, run_id: str) -> RunFigures:
    """The figures of `run_id` from the DuckDB file under `results` (read-only)."""
    db = db_path(results)
    con = connect(db, read_only=True)
    try:

        def records(sql: str) -> list[dict]:
            return con.execute(sql, [run_id]).fetch_df().to_dict("records")

        def plain(sql: str) -> list[dict]:
            """Rows with NULL as None (pandas reads a NULL string as NaN)."""
            return con.sql(sql, params=[run_id]).to_arrow_table().to_pylist()

        latency = records("SELECT * FROM class_latency WHERE run_id = ? ORDER BY class")
        goodput = records("SELECT * FROM batch_goodput WHERE run_id = ?")[0]
        cost = records("SELECT * FROM cost WHERE run_id = ?")[0]
        windows = plain(
            "SELECT * FROM slo_windows WHERE run_id = ? AND class = 'chat' ORDER BY window_idx"
        )
        documents = plain(DOCUMENTS)
    finally:
        con.close()
    return RunFigures(db, latency, goodput, cost, windows, documents)


DOCUMENTS = """
SELECT d.doc_id, d.status, d.reason, d.prompt_tokens AS doc_tokens,
       count(r.request_id) AS requests,
       sum(r.prompt_tokens) AS request_prompt_tokens,
       sum(r.cached_tokens) AS cached_tokens,
       string_agg(DISTINCT r.stage, ',' ORDER BY r.stage) AS stages
FROM documents d
LEFT JOIN requests r
    ON r.run_id = d.run_id AND r.doc_id = d.doc_id AND r.class = 'batch' AND r.status = 'ok'
WHERE d.run_id = ?
GROUP BY ALL
ORDER BY d.doc_id
"""
