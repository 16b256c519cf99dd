"""Shared fixtures: the repository's paths, recorded engine output, and one cpu-tiny replica for
the whole session (started by the first test that asks for it)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from serving.engine_config import load_engine_config
from serving.launcher import ReplicaSet
from tests.replicas import TINY, free_port_block

REPO = Path(__file__).resolve().parents[1]

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    # A suite started in the background (`make test &`) ignores SIGINT, and every command it
    # starts would inherit that: the Ctrl-C cases would send a signal nobody hears. A handler,
    # unlike an ignored signal, is reset to the default in each command the suite starts.
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return REPO / "tests" / "data"


@pytest.fixture(scope="session")
def tiny_replica(tmp_path_factory):
    """One cpu-tiny replica for the whole session."""
    replicas = ReplicaSet(tmp_path_factory.mktemp("engines"))
    with replicas.running(load_engine_config(TINY), str(TINY), free_port_block(1)) as started:
        yield started[0]
