import subprocess
import sys
from pathlib import Path

import pytest

from serving.engine_config import EngineConfig
from serving.vllm_config_import import ImportConfigError, import_vllm_config

TEAM = {
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "host": "0.0.0.0",
    "port": 8000,
    "served_model_name": ["llama-8b", "llama"],
    "--tensor-parallel-size": 2,
    "max_model_len": 32768,
    "api-key": "sekrit",
}


def test_flags_come_over_in_dash_form_with_the_plugin() -> None:
    imported = import_vllm_config(TEAM, "team", gpu_type="h100-sxm")
    config = EngineConfig.model_validate(imported.config)
    assert config.model.path == "meta-llama/Llama-3.1-8B-Instruct"
    assert config.model.served_name == "llama-8b"
    assert config.hardware.count == 2 and config.hardware.gpu_type == "h100-sxm"
    assert config.vllm["max-model-len"] == 32768
    assert config.vllm["scheduler-cls"].endswith("AsyncBudgetScheduler")
    assert config.vllm["scheduling-policy"] == "priority"


def test_launcher_flags_and_the_key_are_dropped_with_a_note() -> None:
    imported = import_vllm_config(TEAM, "team")
    assert not {"host", "port", "api-key"} & set(imported.config["vllm"])
    assert "sekrit" not in repr(imported.config)
    noted = " ".join(imported.notes)
    assert "host" in noted and "port" in noted and "VLLM_API_KEY" in noted


def test_a_scheduler_of_their_own_is_kept_and_said() -> None:
    raw = {"model": "m", "scheduler_cls": "their.Scheduler"}
    imported = import_vllm_config(raw, "x", kind="cpu")
    assert imported.config["vllm"]["scheduler-cls"] == "their.Scheduler"
    assert any("not steered" in n for n in imported.notes)
    assert (
        "scheduler-cls" not in import_vllm_config({"model": "m"}, "x", plugin=False).config["vllm"]
    )


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"max-model-len": 4096}, "no `model` key"),
        (["model"], "mapping"),
        ({"model": "m", "tensor-parallel-size": "two"}, "tensor-parallel-size"),
    ],
)
def test_unusable_files_say_what_to_change(raw, message) -> None:
    with pytest.raises(ImportConfigError, match=message):
        import_vllm_config(raw, "x")


def test_command_writes_a_loadable_config_and_dry_run_writes_nothing(tmp_path: Path) -> None:
    from serving.engine_config import load_engine_config

    src = tmp_path / "team.yaml"
    src.write_text("model: m\nserved-model-name: mm\nmax-num-seqs: 64\n")
    out = tmp_path / "configs" / "team.yaml"

    def cli(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "flows.cli", "engine", "import-config", str(src), *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    dry = cli("--out", str(out), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "--max-num-seqs 64" in dry.stdout and "--served-model-name mm" in dry.stdout
    assert not out.exists()
    assert cli("--out", str(out)).returncode == 0
    assert load_engine_config(out).vllm["max-num-seqs"] == 64
    again = cli("--out", str(out))
    assert again.returncode == 2 and "--force" in again.stderr
