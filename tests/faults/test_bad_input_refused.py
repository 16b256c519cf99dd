"""Bad input that must be refused before any work starts: the message names the problem and the
fix (exit status 2), and nothing else is lost: no replica started, no run folder touched.
The documents a run judges one by one are in `test_bad_documents.py`."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.replicas import REPO, TINY

H100 = REPO / "engine_configs" / "h100x2-llama-3.1-70b-fp8.yaml"


def nightshift(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
        env={**os.environ, "PREFECT_HOME": str(cwd / "prefect")},
    )


def good_corpus(path: Path) -> Path:
    rows = [{"doc_id": f"d{i}", "text": f"the ledger of tenant {i} " * 40} for i in range(2)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def run_args(corpus: Path, *more: str) -> list[str]:
    return ["run", "--corpus", str(corpus), "--engine-config", str(TINY), "--policy", "static",
            "--results", "results", *more]  # fmt: skip


def tree_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        h.update(str(p.relative_to(folder)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def refused(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode == 2, r.stdout + r.stderr
    for needle in needles:
        assert needle in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_corpus_without_text_column(tmp_path: Path) -> None:
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"doc_id": "a", "body": "x"}]), bad)
    refused(nightshift(*run_args(bad), cwd=tmp_path), "bad.parquet", "text")
    assert not (tmp_path / "results").exists()


def test_corrupt_parquet(tmp_path: Path) -> None:
    bad = tmp_path / "c.parquet"
    bad.write_bytes(pq.ParquetFile.__doc__.encode()[:500])  # bytes, but not Parquet
    refused(nightshift(*run_args(bad), cwd=tmp_path), "not a readable Parquet file")
    assert not (tmp_path / "results").exists()


def test_engine_config_bad_vllm_flags_refused_before_a_replica_starts(tmp_path: Path) -> None:
    text = TINY.read_text().replace("max-num-seqs: 16", "max-num-seqz: 16")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("max-model-len: 4096", "max-model-len: lots"))
    corpus = good_corpus(tmp_path / "c.parquet")
    # `engine up` refuses the same way (tests/integration/test_vllm_flags_check.py)
    args = [a if a != str(TINY) else str(bad) for a in run_args(corpus)]
    r = nightshift(*args, cwd=tmp_path)
    refused(r, "max-num-seqz is not a vLLM flag (did you mean max-num-seqs?)", "'lots'")
    assert not (tmp_path / "results" / "engines").exists()  # no replica was started


def test_engine_config_unknown_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(TINY.read_text().replace("hardware:", "hardwear:", 1))
    refused(nightshift("engine", "up", str(bad), "--dry-run", cwd=tmp_path), "bad.yaml", "hardwear")


def test_bad_trace_row(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n1,2,3\nx,5,6\n")
    r = nightshift("simulate", "--engine-config", str(H100), "--chat-trace", str(trace),
                   "--duration", "5", cwd=tmp_path)  # fmt: skip
    refused(r, "t.csv:3", "TIMESTAMP 'x'")


def test_unreachable_replica_url(tmp_path: Path) -> None:
    corpus = good_corpus(tmp_path / "c.parquet")
    r = nightshift(*run_args(corpus, "--replica-url", "http://127.0.0.1:9"), cwd=tmp_path)
    refused(r, "http://127.0.0.1:9 is not reachable", "nightshift engine up")
    assert not (tmp_path / "results").exists()


def test_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        r = nightshift("engine", "up", str(TINY), "--port", str(port), "--state-dir", "engines",
                       cwd=tmp_path)  # fmt: skip
        refused(r, f"port {port} on 127.0.0.1 is already in use", "--port")
    assert not (tmp_path / "engines").exists()  # nothing spawned, nothing recorded


def test_reused_run_id_with_another_corpus_leaves_the_run_untouched(tmp_path: Path) -> None:
    from pipelines.run_store import RunStore
    from warehouse.run_files import RunMeta

    first = good_corpus(tmp_path / "one.parquet")
    store = RunStore(tmp_path / "results", "r1")
    store.begin(RunMeta(run_id="r1", corpus_path=str(first)))
    store.write_rejections([{"doc_id": "x", "status": "failed", "reason": "empty document"}])
    before = tree_digest(store.dir)
    other = tmp_path / "two.parquet"
    pq.write_table(pa.Table.from_pylist([{"doc_id": "z", "text": "other words " * 30}]), other)
    r = nightshift(*run_args(other, "--run-id", "r1"), cwd=tmp_path)
    refused(r, "run r1 already exists with a different corpus", "use a new --run-id")
    assert tree_digest(store.dir) == before
