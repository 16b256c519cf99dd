"""The fault suite: every test here injects one fault or one bad input and asserts its figure
(docs/results.md, "Faults"). `make faults` runs it alone; `make test` runs it with the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if Path(str(item.fspath)).resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.faults)
