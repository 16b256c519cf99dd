"""A summarizer worker's process killed with -9 mid-night (`nightshift run --policy budget` on the
keyed cpu-tiny replica). The night goes on without a retry of the pipeline: Ray Data restarts the
worker and sends it the dead one's documents again, the Gate takes back the seats the dead one held
when their lease lapses (`pipelines/seat_leases.py`), and the night ends whole: every document has exactly one summary and
one answered request, none finished before the kill is sent again, and the requests the dead
worker held are recorded as killed with its death as their reason rather than dropped."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from bench.processes import command, descendants
from pipelines.request_journal import WORKER_DIED_IN_FLIGHT
from tests.faults.one_replica.night import assert_whole_once, corpus, start_run, summaries_so_far

pytestmark = pytest.mark.engine

DOCS = [f"doc-{i:02d}" for i in range(8)]
LEASE_S = 30.0  # the Gate's default: the night must finish on it, not on a test setting


def summarizers(run_pid: int) -> list[int]:
    return [p for p in descendants(run_pid) if "Summarize" in command(p)]


def test_a_killed_worker_gives_back_its_seats_and_the_night_loses_and_repeats_nothing(
    replica, tmp_path: Path
) -> None:
    corpus(tmp_path / "c.parquet", DOCS)
    run_dir = tmp_path / "results" / "runs" / "worker-killed"
    run = start_run(tmp_path, replica, "worker-killed", "--policy", "budget",
                    "--static-seats", "2")  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and (
        len(summaries_so_far(run_dir)) < 2 or not summarizers(run.pid)
    ):
        assert run.poll() is None, run.stdout.read()[-3000:]
        time.sleep(0.2)
    done_before = set(summaries_so_far(run_dir))
    victim = summarizers(run.pid)[0]
    killed_at = time.time()
    os.kill(victim, signal.SIGKILL)
    out, _ = run.communicate(timeout=400)
    took = time.time() - killed_at

    assert run.returncode == 0, out[-4000:]
    requests = assert_whole_once(run_dir, DOCS, done_before, killed_at)
    lapsed = [r for r in requests if r["error"] == WORKER_DIED_IN_FLIGHT]
    assert all(r["status"] == "cancelled" for r in lapsed)
    assert {r["doc_id"] for r in lapsed} <= set(DOCS) - done_before
    print(f"{len(lapsed)} seat(s) lapsed, {len(done_before)} done before the kill, "
          f"night over {took:.0f} s after it")  # fmt: skip
