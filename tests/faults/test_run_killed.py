"""`kill -9` of `nightshift run` mid-night, then the same run id again (cpu-tiny: the killed run
starts its replica itself, the rerun uses the session's): nothing the killed run started outlives it, every document ends with exactly
one summary, none finished before the kill is redone, the warehouse holds no duplicate, and the
requests the kill cut off are recorded as killed rather than dropped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench.processes import command, descendants
from tests.faults.conftest import send_stop, wait_gone_but_agents
from tests.prefect_home import prefect_home
from tests.replicas import TINY
from warehouse.run_files import read_table

pytestmark = pytest.mark.engine

DOCS = [f"doc-{i:02d}" for i in range(10)]
WORDS = "harbour ledger tenant clause river notice market repair rent contract".split()


def corpus(path: Path, docs: list[str] = DOCS) -> Path:
    rows = [
        {
            "doc_id": d,
            "text": d + " " + " ".join(f"{WORDS[(i + j) % 10]}{j % 17}" for j in range(400)),
        }
        for i, d in enumerate(docs)
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def start_run(work: Path, run_id: str, *more: str, session: bool = False) -> subprocess.Popen:
    """`nightshift run` on the corpus in `work`; with `session`, as a terminal's foreground job:
    the leader of its own process group, which a Ctrl-C signals whole."""
    return subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "run", "--corpus", str(work / "c.parquet"),
         "--engine-config", str(TINY), "--policy", "static", "--static-seats", "4",
         "--run-id", run_id, "--results", str(work / "results"), *more],
        cwd=work, env={**os.environ, "PREFECT_HOME": prefect_home(work / "prefect")},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=session,
    )  # fmt: skip


def summaries_so_far(run_dir: Path) -> list[str]:
    if not (run_dir / "summaries").is_dir():
        return []
    return read_table(run_dir, "summaries").column("doc_id").to_pylist()


def test_killed_run_leaves_nothing_and_its_rerun_loses_and_repeats_nothing(
    tmp_path: Path, tiny_replica, ray_agents
) -> None:
    corpus(tmp_path / "c.parquet")
    run_dir = tmp_path / "results" / "runs" / "killed"
    run = start_run(tmp_path, "killed")
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline and len(summaries_so_far(run_dir)) < 2:
        assert run.poll() is None, run.stdout.read()[-3000:]
        time.sleep(0.2)
    tree = descendants(run.pid)  # replica, Ray (GCS, raylet, workers), Prefect's server
    killed_at = time.time()
    os.kill(run.pid, signal.SIGKILL)
    run.wait()
    done_before = set(summaries_so_far(run_dir))  # what the killed attempt finished
    assert 2 <= len(done_before) < len(DOCS), "the kill did not land mid-night"
    # Ray's node agents are checked at the session's end, everything else (replica, Ray,
    # Prefect) now.
    left, agents = wait_gone_but_agents(tree, timeout_s=60)
    ray_agents.update(dict.fromkeys(agents, "nightshift run killed"))
    assert not left, [command(p) for p in left]

    rerun = start_run(tmp_path, "killed", "--replica-url", tiny_replica.base_url)
    out, _ = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, out[-3000:]
    assert f"{len(done_before)} already done" in out

    summaries = read_table(run_dir, "summaries").column("doc_id").to_pylist()
    assert sorted(summaries) == DOCS  # every document exactly once
    requests = read_table(run_dir, "requests").to_pylist()
    redone = {r["doc_id"] for r in requests if r["t_submit"] > killed_at} & done_before
    assert not redone  # nothing finished before the kill was sent again
    killed = [r for r in requests if (r["error"] or "").startswith("killed:")]
    assert killed and all(r["status"] == "cancelled" for r in killed)
    assert {r["doc_id"] for r in killed} <= set(DOCS) - done_before
    con = duckdb.connect(str(tmp_path / "results" / "nightshift.duckdb"), read_only=True)
    rows, distinct = con.execute(
        "select count(*), count(distinct doc_id) from summaries where run_id = 'killed'"
    ).fetchone()
    assert rows == distinct == len(DOCS)
    docs = con.execute("select count(*) from documents where run_id = 'killed'").fetchone()[0]
    assert docs == len(DOCS)


def test_ctrl_c_then_sigterm_stop_a_night_whose_next_run_finishes_it(
    tmp_path: Path, tiny_replica, ray_agents
) -> None:
    """Ctrl-C to one attempt (SIGINT to its whole process group, as a terminal sends it), SIGTERM
    to the next (to the run alone, as a supervisor sends it), each once documents are done: each
    exits on its own within a minute and takes Ray and Prefect's server with it, and the third
    attempt finishes the night with every document summarized once. Each exits with the code a
    shell gives a process its signal ended (130, 143), so a supervisor tells a stop from a crash."""
    docs = [f"doc-{i:02d}" for i in range(40)]  # a quiet host summarizes 10 in 3 s
    corpus(tmp_path / "c.parquet", docs)
    run_dir = tmp_path / "results" / "runs" / "stopped"
    # One seat: at most one more document ends between the signal and the exit, so the signal
    # lands mid-night however fast the host is.
    url = ["--replica-url", tiny_replica.base_url, "--static-seats", "1"]
    for sig in (signal.SIGINT, signal.SIGTERM):
        before = len(summaries_so_far(run_dir))
        run = start_run(tmp_path, "stopped", *url, session=True)
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and len(summaries_so_far(run_dir)) < before + 2:
            assert run.poll() is None, run.stdout.read()[-3000:]
            time.sleep(0.2)
        tree = descendants(run.pid)
        sent = time.monotonic()
        send_stop(run.pid, sig)
        try:
            out, _ = run.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            run.kill()
            pytest.fail(f"{sig.name}: `nightshift run` still running 60 s after it")
        exited = time.monotonic() - sent
        assert run.returncode == 128 + sig, (
            f"{sig.name}: a stopped night exits {128 + sig}, not {run.returncode} "
            f"({len(summaries_so_far(run_dir))} of "
            f"{len(docs)} documents done; the run's last output: {out[-2000:]})"
        )
        assert before < len(summaries_so_far(run_dir)) < len(docs), (
            "the signal did not land mid-night"
        )
        left, agents = wait_gone_but_agents(tree, timeout_s=60)
        ray_agents.update(dict.fromkeys(agents, f"nightshift run, {sig.name}"))
        assert not left, (sig.name, [command(p) for p in left])
        print(
            f"{sig.name}: run exited {exited:.1f} s after it, its processes gone {time.monotonic() - sent:.1f} s after it"
        )
    done = set(summaries_so_far(run_dir))
    last = start_run(tmp_path, "stopped", "--replica-url", tiny_replica.base_url)  # 4 seats
    out, _ = last.communicate(timeout=600)
    assert last.returncode == 0, out[-3000:]
    assert f"{len(done)} already done" in out
    assert sorted(summaries_so_far(run_dir)) == docs  # every document exactly once
