"""The fault suite: every test here injects one fault or one bad input and asserts its figure
(docs/results.md, "Faults"). `make faults` runs it alone; `make test` runs it with the rest."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from bench.processes import command, wait_gone

HERE = Path(__file__).resolve().parent
RAY_AGENTS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")
"""Ray's node agents: they notice their raylet is gone only a minute or two after it."""


@pytest.fixture(scope="session")
def ray_agents():
    """Ray node agents of the runs the fault cases stopped, `{pid: case}`, checked once the
    session's tests are done, so that no case sits out the minute or two they take to notice."""
    agents: dict[int, str] = {}
    yield agents
    left = wait_gone(agents, timeout_s=150)
    assert not left, [f"{agents[p]}: {command(p)}" for p in left]


def agents_among(pids: set[int]) -> set[int]:
    """Those of `pids` that are Ray node agents (see `ray_agents`)."""
    return {p for p in pids if command(p).startswith(RAY_AGENTS)}


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
