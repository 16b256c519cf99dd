"""`nightshift bench`'s SLO options: checked before any replica starts, named in the error."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app

CONFIG = Path(__file__).resolve().parents[2] / "engine_configs" / "cpu-small-fp32.yaml"


@pytest.mark.parametrize("option", ["--itl-slo-ms", "--ttft-slo-ms", "--e2e-slo-ms"])
def test_an_slo_of_zero_is_refused_by_its_option_before_any_work(tmp_path, option):
    results = tmp_path / "results"
    done = CliRunner().invoke(
        app, ["bench", "--engine-config", str(CONFIG), "--results", str(results), option, "0"]
    )
    assert done.exit_code != 0
    assert f"{option} 0: give the p99 latency in milliseconds, above 0" in done.output
    assert not results.exists(), "nothing written"
