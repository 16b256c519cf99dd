"""Real vLLM replicas for the integration and fault tests, started from the repository's engine
configs; the session's shared cpu-tiny replica is the `tiny_replica` fixture (tests/conftest.py)."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

from serving.engine_config import load_engine_config
from serving.launcher import ReplicaSet

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "engine_configs" / "cpu-tiny.yaml"


def free_port_block(count: int) -> int:
    """First port of `count` consecutive free ports."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            first = s.getsockname()[1]
        if first + count < 65000 and all(_free(first + i) for i in range(count)):
            return first
    raise RuntimeError("no block of free ports found")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def replica_of(config_path: Path, tmp_path_factory):
    """One replica of `config_path`, in a state folder of its own, stopped on any exit."""
    replicas = ReplicaSet(tmp_path_factory.mktemp("engines"))
    config = load_engine_config(config_path)
    with replicas.running(config, str(config_path), free_port_block(1)) as started:
        yield started[0]
