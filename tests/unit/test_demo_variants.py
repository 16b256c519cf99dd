"""Which demo the command line asks for, and which engine config and fit it takes on a host."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.demo_variants import LONG, SHORT, DemoRefused, host_config, parse_demo

REPO = Path(__file__).resolve().parents[2]


def in_repo(path: Path) -> bool:
    return (REPO / path).exists()


def test_the_command_line_picks_the_variant() -> None:
    assert parse_demo([]) == (LONG, Path("results"))
    assert parse_demo(["--short", "--results", "/tmp/r"]) == (SHORT, Path("/tmp/r"))
    with pytest.raises(SystemExit) as exc:
        parse_demo(["--shrt"])
    assert exc.value.code == 2


def test_long_sends_80k_documents_whole_and_short_in_sections() -> None:
    assert LONG.pipeline == {"mode": "whole"} and LONG.min_tokens >= 78_000
    assert SHORT.pipeline["mode"] == "map_reduce"
    assert LONG.itemized and not SHORT.itemized


@pytest.mark.parametrize("demo", [SHORT, LONG], ids=["short", "long"])
def test_a_bf16_host_runs_the_bf16_config_with_its_fit(demo) -> None:
    config, fit = host_config(demo, no_native_bf16=False, exists=in_repo)
    assert config == Path(f"engine_configs/{demo.config}.yaml") and in_repo(config)
    assert fit == Path(f"engine_configs/fits/{demo.config}.json")


def test_short_on_a_host_without_bf16_runs_the_fitted_float32_twin() -> None:
    config, fit = host_config(SHORT, no_native_bf16=True, exists=in_repo)
    assert (config.name, fit.name) == ("cpu-small-fp32.yaml", "cpu-small-fp32.json")


def test_long_on_a_host_without_bf16_uses_the_twin_once_fitted_and_says_how_before() -> None:
    config, fit = host_config(LONG, no_native_bf16=True, exists=lambda p: True)
    assert (config.name, fit.name) == ("cpu-long-fp32.yaml", "cpu-long-fp32.json")
    with pytest.raises(DemoRefused) as refused:
        host_config(LONG, no_native_bf16=True, exists=lambda p: False)
    message = str(refused.value)
    assert "no native bf16" in message
    assert (
        "nightshift calibrate --engine-config engine_configs/cpu-long-fp32.yaml "
        "--out engine_configs/fits/cpu-long-fp32.json" in message
    )
