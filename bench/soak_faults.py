"""The faults the soak injects into its night, the way the fault suite does one at a time.

Each fault finds its target (waiting a bounded time for it: after an earlier fault the run may
still be starting again), injects, and returns what happened: `ok`, a `detail` line, `ended_at`
(when the fault was over: the replica answering again, Prometheus continued) and, for some, the
times the report needs. A fault never raises for a missing target: the night goes on and the log
says what was not done.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable

from bench import processes
from bench import soak_processes as procs
from bench.soak_night import Night
from bench.soak_plan import PROMETHEUS_STOP_S, may_start_attempt

TARGET_WAIT_S = 120.0
"""Longest a fault waits for its target to appear."""
RAY_AGENTS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")
"""Ray's node agents notice their raylet is gone only a minute or two later; a rerun does not
wait for them (the fault suite's kill case makes the same exception)."""


def _run_processes(night: Night, match: Callable[[str], bool], wait_s: float) -> list[int]:
    """Processes of the running attempt whose command line matches, waiting up to `wait_s` for
    one; none at once when no attempt runs (the soak starts the next one, not this wait)."""
    deadline = time.monotonic() + wait_s
    while True:
        run = night.run
        if run is None or night.run_ended():
            return []
        found = [p for p in processes.descendants(run.proc.pid) if match(processes.command(p))]
        if found or time.monotonic() >= deadline:
            return sorted(found)
        time.sleep(1.0)


def _kill(pid: int) -> str:
    cmd = processes.command(pid)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return f"killed {pid} ({cmd[:60]})"


def worker_killed(night: Night, wait_s: float = TARGET_WAIT_S) -> dict:
    """kill -9 of one `ray::MapWorker(MapBatches(Summarize))`: Ray Data restarts it, the Gate
    takes back its seats when their lease lapses."""
    found = _run_processes(
        night, lambda c: c.startswith("ray::MapWorker") and "Summarize" in c, wait_s
    )
    if not found:
        return {"ok": False, "detail": "no summarizer worker found", "ended_at": time.time()}
    return {"ok": True, "detail": _kill(found[0]), "ended_at": time.time()}


def gate_killed(night: Night, wait_s: float = TARGET_WAIT_S) -> dict:
    """kill -9 of the run's `ray::GateActor`: the attempt ends and the flow's retry resumes."""
    found = _run_processes(night, lambda c: c.startswith("ray::GateActor"), wait_s)
    if not found:
        return {"ok": False, "detail": "no Gate actor found", "ended_at": time.time()}
    return {"ok": True, "detail": _kill(found[0]), "ended_at": time.time()}


def prometheus_stopped(night: Night, stop_s: float = PROMETHEUS_STOP_S) -> dict:
    """SIGSTOP of the Prometheus the controller reads, SIGCONT after `stop_s`: the controller
    decides `stale` and pauses batch, and cold-starts when it answers again."""
    assert night.prometheus is not None
    pid = night.prometheus.pid
    os.kill(pid, signal.SIGSTOP)
    stopped_at = time.time()
    try:
        time.sleep(stop_s)
    finally:
        os.kill(pid, signal.SIGCONT)
    resumed_at = time.time()
    return {
        "ok": True,
        "detail": f"prometheus {pid} stopped for {resumed_at - stopped_at:.0f} s",
        "ended_at": resumed_at,
        "stopped_at": stopped_at,
        "resumed_at": resumed_at,
    }


def replica_restarted(night: Night) -> dict:
    """kill -9 of the replica's process group, then a new replica on the same port (the same
    name and URL to the Gate, which brings it back once its sensor reads it afresh)."""
    assert night.replica is not None
    old, port = night.replica.pid, night.replica.port
    killed_at = time.time()
    night.kill_replica()
    try:
        new = night.start_replica(port)
    except Exception as exc:  # the night goes on without it, and the log says so
        return {
            "ok": False,
            "detail": f"group {old} killed; no replica again on port {port}: {exc}"[:300],
            "ended_at": time.time(),
        }
    back = time.time()
    return {
        "ok": True,
        "detail": f"group {old} killed; a new replica ({new.pid}) answered on port {port} "
        f"{back - killed_at:.0f} s later",
        "ended_at": back,
        "down_s": round(back - killed_at, 1),
    }


def run_killed(night: Night, deadline_ts: float, wait_s: float = TARGET_WAIT_S) -> dict:
    """kill -9 of `nightshift run` mid-night (once its Gate runs), then the same command again:
    the new attempt resumes the run id, recording what the killed one had in flight."""
    _run_processes(night, lambda c: c.startswith("ray::GateActor"), wait_s)
    attempt = night.run
    if attempt is None or night.run_ended():
        return {"ok": False, "detail": "no run attempt running", "ended_at": time.time()}
    tree = processes.descendants(attempt.proc.pid)
    os.kill(attempt.proc.pid, signal.SIGKILL)
    attempt.proc.wait()
    night.run_ended()
    agents = {p for p in tree if processes.command(p).startswith(RAY_AGENTS)}
    left = procs.wait_gone(tree - agents, timeout_s=60)
    detail = (
        f"killed run attempt {attempt.number} ({attempt.proc.pid}) and {len(tree)} processes "
        f"below it; {len(left)} of them (Ray's agents apart) still there 60 s later"
    )
    if not may_start_attempt(time.time(), deadline_ts):
        return {"ok": False, "detail": detail + "; too close to the deadline to rerun",
                "ended_at": time.time()}  # fmt: skip
    rerun = night.start_run("rerun after run-killed")
    return {
        "ok": not left,
        "detail": f"{detail}; attempt {rerun.number} started with the same run id",
        "ended_at": time.time(),
        "left": [processes.command(p)[:120] for p in sorted(left)],
    }


def inject(name: str, night: Night, deadline_ts: float) -> dict:
    """Run fault `name` (one of `bench.soak_plan.FAULT_FRACTIONS`)."""
    if name == "worker-killed":
        return worker_killed(night)
    if name == "gate-killed":
        return gate_killed(night)
    if name == "prometheus-stopped":
        return prometheus_stopped(night)
    if name == "replica-restarted":
        return replica_restarted(night)
    if name == "run-killed":
        return run_killed(night, deadline_ts)
    raise ValueError(f"unknown fault {name!r}")
