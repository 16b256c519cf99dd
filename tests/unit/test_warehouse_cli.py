"""`nightshift ingest` and `nightshift sql` against a real warehouse file."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from flows.cli import app
from tests.unit.test_warehouse_views import write_sample_run

runner = CliRunner()


def test_ingest_then_sql(tmp_path: Path) -> None:
    write_sample_run(tmp_path)
    loaded = runner.invoke(app, ["ingest", "--results", str(tmp_path)])
    assert loaded.exit_code == 0, loaded.output
    assert "loaded sample" in loaded.output and "requests 9" in loaded.output
    answer = runner.invoke(
        app,
        [
            "sql",
            "--results",
            str(tmp_path),
            "SELECT window_idx, slo_met FROM slo_windows WHERE class = 'chat' ORDER BY window_idx",
        ],
    )
    assert answer.exit_code == 0, answer.output
    lines = [line for line in answer.output.splitlines() if "│" in line]
    cells = [[c.strip() for c in line.split("│")[1:3]] for line in lines]
    assert cells == [["0", "True"], ["1", "False"], ["2", "False"]]


def test_sql_limit_says_rows_were_left_out(tmp_path: Path) -> None:
    write_sample_run(tmp_path)
    runner.invoke(app, ["ingest", "--results", str(tmp_path)])
    answer = runner.invoke(
        app,
        [
            "sql",
            "--results",
            str(tmp_path),
            "--limit",
            "2",
            "SELECT request_id FROM requests ORDER BY request_id",
        ],
    )
    assert answer.exit_code == 0
    assert "first 2 rows shown" in answer.output


def test_bad_input_exits_2_with_the_fix(tmp_path: Path) -> None:
    nothing = runner.invoke(app, ["sql", "--results", str(tmp_path), "SELECT 1"])
    assert nothing.exit_code == 2 and "no warehouse at" in nothing.output
    no_runs = runner.invoke(app, ["ingest", "--results", str(tmp_path)])
    assert no_runs.exit_code == 2 and "no runs under" in no_runs.output
    write_sample_run(tmp_path)
    unknown = runner.invoke(app, ["ingest", "ghost", "--results", str(tmp_path)])
    assert (
        unknown.exit_code == 2 and "no run ghost" in unknown.output and "sample" in unknown.output
    )
    runner.invoke(app, ["ingest", "--results", str(tmp_path)])
    typo = runner.invoke(app, ["sql", "--results", str(tmp_path), "SELECT * FROM slo_window"])
    assert typo.exit_code == 2 and "query failed" in typo.output and "slo_windows" in typo.output
