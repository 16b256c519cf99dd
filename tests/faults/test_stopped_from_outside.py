"""A command that owns a replica (a run, a bench) stopped from outside at each stage of the
replica's start-up: SIGKILL while the engine imports, SIGTERM once its engine core is forked (the
window in which the API server could die and leave the core holding the port). (A replica that
serves is stopped by its owner's clean exit; the integration tests' fixtures exercise that.) Nothing of the replica's process group may be left, and its port must be free."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.processes import command, descendants, group_members, wait_gone
from serving.launcher import port_in_use
from tests.replicas import TINY, free_port_block

pytestmark = pytest.mark.engine

OWNER = """
import sys, time
from serving.engine_config import load_engine_config
from serving.launcher import ReplicaSet
config = load_engine_config(sys.argv[1])
with ReplicaSet(sys.argv[2]).running(config, sys.argv[1], int(sys.argv[3])):
    print("serving", flush=True)
    time.sleep(3600)
"""


def engine_core_forked(owner: int) -> bool:
    return any(
        "EngineCore" in command(p) or "VLLM::" in command(p) for p in descendants(owner)
    ) or (sum("api_server" in command(p) for p in descendants(owner)) >= 2)


@pytest.mark.parametrize(
    ("sig", "stage"),
    [(signal.SIGKILL, "importing"), (signal.SIGTERM, "engine core forked")],
)
def test_owner_stopped_leaves_no_replica(sig, stage, tmp_path: Path) -> None:
    port = free_port_block(1)
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(TINY), str(tmp_path), str(port)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    state = tmp_path / "replicas.json"
    deadline = time.monotonic() + 300
    reached = {
        "importing": lambda: state.exists(),
        "engine core forked": lambda: engine_core_forked(owner.pid),
    }[stage]
    while not reached():
        assert owner.poll() is None and time.monotonic() < deadline, f"never reached {stage}"
        time.sleep(0.05)
    (replica,) = json.loads(state.read_text())
    tree = descendants(owner.pid)
    os.kill(owner.pid, sig)
    owner.wait(timeout=60)
    left = wait_gone(tree | group_members(replica["pid"]), timeout_s=45)
    assert not left, [command(p) for p in left]
    assert not port_in_use("127.0.0.1", port)
