"""Named SQL from `sql/`: each `.sql` file is one view, one named query or one script, loaded by
its file name and run with parameters (DuckDB `$name` placeholders), never with SQL built here.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

SQL_DIR = Path(__file__).resolve().parent.parent / "sql"
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]*$")

# Views in dependency order: each may read only the tables and the views before it. The first three
# are base views over raw rows, used by the loader's rollups; the others are what reports read.
BASE_VIEWS: tuple[str, ...] = ("run_clock", "request_times", "gap_times", "engine_windows")
VIEWS: tuple[str, ...] = (
    *BASE_VIEWS,
    "slo_windows",
    "class_latency",
    "run_windows",
    "batch_goodput",
    "cost",
    "run_summary",
)


class QueryError(ValueError):
    """A named query that does not exist, lacks a parameter, or fails; the message says which."""


def available() -> list[str]:
    """Names of every `.sql` file there is."""
    return sorted(p.stem for p in SQL_DIR.glob("*.sql"))


@cache
def sql_text(name: str) -> str:
    """The text of `sql/<name>.sql`."""
    path = SQL_DIR / f"{name}.sql"
    if not NAME_PATTERN.match(name) or not path.is_file():
        raise QueryError(f"no SQL named {name!r} in {SQL_DIR}; there are: {', '.join(available())}")
    return path.read_text()


def run_script(con: duckdb.DuckDBPyConnection, name: str, **params: Any) -> None:
    """Run every statement of `sql/<name>.sql`, each bound to the parameters it names."""
    for statement in con.extract_statements(sql_text(name)):
        con.execute(statement, _bind(name, statement.named_parameters, params))


def query(con: duckdb.DuckDBPyConnection, name: str, **params: Any) -> pa.Table:
    """Run the named query `sql/<name>.sql` and return its result as an Arrow table."""
    statements = con.extract_statements(sql_text(name))
    if len(statements) != 1:
        raise QueryError(f"sql/{name}.sql holds {len(statements)} statements; a query holds one")
    bound = _bind(name, statements[0].named_parameters, params)
    try:
        return con.sql(statements[0].query, params=bound or None).to_arrow_table()
    except duckdb.Error as err:
        raise QueryError(f"sql/{name}.sql failed: {err}") from err


def rows(con: duckdb.DuckDBPyConnection, name: str, **params: Any) -> list[dict[str, Any]]:
    """The named query's result as a list of dicts, for code that wants plain values."""
    return query(con, name, **params).to_pylist()


def create_views(con: duckdb.DuckDBPyConnection) -> None:
    """(Re)create every view from its file, so a warehouse always answers with the current SQL."""
    for name in VIEWS:
        run_script(con, name)


def view(con: duckdb.DuckDBPyConnection, name: str) -> pa.Table:
    """Every row of one of the warehouse's views, read through the relational API (no SQL text)."""
    if name not in VIEWS:
        raise QueryError(f"no view named {name!r}; the views are: {', '.join(VIEWS)}")
    return con.view(name).to_arrow_table()


def _bind(name: str, wanted: set[str], params: dict[str, Any]) -> dict[str, Any]:
    missing = wanted - set(params)
    if missing:
        raise QueryError(f"sql/{name}.sql needs parameter(s) {sorted(missing)}; pass them by name")
    return {k: params[k] for k in wanted}
