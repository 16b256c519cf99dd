"""OUT.csv beside OUT.json: the same figures as flat rows, for a spreadsheet or a dataframe.

Columns are the JSON keys joined with dots (`chat.ttft_ms.p99`, `batch.slo_batch_tokens_per_s`),
so a column names the very figure the JSON holds; lists are left out (they do not fit a cell).
The bench writes one row per scenario, chat-load one row for its run.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path
from typing import Any

STDOUT = Path("-")


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as one level of dotted keys; scalars only."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat |= flatten(value, f"{name}.")
        elif not isinstance(value, list | tuple):
            flat[name] = value
    return flat


def scenario_rows(out: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per scored scenario of a bench's OUT.json, its name first."""
    return [{"scenario": name, **flatten(s)} for name, s in out.get("scenarios", {}).items()]


def csv_path(json_path: Path | None) -> Path | None:
    """Where the CSV goes: beside the JSON file, same stem; None when JSON goes to stdout."""
    if json_path is None or json_path == STDOUT:
        return None
    return json_path.with_suffix(".csv")


def write_rows(rows: list[Mapping[str, Any]], path: Path) -> Path:
    """Rows as CSV with the union of their columns, in first-seen order; blanks where missing."""
    columns: dict[str, None] = {}
    for row in rows:
        columns |= dict.fromkeys(row)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(columns), restval="")
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_csv(out: Mapping[str, Any], json_path: Path | None) -> Path | None:
    """A bench's OUT.csv beside its OUT.json (one row per scenario); None with JSON on stdout."""
    path = csv_path(json_path)
    return write_rows(scenario_rows(out), path) if path is not None else None
