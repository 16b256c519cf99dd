"""The fault suite: every test here injects one fault or one bad input and asserts its figure
(docs/results.md, "Faults"). `make faults` runs it alone; `make test` runs it with the rest."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from bench.processes import alive, command, wait_gone

HERE = Path(__file__).resolve().parent
RAY_AGENTS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")
"""Ray's node agents: they notice their raylet is gone only a minute or two after it."""
RAY_AGENT_SCRIPTS = ("/ray/dashboard/agent.py", "/ray/_private/runtime_env/agent/main.py")
"""The same agents before they take their titles (their first second or so after the raylet
starts them), when their command line is still `python -u .../agent.py ...`."""


@pytest.fixture(scope="session")
def ray_agents():
    """Ray node agents of the runs the fault cases stopped, `{pid: case}`, checked once the
    session's tests are done, so that no case sits out the minute or two they take to notice."""
    agents: dict[int, str] = {}
    yield agents
    left = wait_gone(agents, timeout_s=150)
    assert not left, [f"{agents[p]}: {command(p)}" for p in left]


def agents_among(pids: set[int]) -> set[int]:
    """Those of `pids` that are Ray node agents (see `ray_agents`), titled or not yet."""
    lines = {p: command(p) for p in pids}
    return {
        p for p, line in lines.items()
        if line.startswith(RAY_AGENTS) or any(s in line for s in RAY_AGENT_SCRIPTS)
    }  # fmt: skip


def wait_gone_but_agents(pids: set[int], timeout_s: float) -> tuple[set[int], set[int]]:
    """Wait up to `timeout_s` for every one of `pids` that is not a Ray node agent to end;
    returns (those left, the agents among `pids` still alive). Agents are told apart at each
    look, not once: a process seen as the raylet's fork, or as an agent before its title,
    becomes one only later."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = alive(pids)
        lingering = agents_among(left)
        if not left - lingering or time.monotonic() >= deadline:
            return left - lingering, lingering
        time.sleep(0.25)


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if Path(str(item.fspath)).resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.faults)


def send_stop(pid: int, sig: signal.Signals) -> None:
    """Stop a command as it is stopped in life: SIGINT to its whole process group (a terminal's
    Ctrl-C; the command leads its group), any other signal to the command alone."""
    if sig == signal.SIGINT:
        os.killpg(pid, sig)
    else:
        os.kill(pid, sig)
