"""A night's only replica killed and restarted under the same URL: `nightshift run --replica-url` on
the folder's replica, `kill -9` of its process group once two documents are done, a new replica
of the same config started on the same port. With every replica down the Gate holds the night's
requests (`down_grace_s`) instead of failing them; once the sensor reads the new replica the
night goes on there, and every document is summarized exactly once."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from serving.engine_config import load_engine_config
from serving.launcher import ReplicaSet, port_in_use
from tests.faults.one_replica.night import corpus, start_run, summaries_so_far
from warehouse.run_files import read_table

pytestmark = pytest.mark.engine

DOCS = [f"doc-{i:02d}" for i in range(10)]


def wait_port_free(host: str, port: int, timeout_s: float) -> float:
    """Seconds until nothing listens on `port` any more (a killed replica's processes let go)."""
    t0 = time.monotonic()
    while port_in_use(host, port):
        assert time.monotonic() - t0 < timeout_s, f"port {port} still held {timeout_s} s after"
        time.sleep(0.2)
    return time.monotonic() - t0


def test_a_night_rides_out_its_replica_restarted_under_the_same_url(
    replica, pool_config, tmp_path: Path
) -> None:
    corpus(tmp_path / "c.parquet", DOCS)
    run_dir = tmp_path / "results" / "runs" / "restarted"
    run = start_run(tmp_path, replica, "restarted", "--policy", "budget", "--static-seats", "2")
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and len(summaries_so_far(run_dir)) < 2:
            assert run.poll() is None, run.stdout.read()[-3000:]
            time.sleep(0.1)
        os.killpg(replica.pid, signal.SIGKILL)
        killed_at = time.time()
        done_before = set(summaries_so_far(run_dir))
        port_free_s = wait_port_free(replica.host, replica.port, timeout_s=120)
        successor = ReplicaSet(tmp_path / "engines").running(
            load_engine_config(pool_config), str(pool_config), replica.port
        )
        with successor as (second,):
            back_at = time.time()
            assert second.base_url == replica.base_url
            out, _ = run.communicate(timeout=300)
    finally:
        run.kill()

    assert run.returncode == 0, out[-4000:]
    assert 2 <= len(done_before) < len(DOCS), "the kill did not land mid-night"
    documents = read_table(run_dir, "documents").to_pylist()
    assert sorted(d["doc_id"] for d in documents if d["status"] == "done") == DOCS, documents
    assert sorted(read_table(run_dir, "summaries").column("doc_id").to_pylist()) == DOCS
    requests = read_table(run_dir, "requests").to_pylist()
    after = [r for r in requests if r["t_submit"] > back_at]
    assert after and all(r["status"] == "ok" for r in after)  # the night went on, on the new one
    answered = sorted(r["doc_id"] for r in requests if r["status"] == "ok")
    assert answered == DOCS  # one answered request each: nothing finished was sent again
    broken = [r for r in requests if r["status"] != "ok"]
    print(
        f"killed {killed_at - min(r['t_submit'] for r in requests):.1f} s into the night with "
        f"{len(done_before)} of {len(DOCS)} done; the new replica up {back_at - killed_at:.1f} s "
        f"later (port free after {port_free_s:.1f} s); {len(after)} requests after it, {len(broken)} broken by the kill and sent again; "
        f"{len(DOCS)} of {len(DOCS)} done once"
    )
