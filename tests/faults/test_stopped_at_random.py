"""`make demo` and `nightshift bench` stopped from outside at a random point: a terminal's Ctrl-C
(SIGINT to the command's whole process group), a supervisor's SIGTERM or a `kill -9` (to the
command alone), drawn at random with the point: one of the command's stages (just started, the
replica starting, chat alone, the night under way), then a random few seconds into it.

Whatever the draw, the command exits within a minute without aborting (no process of it ends on
SIGABRT with Ray's native stack trace), nothing it started is left (replica, Ray, Prefect's server,
and for `make demo` the demo under make), its replica's port is free, and every file its runs
wrote reads back: each table of each run folder, no document summarized twice, the DuckDB file
opens. That a stopped night's next run finishes it without loss or repeats is
`test_run_killed.py`'s case (the same flow). Each test draws one signal and one moment; the seed
is printed and `NIGHTSHIFT_STOP_SEED` replays it (`NIGHTSHIFT_STOP_SIGNAL=INT|TERM|KILL` forces
the signal, for a table of every kind).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

from bench.processes import command, descendants, group_members
from scheduler.run_schemas import RUN_TABLES
from serving.launcher import port_in_use
from tests.faults.conftest import send_stop, wait_gone_but_agents
from tests.replicas import TINY
from warehouse.run_files import list_runs, read_table, run_dir

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)


INTO_STAGE_S = 8.0
"""The signal lands up to this long after its stage is reached."""
Stage = tuple[str, Callable[[], bool]]


def draw(name: str, stages: list[Stage]) -> tuple[signal.Signals, Stage, float, int]:
    """The signal, the stage and the seconds into it, from a seed that is printed (and taken
    from `NIGHTSHIFT_STOP_SEED` when set)."""
    seed = int(os.environ.get("NIGHTSHIFT_STOP_SEED") or random.SystemRandom().randrange(10**6))
    rng = random.Random(f"{name}:{seed}")
    sig, stage, into = rng.choice(SIGNALS), rng.choice(stages), rng.uniform(0, INTO_STAGE_S)
    forced = os.environ.get("NIGHTSHIFT_STOP_SIGNAL")
    return (signal.Signals[f"SIG{forced}"] if forced else sig), stage, into, seed


def stop_at_random(
    argv: list[str],
    name: str,
    stages: list[Stage],
    results: Path,
    cwd: Path,
    agents: dict[int, str],
) -> str:
    """Start `argv` as a terminal would (the leader of its own process group), signal it at a
    random point of a random stage, and check what it leaves. Returns a line for the results
    table: signal, stage, moment, how long it took to exit, the last thing the command said."""
    sig, (stage, reached), into, seed = draw(name, stages)
    log = results.parent / f"{name.replace(' ', '-')}.log"  # a file: a full pipe would stall it
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv, cwd=cwd, start_new_session=True, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "PREFECT_HOME": str(results / "prefect")},
        )  # fmt: skip
    replay = f"{name}: {sig.name} {into:.1f} s into {stage} (NIGHTSHIFT_STOP_SEED={seed})"
    seen: set[int] = set()  # every process ever seen below the command, up to the signal
    started, at = time.monotonic(), None
    while at is None or time.monotonic() < at:
        assert proc.poll() is None, f"{replay}: ended before the signal\n{tail(log)}"
        assert time.monotonic() - started < 600, f"{replay}: stage never reached\n{tail(log)}"
        if at is None and reached():
            at = time.monotonic() + into
        seen |= descendants(proc.pid)
        time.sleep(0.05)
    seen |= descendants(proc.pid) | replica_groups(results)
    sent = time.monotonic()
    send_stop(proc.pid, sig)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"{replay}: still running 60 s after the signal\n{tail(log)}")
    exited = time.monotonic() - sent
    said = log.read_text(errors="replace")
    aborted = proc.returncode == -signal.SIGABRT or "SIGTERM received" in said  # Ray's trace
    assert not aborted, f"{replay}: aborted\n{tail(log)}"
    left, lingering = wait_gone_but_agents(seen, timeout_s=60)
    agents.update(dict.fromkeys(lingering, replay))  # checked at the session's end (`ray_agents`)
    assert not left, (replay, [command(p) for p in left])
    for port in replica_ports(results):
        assert not port_in_use("127.0.0.1", port), f"{replay}: port {port} still held"
    check_files(results, replay)
    said = [line for line in said.splitlines() if line.strip()]
    line = (
        f"{replay}, {sent - started:.1f} s after the start: exit {proc.returncode} {exited:.1f} s "
        f"after it; last said: {said[-1:]}"
    )
    print(line)
    return line


def tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


def replicas(results: Path) -> list[dict]:
    """The replicas the command recorded under `results` (none before the first starts)."""
    state = results / "engines" / "replicas.json"
    try:
        return json.loads(state.read_text())
    except (OSError, ValueError):
        return []  # not written yet, or being replaced: the descendants scan has its processes


def replica_groups(results: Path) -> set[int]:
    """Every live process of the recorded replicas' process groups."""
    return set().union(set(), *(group_members(r["pid"]) for r in replicas(results)))


def replica_ports(results: Path) -> set[int]:
    return {r["port"] for r in replicas(results)}


def check_files(results: Path, replay: str) -> None:
    """Every table of every run under `results` reads back, no document has two summaries, and
    the DuckDB file (where one was written) opens."""
    for run_id in list_runs(results):
        directory = run_dir(results, run_id)
        for name in RUN_TABLES:
            read_table(directory, name)
        done = read_table(directory, "summaries").column("doc_id").to_pylist()
        assert len(done) == len(set(done)), f"{replay}: run {run_id} has a document twice"
    db = results / "nightshift.duckdb"
    if db.exists():
        duckdb.connect(str(db), read_only=True).close()


def started() -> bool:
    return True


def replica_recorded(results: Path) -> Callable[[], bool]:
    return lambda: (results / "engines" / "replicas.json").exists()


def night_under_way(results: Path, run_suffix: str = "") -> Callable[[], bool]:
    return lambda: any(r.endswith(run_suffix) for r in list_runs(results))


def test_make_demo_stopped_at_a_random_point(tmp_path: Path, ray_agents) -> None:
    """Stages: make just started; the replica starting; chat alone; the night under way (the
    whole demo takes ~2 minutes on a quiet host, the replica's start ~40 s of it)."""
    results = tmp_path / "results"
    log = tmp_path / "make-demo.log"
    stages = [
        ("make's start", started),
        ("the replica's start", replica_recorded(results)),
        ("chat alone", lambda: "chat alone for" in log.read_text(errors="replace")),
        ("the night", night_under_way(results)),
    ]
    argv = ["make", "-s", "demo", f"DEMO_ARGS=--results {results}"]
    stop_at_random(argv, "make demo", stages, results, REPO, ray_agents)


def test_nightshift_bench_stopped_at_a_random_point(tmp_path: Path, ray_agents) -> None:
    """Stages: just started; the replica starting; the warm-up night (mixed load) under way; the
    controlled night under way (cpu-tiny)."""
    results = tmp_path / "results"
    argv = [
        str(Path(sys.executable).with_name("nightshift")), "bench", "--engine-config", str(TINY),
        "--scenarios", "chat-only,controlled", "--duration", "20", "--warmup", "5",
        "--docs", "20", "--results", str(results), "--json", str(tmp_path / "bench.json"),
        # cpu-tiny has no fit of its own; any will do, the stop is measured, not the steering
        "--latency-model", str(REPO / "engine_configs" / "fits" / "cpu-small.json"),
    ]  # fmt: skip
    stages = [
        ("the command's start", started),
        ("the replica's start", replica_recorded(results)),
        ("the warm-up night", night_under_way(results, "-warmup")),
        ("the controlled night", night_under_way(results, "-controlled")),
    ]
    stop_at_random(argv, "nightshift bench", stages, results, tmp_path, ray_agents)
