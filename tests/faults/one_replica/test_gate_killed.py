"""The Gate actor's process killed with -9 mid-night (`nightshift run --policy budget` on the keyed
cpu-tiny replica). The attempt ends with a message that says what happened and what was kept, the
flow's retry of the pipeline resumes the same run id, and the night ends whole: every document has
exactly one summary and one answered request, none finished before the kill is sent again, the
warehouse holds no duplicate, and the requests the Gate had granted are recorded as killed with
the Gate's death as their reason rather than dropped."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import duckdb
import pytest

from bench.processes import command, descendants
from pipelines.request_journal import GATE_DIED_IN_FLIGHT
from tests.faults.one_replica.night import assert_whole_once, corpus, start_run, summaries_so_far
from warehouse.run_files import read_table

pytestmark = pytest.mark.engine

DOCS = [f"doc-{i:02d}" for i in range(8)]


def gate_process(run_pid: int) -> int | None:
    found = [p for p in descendants(run_pid) if command(p).startswith("ray::GateActor")]
    return found[0] if found else None


def test_a_killed_gate_ends_the_attempt_and_the_retry_loses_and_repeats_nothing(
    replica, tmp_path: Path
) -> None:
    corpus(tmp_path / "c.parquet", DOCS)
    run_dir = tmp_path / "results" / "runs" / "gate-killed"
    run = start_run(tmp_path, replica, "gate-killed", "--policy", "budget", "--static-seats", "2")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(summaries_so_far(run_dir)) < 2:
        assert run.poll() is None, run.stdout.read()[-3000:]
        time.sleep(0.2)
    done_before = set(summaries_so_far(run_dir))
    gate = gate_process(run.pid)
    assert gate is not None, [command(p) for p in descendants(run.pid)]
    killed_at = time.time()
    os.kill(gate, signal.SIGKILL)
    out, _ = run.communicate(timeout=400)

    assert run.returncode == 0, out[-4000:]
    assert "the run's Gate actor died mid-night" in out, out[-4000:]
    assert "Retry 1/1" in out  # the flow's retry of the pipeline, the same run id
    requests = assert_whole_once(run_dir, DOCS, done_before, killed_at)
    killed = [r for r in requests if r["error"] == GATE_DIED_IN_FLIGHT]
    assert killed and all(r["status"] == "cancelled" for r in killed)
    assert {r["doc_id"] for r in killed} <= set(DOCS) - done_before
    con = duckdb.connect(str(tmp_path / "results" / "nightshift.duckdb"), read_only=True)
    rows, distinct = con.execute(
        "select count(*), count(distinct doc_id) from summaries where run_id = 'gate-killed'"
    ).fetchone()
    assert rows == distinct == len(DOCS)
    docs = con.execute("select count(*) from documents where run_id = 'gate-killed'").fetchone()
    assert docs[0] == len(DOCS)
    decisions = read_table(run_dir, "decisions").column("t").to_pylist()
    before_kill = [t for t in decisions if t < killed_at]
    assert before_kill, "the killed Gate's decisions were lost"  # journaled as they were made
    assert any(t > killed_at for t in decisions)  # and the retry's own
    said = next(line for line in out.splitlines() if "Gate actor died" in line)
    print(
        f"killed {len(killed)} in flight, {len(done_before)} done before the kill; "
        f"{len(before_kill)} of {len(decisions)} decisions from the killed attempt; {said}"
    )
