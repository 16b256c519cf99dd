"""The `long` local model and its replicas: shape, configs, and the 70B proportions it stands in for."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench import step_ratio
from scheduler.latency_model import roofline_model
from scheduler.planner import CHUNK_POSITIONS, kv_bytes_per_token
from scheduler.specs import ModelSpec, count_params, model_spec
from serving import local_models
from serving.cpu_features import bf16_warning
from serving.engine_config import load_engine_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "engine_configs"
LONG = load_engine_config(CONFIGS / "cpu-long.yaml")
LONG_FP32 = load_engine_config(CONFIGS / "cpu-long-fp32.yaml")
SMALL = load_engine_config(CONFIGS / "cpu-small.yaml")
GPU_70B = load_engine_config(CONFIGS / "h100x2-llama-3.1-70b-fp8.yaml")
DOC_TOKENS = 82_000
"""An ~80k-token document with its instructions and summary."""
BAND = 0.30
DEEP = CHUNK_POSITIONS[-1]  # the planner's deepest chunk position, 78k


def attention_over_linear(spec: ModelSpec, prefix: int) -> float:
    """Prefill attention time over linear time per token at `prefix`, from the roofline with
    attention and matmuls at one rate (bf16): 4·L·n_q·d_head·p against 2 FLOPs per weight. The
    embedding is a lookup and the lm_head runs on a prompt's last token only, so neither counts."""
    layers_only = spec.model_copy(update={"params": spec.params - 2 * spec.vocab * spec.hidden})
    model = roofline_model(layers_only, "h100-sxm", weight_dtype="bf16", kv_dtype="bf16")
    return model.s_per_attention_unit * prefix / model.s_per_token


def test_the_recipe_builds_by_name_and_reaches_96k():
    r = local_models.recipe("long").shape
    assert r.max_position >= 98304
    assert r.heads % r.kv_heads == 0
    assert r.head_dim >= 32  # the CPU attention kernel's smallest head size
    assert "long" in local_models.RECIPES  # `nightshift model build long` takes RECIPES' names


BUILT_HASHES = {"tiny": "f3d3c94b139a", "small": "bf78888263d9", "long": "74dd75b174ca"}
"""The cache folders `make models` has built. A new hash rebuilds that model everywhere: change one
here only with a change that means to rebuild (a new shape, builder version or tokenizer text)."""


def test_the_built_models_keep_their_cache_folders():
    assert {name: local_models.recipe_hash(name) for name in local_models.RECIPES} == BUILT_HASHES
    # The inputs are the flat fields the recipe had before it took its shape from the spec table;
    # `padded_vocab` is left out where unset, as it was before the field existed.
    assert local_models.hash_fields(local_models.recipe("tiny")) == {
        "layers": 2,
        "hidden": 64,
        "intermediate": 256,
        "heads": 2,
        "kv_heads": 1,
        "head_dim": 32,
        "vocab_target": 1024,
        "max_position": 4096,
        "seed": 0,
        "dtype": "bfloat16",
    }
    assert local_models.hash_fields(local_models.recipe("long"))["padded_vocab"] == 49152


@pytest.mark.parametrize("name", sorted(local_models.RECIPES))
def test_each_recipe_takes_its_shape_from_its_own_spec_entry(name):
    r = local_models.recipe(name)
    assert r.shape.path == f"local:{name}"
    assert r.shape.params == count_params(r.shape)
    # The spec's vocab is the built tokenizer's size: what the text teaches, or the padded size.
    if r.padded_vocab:
        assert r.shape.vocab == r.padded_vocab
    else:
        assert r.shape.vocab <= r.vocab_target
    configs = [load_engine_config(p) for p in sorted(CONFIGS.glob("cpu-*.yaml"))]
    assert {c.model.spec for c in configs if c.model.local_name == name} == {r.spec}


@pytest.mark.parametrize("config", [LONG, LONG_FP32], ids=lambda c: c.name)
def test_the_configs_take_96k_prompts_on_one_thread_with_cpu_smalls_scheduling(config):
    assert config.model.path == "local:long"
    assert int(config.flag("max-model-len")) >= 98304
    assert config.env["OMP_NUM_THREADS"] == "1"
    same = (
        "max-num-batched-tokens",
        "long-prefill-token-threshold",
        "enable-chunked-prefill",
        "enable-prefix-caching",
        "scheduling-policy",
    )
    assert {k: config.flag(k) for k in same} == {k: SMALL.flag(k) for k in same}


@pytest.mark.parametrize(
    ("config", "value_bytes"), [(LONG, 2), (LONG_FP32, 4)], ids=["bf16", "fp32"]
)
def test_the_kv_space_holds_two_documents_and_a_full_chat_load(config, value_bytes):
    per_token = kv_bytes_per_token(model_spec(config.model.spec), "bf16") * value_bytes / 2
    tokens = int(config.env["VLLM_CPU_KVCACHE_SPACE"]) * 2**30 / per_token
    chat = config.sequence_slots * 4096
    assert tokens >= 2 * DOC_TOKENS + chat


def test_the_two_configs_differ_only_in_dtype():
    assert LONG.vllm["dtype"] == "bfloat16" and LONG_FP32.vllm["dtype"] == "float32"
    assert (LONG.name, LONG_FP32.name) == ("cpu-long", "cpu-long-fp32")
    strip = {"name": True, "latency_fit": True, "vllm": {"dtype"}}  # each is fitted on its own
    assert LONG.model_dump(exclude=strip) == LONG_FP32.model_dump(exclude=strip)
    avx2 = frozenset({"avx", "avx2", "fma"})
    assert bf16_warning(LONG, avx2) is not None and bf16_warning(LONG_FP32, avx2) is None


def test_attention_weighs_against_linear_work_as_in_70b():
    """Deep into a document a chunk's cost is set by attention over linear work; the stand-in's
    proportion at 78k is within 30% of Llama-3.1-70B's (~1.5), where cpu-small's is ~50x."""
    target = attention_over_linear(model_spec(GPU_70B.model.spec), DEEP)
    assert 1.2 < target < 1.8
    long = attention_over_linear(model_spec(LONG.model.spec), DEEP)
    assert abs(long / target - 1) <= BAND
    assert attention_over_linear(model_spec(SMALL.model.spec), DEEP) > 10 * target


def test_the_bench_predicts_the_70b_figures_the_stand_in_is_measured_against():
    args = argparse.Namespace(
        predict=str(CONFIGS / "h100x2-llama-3.1-70b-fp8.yaml"),
        chat_streams=4,
        chat_context=1000,
        step_tokens=512,
        prompt_tokens=81920,
        window=2048,
        deep_prefix=DEEP,
        alone=True,
    )
    f = step_ratio.predict(args)
    assert 1 <= f.shallow_s / f.decode_s <= 3
    assert 3 < f.deep_s / f.shallow_s < 5
    assert f.deep_prefix == pytest.approx(DEEP, abs=2048)
    assert 0 < f.alone_s < 60


def test_the_bench_counts_a_prefill_back_from_its_first_token():
    prefixes = step_ratio.chunk_prefixes(81920, 508)
    assert len(prefixes) == 162 and prefixes[-1] == 161 * 508
    deep = step_ratio.deep_steps(prefixes, 2048, DEEP)
    assert all(DEEP - 2048 < prefixes[i] <= DEEP for i in deep) and len(deep) == 4
    assert step_ratio.deep_steps(prefixes, 2048, None)[-1] == len(prefixes) - 1
    prompt = step_ratio.long_prompt(100, 7)
    assert len(prompt) == 100 and prompt == step_ratio.long_prompt(100, 7)
    assert all(step_ratio.FIRST_ID <= t < step_ratio.ID_LIMIT for t in prompt)
