"""Engine flags checked by the real vLLM parser in `.venv-engine`, and `engine up` refusing bad ones
before it starts anything. Only flags are parsed here: no replica is started."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from serving.engine_config import load_engine_config
from serving.vllm_flags_check import run_checker_many, verdict_error
from tests.replicas import REPO, TINY, free_port_block

CONFIGS = sorted((REPO / "engine_configs").glob("*.yaml"))
NIGHTSHIFT = [sys.executable, "-m", "flows.cli"]

pytestmark = pytest.mark.skipif(
    not (REPO / ".venv-engine" / "bin" / "python").exists()
    and not os.environ.get("NIGHTSHIFT_ENGINE_PYTHON"),
    reason="needs the engine venv (make engine-venv)",
)


def variant(tmp_path: Path, name: str, **flags) -> Path:
    """A copy of cpu-tiny with `flags` set in its `vllm:` block."""
    doc = yaml.safe_load(TINY.read_text())
    doc["vllm"].update(flags)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def engine_up(*args: str, state_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*NIGHTSHIFT, "engine", "up", *args, "--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        timeout=300,
    )


TYPO = {"max-num-seqz": 16}
LOTS = {"max-model-len": "lots"}
UNIMPORTABLE = {"scheduler-cls": "no_such_package.NoSuchScheduler", "max-num-seqs": 4}


@pytest.fixture(scope="module")
def verdicts() -> dict[str, dict]:
    """vLLM's verdict on every shipped config and on each bad variant, from one run of the
    checker (its cost is importing vLLM, ~10 s here, whatever the number of configs)."""
    tiny = load_engine_config(TINY).vllm
    cases = {p.name: load_engine_config(p).vllm for p in CONFIGS}
    cases |= {"typo": {**tiny, **TYPO}, "lots": {**tiny, **LOTS}, "unimportable": UNIMPORTABLE}
    t0 = time.monotonic()
    answers = run_checker_many(list(cases.values()))
    assert time.monotonic() - t0 < 60  # a few seconds; the margin is for a loaded 2-core host
    return dict(zip(cases, answers, strict=True))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_passes_vllms_parser(verdicts, path: Path) -> None:
    verdict = verdicts[path.name]
    assert verdict["ok"], verdict["problems"]
    assert "max-num-seqs" in verdict["flags"] and "scheduler-cls" in verdict["flags"]


def test_unknown_flag_is_named_with_the_closest_valid_one(verdicts) -> None:
    flags = {**load_engine_config(TINY).vllm, **TYPO}
    assert verdict_error(verdicts["typo"], "typo.yaml", flags) == (
        "typo.yaml: vllm.max-num-seqz is not a vLLM flag (did you mean max-num-seqs?)"
    )


def test_rejected_value_is_named_with_vllms_reason(verdicts) -> None:
    flags = {**load_engine_config(TINY).vllm, **LOTS}
    message = verdict_error(verdicts["lots"], "lots.yaml", flags)
    assert message.startswith("lots.yaml: vllm.max-model-len: vLLM rejects 'lots' (")
    assert "argument --max-model-len" in message and "'lots'" in message
    assert "\n" not in message  # only the bad key is reported


def test_scheduler_class_is_parsed_not_imported(verdicts) -> None:
    assert verdicts["unimportable"]["ok"], verdicts["unimportable"]["problems"]


@pytest.mark.parametrize(
    ("flags", "expected", "dry_run"),
    [
        (TYPO, "vllm.max-num-seqz is not a vLLM flag (did you mean max-num-seqs?)", True),
        (LOTS, "vllm.max-model-len: vLLM rejects 'lots'", False),
    ],
    ids=["dry-run-unknown-flag", "start-bad-value"],
)
def test_engine_up_refuses_before_starting_anything(
    tmp_path: Path, flags: dict, expected: str, dry_run: bool
) -> None:
    path = variant(tmp_path, "bad.yaml", **flags)
    state = tmp_path / "engines"
    port = str(free_port_block(1))
    up = engine_up(str(path), "--port", port, *(["--dry-run"] if dry_run else []), state_dir=state)
    assert up.returncode == 2, up.stdout + up.stderr
    assert f"{path}: {expected}" in up.stderr
    assert "vllm.entrypoints" not in up.stdout  # no command line printed
    assert not state.exists()  # no log, no replica recorded: nothing was spawned
