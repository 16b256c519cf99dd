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
from serving.vllm_flags_check import VllmFlagError, check_vllm_flags, run_checker
from tests.integration.conftest import REPO, TINY, free_port_block

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


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_passes_vllms_parser(path: Path) -> None:
    config = load_engine_config(path)
    t0 = time.monotonic()
    verdict = run_checker(config.vllm)
    assert verdict["ok"], verdict["problems"]
    assert time.monotonic() - t0 < 60  # a few seconds; the margin is for a loaded 2-core host
    assert "max-num-seqs" in verdict["flags"] and "scheduler-cls" in verdict["flags"]


def test_unknown_flag_is_named_with_the_closest_valid_one(tmp_path: Path) -> None:
    path = variant(tmp_path, "typo.yaml", **{"max-num-seqz": 16})
    with pytest.raises(VllmFlagError) as err:
        check_vllm_flags(load_engine_config(path), path)
    assert str(err.value) == (
        f"{path}: vllm.max-num-seqz is not a vLLM flag (did you mean max-num-seqs?)"
    )


def test_rejected_value_is_named_with_vllms_reason(tmp_path: Path) -> None:
    path = variant(tmp_path, "lots.yaml", **{"max-model-len": "lots"})
    with pytest.raises(VllmFlagError) as err:
        check_vllm_flags(load_engine_config(path), path)
    message = str(err.value)
    assert message.startswith(f"{path}: vllm.max-model-len: vLLM rejects 'lots' (")
    assert "argument --max-model-len" in message and "'lots'" in message
    assert "\n" not in message  # only the bad key is reported


def test_scheduler_class_is_parsed_not_imported(tmp_path: Path) -> None:
    verdict = run_checker({"scheduler-cls": "no_such_package.NoSuchScheduler", "max-num-seqs": 4})
    assert verdict["ok"], verdict["problems"]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"max-num-seqz": 16}, "vllm.max-num-seqz is not a vLLM flag (did you mean max-num-seqs?)"),
        ({"max-model-len": "lots"}, "vllm.max-model-len: vLLM rejects 'lots'"),
    ],
    ids=["unknown-flag", "bad-value"],
)
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "start"])
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
