"""Bad documents in a real night (the folder's keyed cpu-tiny replica, `nightshift run`): each is recorded with the
reason a user reads, every good document gets exactly one summary, and the run's files keep no
secret and no door open (replica and exporters on loopback, run and control folders 0700)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench.processes import descendants, listening_address
from pipelines.gate_metrics import GateMetrics
from pipelines.run_metrics import RunMetrics
from tests.faults.one_replica.conftest import FIT, KEY
from tests.prefect_home import prefect_home
from tests.replicas import TINY
from warehouse.run_files import read_table

pytestmark = pytest.mark.engine

SECRET = KEY
"""The replica's API key in the run's environment, where operators keep it: it must appear in
no file."""

WORDS = "river market ledger contract tenant clause notice rent repair harbour".split()


def text(i: int, words: int = 250) -> str:
    return " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] + str((i + j) % 13) for j in range(words))


BAD = {
    "empty": ("   ", "failed", "empty text"),
    "not-utf8": (b"caf\xe9 au lait " * 20, "failed", "text is not valid UTF-8 (byte 3)"),
    "too-long": (" ".join(f"w{j}" for j in range(110_000)), "failed", "over-long: "),
    "copy-of-g1": (text(1), "skipped", "same text as doc g1"),
}
GOOD = ["g0", "g1", "g2"]


def corpus(path: Path) -> Path:
    rows = [(d, text(i).encode()) for i, d in enumerate(GOOD)]
    rows += [(d, t if isinstance(t, bytes) else t.encode()) for d, (t, _, _) in BAD.items()]
    rows.append(("g0", text(9).encode()))  # a second row under an id already taken
    table = pa.table(
        {"doc_id": [d for d, _ in rows], "text": pa.array([t for _, t in rows], pa.binary())}
    )
    pq.write_table(table, path)
    return path


@pytest.fixture(scope="module")
def night(replica, tmp_path_factory):
    """One run over the bad corpus against the folder's replica; what it printed and wrote. It
    steers the plug-in (policy budget), as every night in this folder does."""
    work = tmp_path_factory.mktemp("bad-docs")
    env = {**os.environ, "PREFECT_HOME": prefect_home(work / "prefect"),
           "NIGHTSHIFT_REPLICA_API_KEY": SECRET, "VLLM_API_KEY": SECRET}  # fmt: skip
    r = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", "--corpus", str(corpus(work / "c.parquet")),
         "--engine-config", str(TINY), "--policy", "budget", "--latency-model", str(FIT),
         "--replica-url", replica.base_url, "--run-id", "bad-docs",
         "--results", str(work / "results")],
        capture_output=True, text=True, timeout=600, env=env, cwd=work,
    )  # fmt: skip
    yield {"work": work, "proc": r, "replica": replica,
               "replica_addr": listening_address(replica.port, {replica.pid} | descendants(replica.pid))}  # fmt: skip


def test_each_bad_document_has_its_reason_and_no_good_one_is_lost(night) -> None:
    r = night["proc"]
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    run_dir = night["work"] / "results" / "runs" / "bad-docs"
    docs = read_table(run_dir, "documents").to_pylist()
    by_id: dict[str, list[dict]] = {}
    for d in docs:
        by_id.setdefault(d["doc_id"], []).append(d)
    for doc_id, (_, status, reason) in BAD.items():
        (row,) = by_id[doc_id]
        assert row["status"] == status and row["reason"].startswith(reason), row
    assert "raise max_doc_tokens" in by_id["too-long"][0]["reason"]  # the fix is named
    g0 = sorted(by_id["g0"], key=lambda d: d["status"])
    assert [d["status"] for d in g0] == ["done", "skipped"]
    assert g0[1]["reason"] == "duplicate doc_id (first at row 0)"
    summaries = read_table(run_dir, "summaries").column("doc_id").to_pylist()
    assert sorted(summaries) == GOOD  # every good document once, nothing for the bad ones
    assert "3 done, 3 failed, 2 skipped" in r.stdout
    con = duckdb.connect(str(night["work"] / "results" / "nightshift.duckdb"), read_only=True)
    assert con.execute("select count(*) from summaries").fetchone()[0] == 3


def test_no_file_the_run_wrote_holds_the_api_key(night) -> None:
    written = [p for p in night["work"].rglob("*") if p.is_file() and p.name != "c.parquet"]
    assert len(written) > 10  # run files, parts, DuckDB, report, Prefect's database and logs
    holding = [str(p) for p in written if SECRET.encode() in p.read_bytes()]
    assert holding == []
    assert SECRET not in night["proc"].stdout + night["proc"].stderr


def test_run_and_control_folders_are_private(night) -> None:
    run_dir = night["work"] / "results" / "runs" / "bad-docs"
    assert run_dir.stat().st_mode & 0o777 == 0o700
    assert night["replica"].control_dir.stat().st_mode & 0o777 == 0o700


def test_replica_and_exporters_listen_on_loopback(night) -> None:
    assert night["replica_addr"] == "127.0.0.1"
    run, gate = RunMetrics("loopback"), GateMetrics()
    try:
        here = {os.getpid()}
        assert listening_address(run.serve(0), here) == "127.0.0.1"
        assert listening_address(gate.serve(0), here) == "127.0.0.1"
    finally:
        gate.close()
