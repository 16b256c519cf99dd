"""The launcher's warning for a CPU replica in bfloat16 on a host without native bf16."""

from pathlib import Path

from serving.cpu_features import bf16_warning, cpu_flags, float32_twin, lacks_native_bf16
from serving.engine_config import load_engine_config

ROOT = Path(__file__).resolve().parents[2]
CPU_SMALL = load_engine_config(ROOT / "engine_configs" / "cpu-small.yaml")
GPU_70B = load_engine_config(ROOT / "engine_configs" / "h100x2-llama-3.1-70b-fp8.yaml")
AVX2 = frozenset({"fpu", "sse2", "avx", "avx2", "fma", "f16c"})


def test_cpuinfo_flags_are_read_from_the_first_cpu(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nflags\t\t: fpu avx2 amx_bf16\n\nprocessor\t: 1\nflags\t: fpu\n"
    )
    assert cpu_flags(info) == {"fpu", "avx2", "amx_bf16"}
    assert cpu_flags(tmp_path / "missing") is None
    (tmp_path / "noflags").write_text("processor\t: 0\n")
    assert cpu_flags(tmp_path / "noflags") is None


def test_bf16_on_a_cpu_without_native_bf16_warns_and_names_the_fix() -> None:
    message = bf16_warning(CPU_SMALL, AVX2)
    assert message is not None
    assert "cpu-small" in message and "dtype: float32" in message and "calibrate" in message


def test_no_warning_where_bf16_is_native_unknown_or_not_used() -> None:
    assert bf16_warning(CPU_SMALL, AVX2 | {"avx512_bf16"}) is None
    assert bf16_warning(CPU_SMALL, AVX2 | {"amx_bf16"}) is None
    assert bf16_warning(CPU_SMALL, None) is None  # flags unreadable: say nothing rather than guess
    fp32 = CPU_SMALL.model_copy(update={"vllm": {**CPU_SMALL.vllm, "dtype": "float32"}})
    assert bf16_warning(fp32, AVX2) is None
    assert bf16_warning(GPU_70B, AVX2) is None  # a GPU replica's dtype is the GPU's business


def test_only_known_flags_without_native_bf16_count_as_lacking_it() -> None:
    assert lacks_native_bf16(AVX2)
    assert not lacks_native_bf16(AVX2 | {"amx_bf16"})
    assert not lacks_native_bf16(None)


def test_the_float32_twin_runs_the_same_model_with_the_same_engine_budget() -> None:
    twin = load_engine_config(ROOT / "engine_configs" / "cpu-small-fp32.yaml")
    assert bf16_warning(twin, AVX2) is None
    same = {"max-num-batched-tokens", "max-num-seqs", "long-prefill-token-threshold"}
    assert {k: twin.vllm[k] for k in same} == {k: CPU_SMALL.vllm[k] for k in same}
    assert twin.model == CPU_SMALL.model and twin.env == CPU_SMALL.env
    assert (ROOT / "engine_configs" / "fits" / "cpu-small-fp32.json").is_file()


def test_a_bf16_config_runs_its_float32_twin_only_where_bf16_is_not_native(tmp_path: Path) -> None:
    small = ROOT / "engine_configs" / "cpu-small.yaml"
    assert float32_twin(small, AVX2) == small.with_name("cpu-small-fp32.yaml")
    assert float32_twin(small, AVX2 | {"avx512_bf16"}) == small
    assert float32_twin(small, None) == small
    alone = tmp_path / "mine.yaml"  # no mine-fp32.yaml beside it: the config as given
    alone.write_text(small.read_text())
    assert float32_twin(alone, AVX2) == alone


def test_nightshift_cpuinfo_rehearses_another_hosts_flags(tmp_path: Path, monkeypatch) -> None:
    info = tmp_path / "avx2-host"
    info.write_text("processor\t: 0\nflags\t\t: " + " ".join(sorted(AVX2)) + "\n")
    monkeypatch.setenv("NIGHTSHIFT_CPUINFO", str(info))
    assert cpu_flags() == AVX2 and lacks_native_bf16(cpu_flags())
