"""A tiny night for this folder's cases: a corpus of short documents and `nightshift run` against
the shared keyed replica, under a policy that steers its plug-in."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.faults.one_replica.conftest import FIT, KEY
from tests.prefect_home import prefect_home
from tests.replicas import TINY
from warehouse.run_files import read_table

WORDS = "harbour ledger tenant clause river notice market repair rent contract".split()


def corpus(path: Path, docs: list[str], words: int = 400) -> Path:
    rows = [
        {
            "doc_id": d,
            "text": " ".join(f"{WORDS[(i + j) % 10]}{(j + i // 10) % 17}" for j in range(words)),
        }
        for i, d in enumerate(docs)
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def start_run(work: Path, replica, run_id: str, *more: str) -> subprocess.Popen:
    """`nightshift run` over `work/c.parquet` on `replica`, its key from the environment."""
    return subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "run", "--corpus", str(work / "c.parquet"),
         "--engine-config", str(TINY), "--replica-url", replica.base_url,
         "--latency-model", str(FIT), "--run-id", run_id, "--results", str(work / "results"),
         *more],
        cwd=work, env={**os.environ, "PREFECT_HOME": prefect_home(work / "prefect"),
                       "NIGHTSHIFT_REPLICA_API_KEY": KEY},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def summaries_so_far(run_dir: Path) -> list[str]:
    return read_table(run_dir, "summaries").column("doc_id").to_pylist()


def assert_whole_once(
    run_dir: Path, docs: list[str], done_before: set[str], killed_at: float
) -> list[dict]:
    """What a night killed in part must show at its end: the kill landed mid-night, every
    document has exactly one summary and one answered request, and none finished before the kill
    was sent again. Returns the run's request rows."""
    assert 2 <= len(done_before) < len(docs), "the kill did not land mid-night"
    summaries = read_table(run_dir, "summaries").column("doc_id").to_pylist()
    assert sorted(summaries) == docs  # every document exactly once
    requests = read_table(run_dir, "requests").to_pylist()
    answered = sorted(r["doc_id"] for r in requests if r["status"] == "ok")
    assert answered == docs  # one answered request each: nothing finished was sent again
    redone = {r["doc_id"] for r in requests if r["t_submit"] > killed_at} & done_before
    assert not redone
    return requests
