"""A real Ray cluster on this host for tests: each node a separate `ray start` process.

Each node is its own `ray start --block` process in a session of its own, with its own temp dir
(its logs, sockets and spill files), its own loopback address (the head 127.0.0.1, which Ray
reports as the host's address, the others 127.0.0.2 and up: a driver started on this host joins
the head's raylet), free ports, a small CPU count, and a custom resource naming it so a test can
tell which node ran what. Nodes take `env` (the code on their PYTHONPATH, as a team's nodes have
their checkout) and run in `cwd`, which a test can check the run never wrote to.

Stopping never runs `ray stop`, which stops every Ray instance of the host, other users' test
runs included: it SIGTERMs each `ray start` (which stops its node's processes), then SIGKILLs what
is left of that node's session (the raylet starts each worker in a process group of its own,
within the session).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.processes import session_members, wait_gone
from tests.replicas import free_port_block

RAY = Path(sys.executable).parent / "ray"
READY = "block forever"
"""What `ray start --block` prints once its node is up and registered with the head."""


@dataclass
class RayNode:
    name: str
    """Also the node's custom resource (`{name: 1}`)."""
    ip: str
    process: subprocess.Popen
    temp_dir: Path
    log: Path

    def running(self) -> bool:
        return self.process.poll() is None


@dataclass
class RayCluster:
    address: str
    """The head's GCS address, what `RAY_ADDRESS` takes."""
    nodes: list[RayNode]

    @property
    def head(self) -> RayNode:
        return self.nodes[0]


def _start_node(name: str, ip: str, args: list[str], root: Path, env: dict, cwd: Path) -> RayNode:
    temp_dir = root / name
    temp_dir.mkdir(parents=True)
    log = root / f"{name}.log"
    cmd = [
        str(RAY), "start", "--block", "--disable-usage-stats", f"--node-ip-address={ip}",
        "--num-cpus=2", f"--resources={json.dumps({name: 1})}", f"--temp-dir={temp_dir}",
        f"--dashboard-agent-listen-port={free_port_block(1)}", *args,
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
        )
    return RayNode(name, ip, process, temp_dir, log)


def _wait_ready(node: RayNode, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while READY not in node.log.read_text(errors="replace"):
        if not node.running() or time.monotonic() > deadline:
            tail = node.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"Ray node {node.name} did not start; its log ends:\n{tail}")
        time.sleep(0.2)


def stop_node(node: RayNode, grace_s: float = 15.0) -> set[int]:
    """Stop one node and everything of its session; returns what survived SIGKILL (nothing)."""
    sid = node.process.pid
    members = session_members(sid)
    with contextlib.suppress(ProcessLookupError):
        os.kill(sid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        node.process.wait(timeout=grace_s)
    left = wait_gone(members | session_members(sid), 5.0)
    for pid in left | session_members(sid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        node.process.wait(timeout=5)
    return wait_gone(left | session_members(sid), 5.0)


@contextlib.contextmanager
def ray_cluster(
    env: dict, cwd: Path, workers: int = 1, timeout_s: float = 90.0, keep_logs: Path | None = None
):
    """A head and `workers` more nodes, all stopped on any exit (a failed start included), their
    temp dirs removed, each node's session logs first copied to `keep_logs/<node>` if given (an
    actor that died mid-test is explained only there). The temp dirs live under a short path:
    Ray's sockets are in them, and a Unix socket's path has at most 107 bytes."""
    root = Path(tempfile.mkdtemp(prefix="nsray-"))
    port = free_port_block(1)
    nodes: list[RayNode] = []
    address = f"127.0.0.1:{port}"
    try:
        head = ["--head", f"--port={port}", "--include-dashboard=false"]
        nodes.append(_start_node("ns_head", "127.0.0.1", head, root, env, cwd))
        _wait_ready(nodes[0], timeout_s)
        for i in range(workers):
            args = [f"--address={address}"]
            nodes.append(_start_node(f"ns_node{i + 1}", f"127.0.0.{i + 2}", args, root, env, cwd))
        for node in nodes[1:]:
            _wait_ready(node, timeout_s)
        yield RayCluster(address, nodes)
    finally:
        for node in reversed(nodes):
            stop_node(node)
        if keep_logs is not None:
            for node in nodes:
                logs = node.temp_dir / "session_latest" / "logs"
                with contextlib.suppress(OSError, shutil.Error):  # logs, not the test's result
                    shutil.copytree(logs, keep_logs / node.name, dirs_exist_ok=True)
        shutil.rmtree(root, ignore_errors=True)
