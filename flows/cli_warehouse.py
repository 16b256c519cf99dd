"""`nightshift ingest`, `nightshift sql` and `nightshift report`: the warehouse from the shell."""

from __future__ import annotations

from pathlib import Path

import typer

Results = typer.Option(
    Path("results"),
    "--results",
    help="Results directory: runs/<run_id>/ and nightshift.duckdb live here.",
)


def register(app: typer.Typer) -> None:
    app.command("ingest")(ingest)
    app.command("sql")(sql)
    app.command("report")(report)


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print `message` to stderr and return the Exit to raise."""
    typer.secho(message, err=True, fg="red")
    return typer.Exit(code)


def ingest(
    run_ids: list[str] = typer.Argument(
        None, help="Runs to load; all under RESULTS/runs/ by default."
    ),
    results: Path = Results,
) -> None:
    """Load runs' Parquet files into the warehouse; a run loaded again replaces its rows."""
    from warehouse.db import WarehouseError
    from warehouse.load import LoadError, load_results
    from warehouse.run_files import RunFilesError, list_runs

    known = list_runs(results)
    unknown = [r for r in run_ids or [] if r not in known]
    if unknown or not known:
        where = f"{results}/runs/"
        raise fail(
            f"no run {', '.join(unknown)} under {where}; runs there: {', '.join(known) or 'none'}"
            if unknown
            else f"no runs under {where}: run `nightshift run` first or pass --results"
        )
    try:
        loaded = load_results(results, run_ids or None)
    except (WarehouseError, LoadError, RunFilesError) as err:
        raise fail(str(err)) from None
    for r in loaded:
        counts = ", ".join(f"{k} {v:,}" for k, v in r.rows.items() if k != "runs")
        typer.echo(f"loaded {r.run_id} in {r.seconds:.2f} s: {counts}")


def sql(
    query: str = typer.Argument(..., help='SQL to run, e.g. "SELECT * FROM slo_windows LIMIT 5".'),
    results: Path = Results,
    limit: int = typer.Option(50, min=1, help="Show at most this many rows."),
) -> None:
    """Run a query on the warehouse (read-only) and print the result as a table."""
    import duckdb
    from rich.console import Console
    from rich.table import Table

    from warehouse.db import WarehouseError, connect, db_path

    try:
        con = connect(db_path(results), read_only=True)
    except WarehouseError as err:
        raise fail(str(err)) from None
    try:
        cursor = con.execute(query)
        columns = [d[0] for d in cursor.description or []]
        fetched = cursor.fetchmany(limit + 1)
    except duckdb.Error as err:
        raise fail(
            f"query failed: {err}\nviews: run_summary, class_latency, slo_windows, "
            "run_windows, batch_goodput, cost; tables: runs, documents, summaries, requests, "
            "token_gaps, decisions"
        ) from None
    finally:
        con.close()
    cells = [[_cell(v) for v in row] for row in fetched[:limit]]
    table = Table(*columns, header_style="bold")
    for row in cells:
        table.add_row(*row)
    # a table narrower than its content turns every cell into "…"; widen rather than hide values
    needed = sum(max([len(c), *(len(r[i]) for r in cells)]) + 3 for i, c in enumerate(columns)) + 1
    console = Console()
    console = Console(width=max(console.width, needed))
    console.print(table)
    if len(fetched) > limit:
        console.print(f"(first {limit} rows shown; raise --limit or add LIMIT for more)")


def report(
    run_id: str = typer.Argument(
        None, help="Run to report on; the latest in the warehouse by default."
    ),
    results: Path = Results,
    out: Path = typer.Option(
        None, "--out", help="Directory for the files; RESULTS/reports/<run_id>/ by default."
    ),
) -> None:
    """Write a run's report: report.md, report.html and its PNG plots."""
    from flows.report import ReportError, write_report
    from warehouse.db import WarehouseError

    try:
        files = write_report(results, run_id, out)
    except (WarehouseError, ReportError) as err:
        raise fail(str(err)) from None
    typer.echo(f"report of {files.run_id}:")
    typer.echo(f"  {files.markdown}")
    typer.echo(f"  {files.html}")


def _cell(value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
