"""One cpu-tiny replica behind an API key (`--api-key`), shared by every case in this folder: bad
documents, the control channel used by its route and abused, its metrics source gone, its run's
Gate or a summarizer killed. The replica starts once for the folder and is stopped when the
folder's last case ends, so no other case's replica runs beside it. Cases leave it serving; the plug-in may be left in any state a controller's next document
replaces (every case that runs a night uses a policy that steers the plug-in)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.replicas import REPO, TINY, replica_of

KEY = "nsk-faults-one-replica-8c2d"
"""The replica's API key: runs get it from `NIGHTSHIFT_REPLICA_API_KEY`, as operators give it."""
FIT = REPO / "engine_configs" / "fits" / "cpu-small.json"
"""The latency fit steering policies send (cpu-tiny has none; the plug-in scales it to this host)."""


def keyed_config(folder: Path) -> Path:
    """cpu-tiny with `api-key` among its vLLM flags, so the API server is started with
    `--api-key KEY` (the control route reads the key from the command line)."""
    doc = yaml.safe_load(TINY.read_text())
    doc["vllm"]["api-key"] = KEY
    path = folder / "cpu-tiny-keyed.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="package")
def replica(tmp_path_factory):
    with replica_of(keyed_config(tmp_path_factory.mktemp("cfg")), tmp_path_factory) as started:
        yield started
