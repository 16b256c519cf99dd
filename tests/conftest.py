"""Shared fixtures: paths to the repository's engine configs and recorded engine output."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return REPO / "tests" / "data"
