"""Spec tables: every entry loads, names resolve, numbers hang together, bad files fail clearly."""

from __future__ import annotations

import pytest

from scheduler.specs import (
    DTYPE_BYTES,
    SpecError,
    count_params,
    dtype_bytes,
    gpu_spec,
    known_gpus,
    known_models,
    load_gpus,
    load_models,
    model_spec,
)

MODELS = ["llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "nightshift-tiny", "nightshift-small"]
GPUS = ["h100-sxm", "h200", "a100-80gb", "l40s", "b200"]


def test_the_agreed_names_are_all_known():
    assert set(MODELS) <= set(known_models())
    assert set(GPUS) <= set(known_gpus())


@pytest.mark.parametrize("name", MODELS)
def test_params_match_the_shape(name):
    spec = model_spec(name)
    assert spec.params == count_params(spec)
    assert spec.heads * spec.head_dim == spec.hidden
    assert spec.source


def test_llama_70b_matches_its_model_card():
    spec = model_spec("llama-3.1-70b")
    assert (spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.head_dim) == (
        80,
        8192,
        64,
        8,
        128,
    )
    assert spec.params == pytest.approx(70.55e9, rel=1e-3)
    assert spec.path == "meta-llama/Llama-3.1-70B-Instruct"


def test_gpu_numbers_are_in_base_units():
    h100 = gpu_spec("h100-sxm")
    assert h100.memory_bytes == 80e9
    assert h100.hbm_bytes_per_s == pytest.approx(3.35e12)
    assert h100.bf16_flops == pytest.approx(989.4e12)
    assert h100.fp8_flops == pytest.approx(2 * h100.bf16_flops, rel=1e-3)
    assert h100.interconnect_bytes_per_s == 900e9


@pytest.mark.parametrize("name", GPUS)
def test_every_gpu_has_a_source_and_a_price(name):
    gpu = gpu_spec(name)
    assert gpu.source
    assert gpu.hourly_usd > 0
    assert gpu.fp8_flops >= gpu.bf16_flops


def test_fp8_weights_use_fp8_tensor_cores_and_int4_the_bf16_rate():
    h100 = gpu_spec("h100-sxm")
    assert h100.matmul_flops("fp8") == h100.fp8_flops
    assert h100.matmul_flops("int4") == h100.bf16_flops


def test_unknown_model_lists_known_ones():
    with pytest.raises(SpecError) as err:
        model_spec("llama-9")
    for name in MODELS:
        assert name in str(err.value)


def test_unknown_gpu_lists_known_ones():
    with pytest.raises(SpecError) as err:
        gpu_spec("h300")
    for name in GPUS:
        assert name in str(err.value)


def test_dtype_bytes():
    dtypes = ("bf16", "fp16", "fp8", "int8", "int4", "fp32")
    assert [dtype_bytes(d) for d in dtypes] == [2, 2, 1, 1, 0.5, 4]
    with pytest.raises(SpecError, match="known dtypes: bf16"):
        dtype_bytes("fp4")
    assert set(DTYPE_BYTES) == set(dtypes)


def test_a_gpu_roofline_refuses_fp32_weights_and_says_to_fit_instead():
    with pytest.raises(SpecError, match="nightshift calibrate"):
        gpu_spec("h100").matmul_flops("fp32")


def test_a_bad_gpu_entry_names_entry_and_field(tmp_path):
    path = tmp_path / "gpus.yaml"
    path.write_text(
        "fast:\n  memory_gb: -1\n  memory_bandwidth_tb_s: 1\n  bf16_dense_tflops: 1\n"
        "  fp8_dense_tflops: 1\n  interconnect_gb_s: 1\n  source: x\n"
    )
    with pytest.raises(SpecError, match=r"entry 'fast': memory_gb"):
        load_gpus(path)


def test_a_model_entry_without_source_or_with_a_typo_fails(tmp_path):
    path = tmp_path / "models.yaml"
    path.write_text(
        "m:\n  path: x\n  layers: 1\n  hidden: 8\n  intermediate: 8\n  heads: 2\n  kv_heads: 1\n"
        "  head_dim: 4\n  params: 10\n  vocab: 4\n  max_positon: 8\n"
    )
    with pytest.raises(SpecError) as err:
        load_models(path)
    message = str(err.value)
    assert "max_positon" in message and "max_position" in message and "source" in message


def test_kv_heads_must_divide_heads(tmp_path):
    path = tmp_path / "models.yaml"
    path.write_text(
        "m:\n  path: x\n  layers: 1\n  hidden: 8\n  intermediate: 8\n  heads: 3\n  kv_heads: 2\n"
        "  head_dim: 4\n  params: 10\n  vocab: 4\n  max_position: 8\n  source: s\n"
    )
    with pytest.raises(SpecError, match="multiple of kv_heads"):
        load_models(path)
