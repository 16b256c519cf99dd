"""`nightshift plan --fleet`: an engine config and a chat load in, the fleet plan out; bad input
refused with the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from bench.fleet_run import step_model_path
from flows.cli_plan import register
from serving.engine_config import load_engine_config

CONFIGS = Path(__file__).resolve().parents[2] / "engine_configs"
PROFILE = CONFIGS / "h100x2-llama-3.1-70b-fp8.yaml"


def _run(*args: str):
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """Test app: a callback keeps `plan` a subcommand."""

    register(app)
    return CliRunner().invoke(app, ["plan", *args])


def test_fleet_for_the_70b_profile_writes_the_three_answers(tmp_path):
    out = tmp_path / "fleet.json"
    result = _run(
        "--fleet", "--engine-config", str(PROFILE), "--chat-rate", "3",
        "--itl-slo-ms", "50", "--ttft-slo-ms", "1000", "--sim-minutes", "0.5",
        "--window-s", "10", "--json", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    plan = json.loads(out.read_text())
    assert plan["engine_config"] == PROFILE.stem and plan["chat"] == {"rate": 3.0}
    assert plan["replicas"] == 1 and plan["budget"] == 272  # the profile's budget holds at 3/s
    assert plan["document"]["limited_by"] == "max-model-len"
    assert plan["document"]["largest_doc_tokens"] == 131_072 - 200 - 192
    assert plan["batch"]["docs_per_night"] > 0 and plan["batch"]["preemptions"] == 0
    assert "documents of 80,000 tokens per 8 h night" in result.stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--engine-config", str(PROFILE)], "--chat-rate R"),
        (
            ["--engine-config", str(PROFILE), "--chat-rate", "2", "--chat-trace", "t.csv"],
            "not both",
        ),
        (["--chat-rate", "2"], "--fleet needs --engine-config"),
        (["--engine-config", str(PROFILE), "--chat-rate", "0"], "must be above 0"),
        (["--engine-config", str(CONFIGS / "cpu-tiny.yaml"), "--chat-rate", "1"], "calibrate"),
        (["--engine-config", str(PROFILE), "--chat-trace", "/nonexistent.csv"], "no such trace"),
        (
            ["--engine-config", str(PROFILE), "--chat-rate", "1", "--max-replicas", "0"],
            "max replicas",
        ),
    ],
)
def test_bad_fleet_input_exits_2_naming_the_fix(args, words):
    result = _run("--fleet", *args)
    assert result.exit_code == 2, result.output
    assert words in result.stderr


def test_plan_without_fleet_still_needs_a_model_and_a_gpu():
    result = _run("--gpu", "h100-sxm")
    assert result.exit_code == 2 and "--model and --gpu" in result.stderr


def test_steps_are_priced_by_the_configs_fit_else_a_gpu_roofline(tmp_path):
    long = load_engine_config(CONFIGS / "cpu-long.yaml")
    fit = step_model_path(long, CONFIGS / "cpu-long.yaml", None)
    assert fit == CONFIGS / "fits" / "cpu-long.json"
    profile = load_engine_config(PROFILE)
    assert step_model_path(profile, PROFILE, None) == PROFILE.parent / profile.latency_fit
    unfitted = profile.model_copy(update={"latency_fit": None})
    assert step_model_path(unfitted, tmp_path / "gpu.yaml", None) is None  # the roofline prior
