"""Capacity planner and `nightshift plan`: the seed card's worked example, errors, engine config."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from flows.cli_plan import register
from scheduler.latency_model import largest_chunk_within, roofline_model
from scheduler.planner import (
    BLOCK_TOKENS,
    Efficiency,
    PlanError,
    kv_bytes_per_token,
    kv_capacity_tokens,
    max_concurrent_seqs,
    plan,
    weights_bytes,
)
from scheduler.specs import model_spec
from scheduler.step import PrefillChunk, StepBatch
from serving.engine_config import load_engine_config
from serving.plan_config import engine_config_for

CARD = dict(model="llama-3.1-70b", gpu="h100-sxm", gpus=2, weight_dtype="fp8", kv_dtype="fp8")
KIB, GB = 1024, 1e9


def within_10pct(value: float, card: float) -> bool:
    return abs(value - card) <= 0.10 * card


def test_seed_card_worked_example():
    """Llama-3.1-70B FP8 on 2×H100 (160 GB), every figure of the card within 10%."""
    p = plan(**CARD, context=4096)
    assert p.memory_bytes == 160 * GB
    assert within_10pct(p.weights_bytes, 70 * GB)
    assert within_10pct(p.usable_kv_bytes, 80 * GB)
    assert p.kv_bytes_per_token == 160 * KIB
    assert within_10pct(p.kv_capacity_tokens, 500_000)
    assert within_10pct(p.max_concurrent_seqs, 125)

    shared = plan(**CARD, context=8192, shared_prefix=6144)
    assert within_10pct(shared.max_concurrent_seqs, 250)

    at_125 = plan(**CARD, context=4096, batch=125)
    assert at_125.decode_batch == 125
    assert within_10pct(at_125.decode_bytes_per_step, 150 * GB)
    assert within_10pct(at_125.decode_step_ms_bound, 22)
    assert within_10pct(at_125.decode_tokens_per_s_bound, 5600)
    # without --batch the decode figures are for the sequences the KV holds, still the card's
    assert within_10pct(p.decode_step_ms_bound, 22)
    assert within_10pct(p.decode_tokens_per_s_bound, 5600)


def test_kv_and_weights_arithmetic():
    spec = model_spec("llama-3.1-70b")
    assert kv_bytes_per_token(spec, "bf16") == 320 * KIB
    assert kv_bytes_per_token(spec, "fp8") == 160 * KIB
    assert weights_bytes(spec, "bf16") == 2 * spec.params
    tiny = model_spec("nightshift-tiny")  # one KV head: tensor parallel 2 replicates it
    assert kv_bytes_per_token(tiny, "bf16", gpus=2) == 2 * kv_bytes_per_token(tiny, "bf16")


def test_kv_capacity_in_whole_blocks_and_with_engine_utilization():
    planner_view = kv_capacity_tokens(**CARD)
    assert planner_view % BLOCK_TOKENS == 0
    engine_view = kv_capacity_tokens(**CARD, gpu_memory_utilization=0.93)
    # 0.93 × 160 GB leaves 11.2 GB outside the engine, close to the planner's 10 GB reserve
    assert engine_view == pytest.approx(planner_view, rel=0.03)
    assert kv_capacity_tokens(**CARD, gpu_memory_utilization=0.93, reserve_gb=8) < engine_view


def test_shared_prefix_is_stored_once():
    assert max_concurrent_seqs(100_000, 4096) == 24
    assert max_concurrent_seqs(100_000, 8192, shared_prefix=6144) == (100_000 - 6144) // 2048
    # a prefix that ends mid-block shares only its whole blocks
    assert max_concurrent_seqs(100_000, 8192, shared_prefix=6150) == (100_000 - 6144) // 2048


def test_weights_that_do_not_fit_give_the_numbers():
    with pytest.raises(PlanError) as err:
        plan("llama-3.1-405b", "h100-sxm", gpus=4, weight_dtype="bf16")
    message = str(err.value)
    assert "811.7 GB" in message and "320.0 GB" in message and "fp8" in message


def test_context_larger_than_the_kv_pool_is_an_error():
    with pytest.raises(PlanError, match="less than one sequence"):
        plan("llama-3.1-70b", "a100-80gb", weight_dtype="fp8", context=32768)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        ({"gpus": 3}, "must divide"),
        ({"context": 200_000}, "--context"),
        ({"shared_prefix": 4096}, "--shared-prefix"),
        ({"itl_slo_ms": 0}, "--itl-slo-ms"),
        ({"batch": 0}, "--batch"),
        ({"doc_tokens": 10**6}, "--doc-tokens"),
    ],
)
def test_impossible_inputs_name_the_option(overrides, fragment):
    with pytest.raises(PlanError, match=fragment):
        plan(**{**CARD, **overrides})


def test_recommended_chunks_fit_the_slo_and_shrink_with_position():
    p = plan(**CARD, itl_slo_ms=50)
    positions = [c.prefix_tokens for c in p.recommended_chunk_tokens]
    assert positions == [0, 8192, 16384, 32768, 65536, 79872]
    chunks = [c.chunk_tokens for c in p.recommended_chunk_tokens]
    assert chunks == sorted(chunks, reverse=True) and chunks[-1] > 0
    assert chunks[0] >= 3 * chunks[-1]  # docs/design.md §1: safe at 0 is 3-5x too slow at 78k
    est = roofline_model(**CARD, flops_efficiency=0.5, bandwidth_efficiency=0.7, overhead_s=0.002)
    load = (p.decode_batch, p.decode_batch * p.context)
    for advice in p.recommended_chunk_tokens:
        fits = StepBatch((PrefillChunk(advice.chunk_tokens, advice.prefix_tokens),), *load)
        over = StepBatch((PrefillChunk(advice.chunk_tokens + 16, advice.prefix_tokens),), *load)
        assert est.step_seconds(fits) <= 0.05 < est.step_seconds(over)
    assert chunks[0] == largest_chunk_within(est, 0.05, 0, *load, max_chunk=131072)


def test_est_twins_are_slower_than_bounds_and_prefill_is_reported():
    p = plan(**CARD, prompt_tokens=80_000)
    assert p.decode_step_ms_est > p.decode_step_ms_bound
    assert p.decode_tokens_per_s_est < p.decode_tokens_per_s_bound
    assert p.prompt_tokens == 80_000 and p.prefill_s_est > p.prefill_s > 1.0


def test_slo_below_the_decode_step_warns_and_gives_no_chunk():
    p = plan(**CARD, itl_slo_ms=20)
    assert all(c.chunk_tokens == 0 for c in p.recommended_chunk_tokens)
    assert any("above the 20 ms ITL SLO" in w for w in p.warnings)
    with pytest.raises(PlanError, match="no prefill chunk fits"):
        engine_config_for(p)


def test_to_dict_has_the_issue_keys():
    d = plan(**CARD).to_dict()
    for key in (
        "kv_bytes_per_token",
        "weights_bytes",
        "usable_kv_bytes",
        "kv_capacity_tokens",
        "max_concurrent_seqs",
        "decode_step_ms_bound",
        "decode_tokens_per_s_bound",
        "decode_step_ms_est",
        "decode_tokens_per_s_est",
        "prefill_s",
        "recommended_chunk_tokens",
    ):
        assert key in d
    assert set(d["recommended_chunk_tokens"][0]) == {"prefix_tokens", "chunk_tokens"}
    json.dumps(d)


def test_local_model_plans_on_a_small_gpu():
    p = plan("nightshift-small", "l40s", context=2048, efficiency=Efficiency(overhead_s=0.01))
    assert [c.prefix_tokens for c in p.recommended_chunk_tokens] == [0, 8192, 16384]
    assert p.max_model_len == 32768


# ---------------------------------------------------------------------------------------------
# the command


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """Test app: a callback keeps `plan` a subcommand."""

    register(app)
    return app


def _run(*args: str):
    return CliRunner().invoke(_app(), ["plan", *args])


CARD_ARGS = ["--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--gpus", "2"]
CARD_ARGS += ["--weight-dtype", "fp8", "--kv-dtype", "fp8"]


def test_cli_json_reproduces_the_card():
    result = _run(*CARD_ARGS, "--batch", "125", "--json", "-")
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert d["kv_bytes_per_token"] == 160 * KIB
    assert within_10pct(d["decode_tokens_per_s_bound"], 5600)


def test_cli_json_to_a_file_and_the_h100_alias(tmp_path):
    path = tmp_path / "plan.json"
    args = ["--model", "llama-3.1-70b", "--gpu", "h100", "--gpus", "2"]
    result = _run(*args, "--weight-dtype", "fp8", "--kv-dtype", "fp8", "--json", str(path))
    assert result.exit_code == 0, result.output
    assert json.loads(path.read_text())["gpu"] == "h100-sxm"
    assert "KV capacity" in result.stdout


def test_cli_table():
    result = _run(*CARD_ARGS)
    assert result.exit_code == 0, result.output
    assert "KV capacity" in result.stdout and "484,896 tokens" in result.stdout


def test_cli_unknown_model_exits_2_listing_known_ones():
    result = _run("--model", "gpt-5", "--gpu", "h100-sxm")
    assert result.exit_code == 2
    assert "unknown model 'gpt-5'" in result.stderr and "llama-3.1-70b" in result.stderr


def test_cli_unknown_gpu_and_dtype_exit_2():
    result = _run("--model", "llama-3.1-8b", "--gpu", "tpu")
    assert result.exit_code == 2 and "h100-sxm" in result.stderr
    result = _run("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--kv-dtype", "fp4")
    assert result.exit_code == 2 and "known dtypes" in result.stderr


def test_cli_weights_that_do_not_fit_exit_2_with_numbers():
    result = _run("--model", "llama-3.1-405b", "--gpu", "a100-80gb", "--gpus", "2")
    assert result.exit_code == 2
    assert "811.7 GB" in result.stderr and "160.0 GB" in result.stderr


def test_cli_engine_config_loads_back(tmp_path):
    path = tmp_path / "configs" / "llama70b.yaml"
    result = _run(*CARD_ARGS, "--emit-engine-config", str(path), "--json", "-")
    assert result.exit_code == 0, result.output
    p = json.loads(result.stdout)
    config = load_engine_config(path)
    assert config.model.path == "meta-llama/Llama-3.1-70B-Instruct"
    assert config.model.spec == "llama-3.1-70b"
    assert config.model.architecture.kv_heads == 8
    assert config.hardware.kind == "gpu" and config.hardware.count == 2
    assert config.hardware.hourly_usd == pytest.approx(2 * 2.99)
    chunks = [c["chunk_tokens"] for c in p["recommended_chunk_tokens"]]
    flags = config.vllm
    assert flags["tensor-parallel-size"] == 2
    assert flags["max-num-seqs"] == p["max_concurrent_seqs"]
    assert flags["max-num-batched-tokens"] >= chunks[0] + p["max_concurrent_seqs"]
    assert flags["max-num-batched-tokens"] % 16 == 0
    # chat's prompts fill a step; batch chunks are sized by the plug-in, not by a flag
    assert flags["long-prefill-token-threshold"] == flags["max-num-batched-tokens"]
    assert flags["scheduler-cls"] == "serving.engine_site.budget_scheduler.AsyncBudgetScheduler"
    assert flags["enable-chunked-prefill"] is True and flags["enable-prefix-caching"] is True
    assert flags["scheduling-policy"] == "priority"
    assert flags["kv-cache-dtype"] == "fp8" and flags["quantization"] == "fp8"
    assert flags["max-model-len"] == p["max_model_len"]
    assert 0.9 <= flags["gpu-memory-utilization"] <= 0.95


def test_cli_engine_config_for_bf16_uses_the_model_dtype(tmp_path):
    path = tmp_path / "small.yaml"
    args = ["--model", "nightshift-small", "--gpu", "l40s", "--batch", "64"]
    result = _run(*args, "--emit-engine-config", str(path))
    assert result.exit_code == 0, result.output
    config = load_engine_config(path)
    assert config.model.path == "local:small"
    assert config.vllm["kv-cache-dtype"] == "auto" and "quantization" not in config.vllm
