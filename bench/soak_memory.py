"""Resident memory of the night's long-lived processes, by role, and its growth over the night.

Pure: command lines and VmRSS figures in, roles and growth out (`bench.processes` reads
/proc). A role groups the processes that do one job (the replica's engine core, Ray's raylet, the
summarizer workers), because the faults replace processes: the engine core at the end of the
night may be another process than at its start. Growth is judged per process of a role (its
total over its count), so a role whose count changes (Ray starts and ends idle workers) is judged
by what each of its processes holds, which is where a leak shows.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

GROWTH_LIMIT = 0.10
"""Largest growth of a role's resident memory per process from the start of the night to its end."""
NOT_JUDGED = {
    "prometheus": "Prometheus keeps the last two hours of samples in memory (its head block), so "
    "it grows through any night by design; it stands in for the team's server",
}
"""Roles reported but not held to `GROWTH_LIMIT`, and why."""
MEASURED = (
    "replica API server",
    "replica engine core",
    "run driver",
    "ray raylet",
    "ray GCS",
    "ray worker Summarize",
    "prometheus",
    "chat-load",
)
"""The night's long-lived processes: each must be measured at both ends, or the soak cannot say
that none of them grew."""

_RAY_TASK = re.compile(r"^ray::(\w+)")
_PARENTHESIZED = re.compile(r"\((\w+)\)")


@dataclass(frozen=True)
class ProcessMemory:
    """One process as sampled: who started it (`owner`), its command line and VmRSS."""

    pid: int
    owner: str
    """`replica`, `run`, `prometheus` or `chat-load`: the process tree it was found in."""
    cmdline: str
    rss_kib: int
    root: bool = False
    """The process the owner started itself (the run's driver, chat load's process)."""


def role_of(p: ProcessMemory) -> str:
    """The role of one process, from its owner and command line."""
    cmd = p.cmdline
    if p.owner == "replica":
        if "serving.replica_guard" in cmd:
            return "replica guard"
        if "api_server" in cmd:
            return "replica API server"
        if "EngineCore" in cmd:
            return "replica engine core"
        if "resource_tracker" in cmd:
            return "replica resource tracker"
        if "Worker" in cmd or "multiprocessing.spawn" in cmd:
            return "replica worker"
        return "replica other"
    if p.owner == "run":
        return "run driver" if p.root else _run_role(cmd)
    return p.owner


def _run_role(cmd: str) -> str:
    program = cmd.split(" ", 1)[0]
    if program.endswith("raylet"):
        return "ray raylet"
    if program.endswith("gcs_server"):
        return "ray GCS"
    if match := _RAY_TASK.match(cmd):
        name = match.group(1)
        if name == "MapWorker" and (inner := _PARENTHESIZED.findall(cmd)):
            return f"ray worker {inner[-1]}"  # ray::MapWorker(MapBatches(Summarize))[.method]
        if name == "IDLE":
            return "ray idle worker"
        return f"ray {name}"
    if "prefect" in cmd and "uvicorn" in cmd:
        return "prefect server"
    if any(part in cmd for part in ("dashboard", "runtime_env", "log_monitor", "autoscaler")):
        return "ray agent"
    return "run other"


def by_role(sample: Iterable[ProcessMemory]) -> dict[str, dict]:
    """Per role: processes, their pids, total and per-process resident MiB, and the command line
    of its first process (what the role is, for a reader)."""
    roles: dict[str, list[ProcessMemory]] = {}
    for p in sample:
        roles.setdefault(role_of(p), []).append(p)
    return {
        role: {
            "processes": len(ps),
            "pids": sorted(p.pid for p in ps),
            "rss_mib": round(sum(p.rss_kib for p in ps) / 1024, 1),
            "per_process_mib": round(sum(p.rss_kib for p in ps) / 1024 / len(ps), 1),
            "command": min(ps, key=lambda p: p.pid).cmdline[:120],
        }
        for role, ps in sorted(roles.items())
    }


def growth(start: dict[str, dict], end: dict[str, dict], limit: float = GROWTH_LIMIT) -> list[dict]:
    """One row per role seen at either end: per-process MiB at start and end, growth (a
    fraction; None where the role is missing at one end, which is then not judged), whether the
    same processes were measured at both ends, and whether the growth is over `limit` (never for
    a role in `NOT_JUDGED`)."""
    rows = []
    for role in sorted(set(start) | set(end)):
        a, b = start.get(role), end.get(role)
        pct = None
        if a and b and a["per_process_mib"] > 0:
            pct = round(b["per_process_mib"] / a["per_process_mib"] - 1, 4)  # 110/100 is 10%
        rows.append(
            {
                "role": role,
                "start_mib": a["per_process_mib"] if a else None,
                "end_mib": b["per_process_mib"] if b else None,
                "start_processes": a["processes"] if a else 0,
                "end_processes": b["processes"] if b else 0,
                "growth": pct,
                "same_processes": bool(a and b and a["pids"] == b["pids"]),
                "over_limit": pct is not None and pct > limit and role not in NOT_JUDGED,
                "judged": role not in NOT_JUDGED,
            }
        )
    return rows


def unmeasured(start: dict[str, dict], end: dict[str, dict]) -> list[str]:
    """The roles of `MEASURED` missing from the start or the end sample."""
    return [role for role in MEASURED if role not in start or role not in end]
