"""Where nightshift finds its engine interpreter, its model cache and its repository data.

The control plane and the engine live in two virtual environments (docs/design.md §5), so the launcher and
the model builder run the engine's interpreter as a subprocess rather than importing vLLM.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_PORT = 8000
"""Where every command that starts replicas starts them: `engine up` on this port, the others on
the first free run of ports from here, so two commands started side by side never collide."""

REPO_ROOT = Path(__file__).resolve().parents[1]


class SetupError(RuntimeError):
    """A missing piece of the installation; the message says which command provides it."""


def engine_python() -> Path:
    """The interpreter of `.venv-engine` (override with NIGHTSHIFT_ENGINE_PYTHON)."""
    override = os.environ.get("NIGHTSHIFT_ENGINE_PYTHON")
    path = Path(override) if override else REPO_ROOT / ".venv-engine" / "bin" / "python"
    if not path.exists():
        raise SetupError(
            f"engine interpreter {path} not found: run `make engine-venv` to create it"
        )
    return path


def cache_root() -> Path:
    """Root of built artefacts such as local models (override with NIGHTSHIFT_CACHE)."""
    return Path(os.environ.get("NIGHTSHIFT_CACHE", Path.home() / ".cache" / "nightshift"))
