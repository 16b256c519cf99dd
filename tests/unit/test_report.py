"""`nightshift report`: Markdown, HTML and PNG plots built from the warehouse's figures."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.report import ReportError, write_report
from tests.unit.test_warehouse_views import RUN, write_sample_run
from warehouse.load import load_results

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    results = tmp_path_factory.mktemp("results")
    write_sample_run(results)
    load_results(results)
    return results


@pytest.fixture(scope="module")
def report(results):
    return write_report(results, RUN)


def test_writes_markdown_html_and_four_plots(report) -> None:
    assert report.markdown.parent == report.html.parent
    assert [p.name for p in report.plots] == [
        "chat_itl_p99.png",
        "chat_ttft_p99.png",
        "batch_tokens_per_s.png",
        "controller_caps.png",
    ]
    for plot in report.plots:
        assert plot.read_bytes().startswith(PNG) and plot.stat().st_size > 5_000


def test_markdown_carries_the_warehouse_figures(report) -> None:
    md = report.markdown.read_text()
    assert "# nightshift run `sample`" in md
    assert "33.4 tokens/s (120.0 documents/h)" in md  # goodput: 1003 tokens / 30 s, 1 doc
    assert "266.9 tokens/s (360.0 documents/h)" in md  # every window: 8008 tokens, 3 docs
    assert "1 of 3 (33%)" in md
    assert "$0.60 (2 replicas x $36.00/h x 0 min 30 s)" in md
    assert "- **Per document:** $0.2000" in md
    chat = next(line for line in md.splitlines() if line.startswith("| chat |"))
    assert chat.split(" | ")[1:3] == ["5", "1"]  # requests, failed
    assert "TTFT p99 <= 200 ms" in md
    for plot in report.plots:
        assert f"]({plot.name})" in md


def test_html_shows_the_same_sections_and_links_every_plot(report) -> None:
    page = report.html.read_text()
    assert page.startswith("<!doctype html>")
    for title in ("Batch throughput within the SLO", "Cost", "Latency (ms)", "Work", "Over time"):
        assert f"<h2>{title}</h2>" in page
    linked = set(re.findall(r'<img src="([^"]+)"', page))
    assert linked == {p.name for p in report.plots}
    assert "33.4 tokens/s" in page


def test_default_run_is_the_latest_and_out_dir_is_respected(results: Path, tmp_path: Path) -> None:
    write_sample_run(results, "later")
    meta_path = results / "runs" / "later" / "run.json"
    meta = json.loads(meta_path.read_text())
    meta["started"] += 3600
    meta["ended"] += 3600
    meta_path.write_text(json.dumps(meta))
    load_results(results, ["later"])
    files = write_report(results, out=tmp_path / "out")
    assert files.run_id == "later"
    assert files.html == tmp_path / "out" / "report.html"


def test_unknown_run_says_how_to_find_one(results: Path) -> None:
    with pytest.raises(ReportError, match="no run 'nope'.*SELECT run_id FROM runs"):
        write_report(results, "nope")


def test_cli_report(results: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    ok = runner.invoke(app, ["report", RUN, "--results", str(results), "--out", str(tmp_path)])
    assert ok.exit_code == 0, ok.output
    assert (tmp_path / "report.html").is_file() and "report.md" in ok.output
    missing = runner.invoke(app, ["report", "--results", str(tmp_path / "empty")])
    assert missing.exit_code == 2
    assert "no warehouse at" in missing.output


def test_a_run_without_requests_still_reports(tmp_path: Path) -> None:
    from warehouse.run_files import RunMeta, run_dir, write_meta, write_table

    directory = run_dir(tmp_path, "idle")
    directory.mkdir(parents=True)
    write_table(
        directory,
        "documents",
        [{"doc_id": "d1", "status": "skipped", "reason": "empty"}],
        run_id="idle",
    )
    write_meta(directory, RunMeta("idle"))
    load_results(tmp_path)
    files = write_report(tmp_path)
    md = files.markdown.read_text()
    assert "0 done, 0 failed, 1 skipped of 1" in md
    assert "- **Per document:** -" in md
    assert all(p.read_bytes().startswith(PNG) for p in files.plots)


def test_runs_on_the_same_corpus_are_compared(tmp_path: Path) -> None:
    same = {"corpus_fingerprint": "sha256:abc"}
    write_sample_run(tmp_path, "controlled", **same)
    write_sample_run(tmp_path, "uncontrolled", policy="uncontrolled", **same)
    write_sample_run(tmp_path, "elsewhere", policy="static", corpus_fingerprint="sha256:def")
    load_results(tmp_path)
    md = write_report(tmp_path, "controlled").markdown.read_text()
    assert "## Beside other runs on this corpus" in md
    table = [line for line in md.splitlines() if line.startswith("| ") and "controlled" in line]
    assert [line.split(" | ")[1] for line in table] == ["slo", "uncontrolled"]
    assert "elsewhere" not in md
    alone = write_report(tmp_path, "elsewhere").markdown.read_text()
    assert "Beside other runs" not in alone
