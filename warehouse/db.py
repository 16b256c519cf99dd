"""Opening `results/nightshift.duckdb`: one writer at a time, any number of readers after it.

DuckDB itself locks the file for a writing process; this module turns that lock, and a warehouse
that does not exist yet, into errors that say what to do.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from warehouse.queries import create_views, run_script

DB_NAME = "nightshift.duckdb"


class WarehouseError(RuntimeError):
    """The warehouse file cannot be opened as asked; the message says why and what to do."""


def db_path(results: Path | str) -> Path:
    """The warehouse file of a results directory."""
    return Path(results) / DB_NAME


def connect(path: Path | str, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open the warehouse. A writer gets the schema and current views; a reader needs a file."""
    path = Path(path)
    if read_only and not path.is_file():
        raise WarehouseError(
            f"no warehouse at {path}: load a run first (`nightshift ingest` or `nightshift run`), "
            "or point --results at the directory that holds nightshift.duckdb"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        con = duckdb.connect(str(path), read_only=read_only)
    except duckdb.IOException as err:
        if "lock" in str(err).lower():
            raise WarehouseError(
                f"{path} is open for writing by another process (DuckDB allows one writer): "
                "wait for the load to finish and try again"
            ) from err
        raise WarehouseError(f"cannot open {path}: {err}") from err
    if not read_only:
        run_script(con, "writer_session")
        run_script(con, "schema")
        create_views(con)
    return con
