"""The nightly Prefect flow end to end on a real replica, and `nightshift run`'s input checks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prefect.testing.utilities import prefect_test_harness

from pipelines.config import PipelineConfig
from tests.replicas import TINY


@pytest.fixture(scope="module")
def prefect_api():
    with prefect_test_harness(server_startup_timeout=120):
        yield


def corpus(path: Path, n: int = 3) -> Path:
    words = "the river market ledger contract tenant clause notice rent repair".split()
    rows = [
        {"doc_id": f"d{i}", "text": " ".join(words[(i + j) % len(words)] for j in range(300))}
        for i in range(n)
    ]
    rows.append({"doc_id": "blank", "text": "  "})
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.mark.engine
def test_flow_runs_loads_and_reports(prefect_api, tiny_replica, tmp_path: Path) -> None:
    from flows.nightly import nightly_summarization

    results = tmp_path / "results"
    out = nightly_summarization(
        corpus=str(corpus(tmp_path / "c.parquet")),
        engine_config=str(TINY),
        replica_urls=[tiny_replica.base_url],
        run_id="flow-1",
        results=str(results),
        policy="static",
        static_caps=(2, 256),
        show_progress=False,
        pipeline=PipelineConfig(
            max_model_len=4096, section_summary_tokens=8, final_summary_tokens=12, ignore_eos=True
        ),
    )
    assert out["run_id"] == "flow-1" and out["job"]["docs_done"] == 3
    assert out["job"]["docs_failed"] == 1  # the blank document, recorded with its reason
    con = duckdb.connect(str(results / "nightshift.duckdb"), read_only=True)
    statuses = dict(
        con.execute(
            "select status, count(*) from documents where run_id = 'flow-1' group by 1"
        ).fetchall()
    )
    assert statuses == {"done": 3, "failed": 1}
    assert con.execute("select count(*) from requests where run_id = 'flow-1'").fetchone()[0] >= 3
    assert Path(out["report"]["html"]).is_file() and Path(out["report"]["markdown"]).is_file()


def nightshift(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_run_refuses_missing_corpus(tmp_path: Path) -> None:
    r = nightshift(
        "run",
        "--corpus",
        str(tmp_path / "nope.parquet"),
        "--engine-config",
        str(TINY),
        "--policy",
        "static",
    )
    assert r.returncode == 2 and "nope.parquet" in r.stderr


def test_run_refuses_corpus_without_text(tmp_path: Path) -> None:
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"doc_id": "a", "body": "x"}]), bad)
    r = nightshift("run", "--corpus", str(bad), "--engine-config", str(TINY), "--policy", "static")
    assert r.returncode == 2 and "text" in r.stderr


def test_run_refuses_unreachable_replica(tmp_path: Path) -> None:
    r = nightshift(
        "run",
        "--corpus",
        str(corpus(tmp_path / "c.parquet")),
        "--engine-config",
        str(TINY),
        "--policy",
        "static",
        "--replica-url",
        "http://127.0.0.1:9",
    )
    assert r.returncode == 2 and "not reachable" in r.stderr


def test_run_refuses_slo_policy_without_latency_model(tmp_path: Path) -> None:
    r = nightshift(
        "run", "--corpus", str(corpus(tmp_path / "c.parquet")), "--engine-config", str(TINY)
    )
    assert r.returncode == 2 and "nightshift calibrate" in r.stderr


def test_run_refuses_reused_run_id_with_another_corpus(tmp_path: Path) -> None:
    from pipelines.run_store import RunStore
    from warehouse.run_files import RunMeta

    first = corpus(tmp_path / "one.parquet", 2)
    RunStore(tmp_path / "results", "r1").begin(RunMeta(run_id="r1", corpus_path=str(first)))
    r = nightshift(
        "run",
        "--corpus",
        str(corpus(tmp_path / "two.parquet", 3)),
        "--engine-config",
        str(TINY),
        "--policy",
        "static",
        "--run-id",
        "r1",
        "--results",
        str(tmp_path / "results"),
    )
    assert r.returncode == 2 and "different corpus" in r.stderr
