"""A Prefect home of its own for each night a test starts, its database already migrated.

Each case gives its runs a `PREFECT_HOME` of its own, so that no case sees another's flow runs.
Prefect's temporary server migrates a new database on its first start, seconds of both cores on
a small host and on the run's critical path, once per case. A case's home instead starts with a
copy of one database migrated once per session, which the server finds current."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

DATABASE = "prefect.db"
"""The file Prefect's default database URL names inside `PREFECT_HOME`."""


@functools.cache
def _migrated() -> Path:
    home = Path(tempfile.mkdtemp(prefix="nightshift-prefect-home-"))
    atexit.register(shutil.rmtree, home, True)
    subprocess.run(
        [sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"],
        env={**os.environ, "PREFECT_HOME": str(home)},
        check=True,
        capture_output=True,
        timeout=300,
    )
    return home / DATABASE


def prefect_home(path: Path) -> str:
    """`path`, made a Prefect home holding a migrated database unless it holds one already (a
    case's second run keeps its first run's flow runs)."""
    path.mkdir(parents=True, exist_ok=True)
    if not (path / DATABASE).exists():
        shutil.copyfile(_migrated(), path / DATABASE)
    return str(path)
