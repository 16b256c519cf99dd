"""Real vLLM replicas for the integration and fault tests, started from the repository's engine
configs; the session's shared cpu-tiny replica is the `tiny_replica` fixture (tests/conftest.py)."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

from serving.cpu_features import cpu_flags, float32_twin
from serving.engine_config import load_engine_config
from serving.launcher import ReplicaSet
from serving.replica_targets import fit_path

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "engine_configs" / "cpu-tiny.yaml"


def for_this_cpu(name: str) -> Path:
    """`engine_configs/<name>.yaml`, or on a CPU without native bf16 its float32 twin, as `make
    demo` picks: bf16 there takes a fallback path many times slower than the config's fit, and a
    case that holds chat to an SLO in milliseconds would measure the fallback, not the product."""
    return float32_twin(REPO / "engine_configs" / f"{name}.yaml", cpu_flags())


def fit_of(config_path: Path) -> Path:
    """The latency fit the engine config at `config_path` names."""
    return fit_path(config_path, load_engine_config(config_path))


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
