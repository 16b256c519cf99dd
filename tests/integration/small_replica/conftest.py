"""One cpu-small replica with the plug-in, shared by the plug-in's own cases (stock against the
budget, pause, a killed controller) and the Gate steering it. It starts once for the folder and
stops when the folder's last case ends. The plug-in's first case needs it fresh (no control
document yet: the plug-in inert, scheduling as stock vLLM) and asserts so; every later case sends
its own documents."""

from __future__ import annotations

import pytest

from tests.replicas import for_this_cpu, replica_of

SMALL = for_this_cpu("cpu-small")


@pytest.fixture(scope="package")
def replica(tmp_path_factory):
    with replica_of(SMALL, tmp_path_factory) as started:
        yield started
