from pathlib import Path

import pytest
import yaml

from serving.engine_config import EngineConfigError, load_engine_config, render_flags

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "engine_configs").glob("*.yaml"))


def write(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def minimal() -> dict:
    return {"name": "x", "model": {"path": "local:tiny", "served_name": "t"}}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_validates(path: Path) -> None:
    config = load_engine_config(path)
    assert config.name == path.stem


def test_unknown_key_names_file_and_key(tmp_path: Path) -> None:
    doc = minimal() | {"hardwear": {"kind": "cpu"}}
    with pytest.raises(EngineConfigError) as err:
        load_engine_config(write(tmp_path, doc))
    assert "cfg.yaml" in str(err.value) and "hardwear" in str(err.value)
    assert "unknown key" in str(err.value)


def test_nested_unknown_key(tmp_path: Path) -> None:
    doc = minimal()
    doc["model"]["sevred_name"] = "oops"
    with pytest.raises(EngineConfigError, match=r"model\.sevred_name: unknown key"):
        load_engine_config(write(tmp_path, doc))


def test_wrong_type_names_key(tmp_path: Path) -> None:
    doc = minimal() | {"hardware": {"count": "two"}}
    with pytest.raises(EngineConfigError, match=r"hardware\.count"):
        load_engine_config(write(tmp_path, doc))


def test_missing_model_path(tmp_path: Path) -> None:
    doc = minimal()
    del doc["model"]["path"]
    with pytest.raises(EngineConfigError, match=r"model\.path: required key is missing"):
        load_engine_config(write(tmp_path, doc))


def test_underscore_flag_is_rejected_with_the_dash_form(tmp_path: Path) -> None:
    doc = minimal() | {"vllm": {"max_num_seqs": 4}}
    with pytest.raises(EngineConfigError, match="max-num-seqs"):
        load_engine_config(write(tmp_path, doc))


def test_launcher_owned_flag_is_rejected(tmp_path: Path) -> None:
    doc = minimal() | {"vllm": {"port": 9}}
    with pytest.raises(EngineConfigError, match="--port"):
        load_engine_config(write(tmp_path, doc))


def test_missing_file() -> None:
    with pytest.raises(EngineConfigError, match="no such engine config"):
        load_engine_config("engine_configs/nope.yaml")


def test_booleans_render_explicitly_both_ways() -> None:
    argv = render_flags({"enable-prefix-caching": True, "enable-chunked-prefill": False})
    assert argv == ["--enable-prefix-caching", "--no-enable-chunked-prefill"]


def test_values_lists_and_mappings_render() -> None:
    argv = render_flags(
        {
            "max-num-seqs": 8,
            "dtype": "bfloat16",
            "x": [1, 2],
            "custom-histogram-buckets": {"inter_token_latency": [0.01, 0.1]},
        }
    )
    assert argv == [
        "--max-num-seqs",
        "8",
        "--dtype",
        "bfloat16",
        "--x",
        "1",
        "2",
        "--custom-histogram-buckets",
        '{"inter_token_latency":[0.01,0.1]}',
    ]


def test_env_values_become_strings(tmp_path: Path) -> None:
    doc = minimal() | {"env": {"OMP_NUM_THREADS": 2}}
    assert load_engine_config(write(tmp_path, doc)).env == {"OMP_NUM_THREADS": "2"}


def test_controller_tuning_is_validated_with_its_key_named(tmp_path: Path) -> None:
    config = load_engine_config(write(tmp_path, minimal() | {"controller": {"cut_factor": 0.5}}))
    assert config.controller is not None and config.controller.cut_factor == 0.5
    with pytest.raises(EngineConfigError, match=r"controller\.cut_facter: unknown key"):
        load_engine_config(write(tmp_path, minimal() | {"controller": {"cut_facter": 0.5}}))
    with pytest.raises(EngineConfigError, match=r"controller\.cut_factor"):
        load_engine_config(write(tmp_path, minimal() | {"controller": {"cut_factor": 2}}))


def test_sequence_slots_read_max_num_seqs_or_stand_in(tmp_path: Path) -> None:
    doc = minimal() | {"vllm": {"max-num-seqs": 32}}
    assert load_engine_config(write(tmp_path, doc)).sequence_slots == 32
    assert load_engine_config(write(tmp_path, minimal())).sequence_slots == 256


def test_configs_name_latency_fits_that_exist() -> None:
    from serving.replica_targets import configured_fit

    named = 0
    for path in CONFIGS:
        config = load_engine_config(path)
        if config.latency_fit is not None:
            named += 1
            assert configured_fit(path, config).is_file(), path
    assert named >= 4  # cpu-small, cpu-small-fp32, cpu-long and the production profile


def test_a_named_fit_that_is_missing_says_how_to_make_it(tmp_path: Path) -> None:
    from serving.replica_targets import ReplicaLookupError, configured_fit, fit_path

    path = tmp_path / "x.yaml"
    path.write_text("name: x\nlatency_fit: measured/x.json\nmodel: {path: m, served_name: m}\n")
    config = load_engine_config(path)
    assert fit_path(path, config) == tmp_path / "measured" / "x.json"
    with pytest.raises(ReplicaLookupError, match="nightshift calibrate"):
        configured_fit(path, config)
    path.write_text("name: x\nmodel: {path: m, served_name: m}\n")
    assert configured_fit(path, load_engine_config(path)) is None  # never calibrated
