"""Shared fixtures: the repository's paths, recorded engine output, and one cpu-tiny replica for
the whole session (started by the first test that asks for it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from serving.engine_config import load_engine_config
from serving.launcher import ReplicaSet
from tests.replicas import TINY, free_port_block

REPO = Path(__file__).resolve().parents[1]


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
