"""One cpu-tiny replica with a small KV pool (`num-gpu-blocks-override`), shared by this folder's
cases: KV pressure, which needs the small pool, then the replica restarted under its URL, which
kills it and starts its successor on the same port. That case runs last in the folder (files run
in name order), and the replica is stopped when the folder's last case ends."""

from __future__ import annotations

import pytest
import yaml

from tests.replicas import TINY, replica_of

BLOCKS = 256
"""The replica's KV pool in 32-token blocks: 8,192 tokens."""


@pytest.fixture(scope="package")
def pool_config(tmp_path_factory):
    doc = yaml.safe_load(TINY.read_text())
    doc["vllm"]["num-gpu-blocks-override"] = BLOCKS
    path = tmp_path_factory.mktemp("cfg") / "cpu-tiny-small-kv.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="package")
def replica(pool_config, tmp_path_factory):
    with replica_of(pool_config, tmp_path_factory) as started:
        yield started
