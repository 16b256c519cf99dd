"""An engine config as numbers: its step-time model, its KV pool and its scheduler settings.

What the simulator, the calibration and the benchmarks need to model a replica class without
starting it. It lives in `serving` because it reads engine configs, and stays free of `simulator`
(which may not import `serving`): `engine_params` returns the plain settings mapping that
`simulator.config.EngineParams` validates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from scheduler.latency_model import LatencyModel, roofline_model
from scheduler.planner import BLOCK_TOKENS, Efficiency, kv_bytes_per_token
from scheduler.planner import kv_capacity_tokens as planner_capacity
from scheduler.specs import ModelSpec, model_spec
from scheduler.step import StepTimeModel
from serving.engine_config import EngineConfig, load_engine_config

WEIGHT_DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "auto": "bf16", "float16": "fp16"}
WEIGHT_DTYPES |= {
    "half": "fp16",
    "fp16": "fp16",
    "float32": "fp32",
    "float": "fp32",
    "fp32": "fp32",
}
KV_FP8 = ("fp8", "fp8_e4m3", "fp8_e5m2")
CPU_KV_DEFAULT_GIB = 4.0
"""vLLM-CPU's KV space when VLLM_CPU_KVCACHE_SPACE is unset."""


class ProfileError(ValueError):
    """An engine config that cannot be modelled, or a bad KEY=VALUE; the message says the fix."""


def load_profile(path: Path, overrides: list[str]) -> EngineConfig:
    """The engine config at `path` with `--override KEY=VALUE` flags applied and revalidated."""
    cfg = load_engine_config(path)
    if not overrides:
        return cfg
    flags = dict(cfg.vllm)
    flags.update(parse_assignment(item) for item in overrides)
    try:
        return EngineConfig.model_validate({**cfg.model_dump(), "vllm": flags})
    except ValidationError as exc:
        problems = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
        raise ProfileError(f"--override: {problems}") from None


def parse_assignment(item: str, option: str = "--override") -> tuple[str, Any]:
    """`enable-chunked-prefill=false` → ("enable-chunked-prefill", False); ints and floats too."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ProfileError(f"{option} {item!r}: write KEY=VALUE, e.g. max-num-batched-tokens=512")
    text = text.strip()
    if text.lower() in ("true", "false"):
        return key.strip(), text.lower() == "true"
    for kind in (int, float):
        try:
            return key.strip(), kind(text)
        except ValueError:
            pass
    return key.strip(), text


def dtypes(cfg: EngineConfig) -> tuple[str, str]:
    """(weight dtype, KV dtype) in the planner's names, from `quantization`, `dtype` and
    `kv-cache-dtype`; `auto` KV follows the activation dtype, not FP8 weights."""
    quantization = cfg.flag("quantization")
    dtype = str(cfg.flag("dtype", "auto")).lower()
    if dtype not in WEIGHT_DTYPES:
        raise ProfileError(f"flag dtype={dtype!r}: the simulator knows {sorted(WEIGHT_DTYPES)}")
    if quantization not in (None, "fp8"):
        raise ProfileError(
            f"flag quantization={quantization!r}: the simulator prices fp8 or 16-bit weights; "
            "pass --latency-model and --kv-capacity-tokens for other schemes"
        )
    weight = "fp8" if quantization == "fp8" else WEIGHT_DTYPES[dtype]
    kv = str(cfg.flag("kv-cache-dtype", "auto")).lower()
    if kv in KV_FP8:
        return weight, "fp8"
    return weight, WEIGHT_DTYPES[dtype] if kv == "auto" else WEIGHT_DTYPES.get(
        kv, WEIGHT_DTYPES[dtype]
    )


def shape(cfg: EngineConfig) -> ModelSpec:
    """The planner's spec of the config's model (`model.spec`)."""
    if cfg.model.spec is None:
        raise ProfileError(
            f"engine config {cfg.name}: model.spec is not set; name a model of the planner's spec "
            "table so the simulator knows its shape"
        )
    return model_spec(cfg.model.spec)


def step_model(cfg: EngineConfig, fitted: Path | None) -> StepTimeModel:
    """A fitted model when given, else the roofline prior at the planner's typical efficiencies."""
    if fitted is not None:
        return LatencyModel.from_json(fitted)
    if cfg.hardware.gpu_type is None:
        raise ProfileError(
            f"engine config {cfg.name} has no hardware.gpu_type, so there is no roofline to price "
            "its steps: pass --latency-model FIT.json (from `nightshift calibrate`)"
        )
    weight, kv = dtypes(cfg)
    eff = Efficiency()
    return roofline_model(
        shape(cfg), cfg.hardware.gpu_type, cfg.hardware.count, weight, kv,
        flops_efficiency=eff.flops, bandwidth_efficiency=eff.bandwidth, overhead_s=eff.overhead_s,
    )  # fmt: skip


def kv_capacity(cfg: EngineConfig) -> int:
    """KV pool tokens: the planner's figure on GPUs, VLLM_CPU_KVCACHE_SPACE on CPU replicas."""
    weight, kv = dtypes(cfg)
    spec = shape(cfg)
    if cfg.hardware.gpu_type is not None:
        utilization = float(cfg.flag("gpu-memory-utilization", 0.9))
        return planner_capacity(
            spec, cfg.hardware.gpu_type, cfg.hardware.count, weight, kv,
            gpu_memory_utilization=utilization,
        )  # fmt: skip
    gib = float(cfg.env.get("VLLM_CPU_KVCACHE_SPACE", CPU_KV_DEFAULT_GIB))
    blocks = int(gib * 2**30 // (kv_bytes_per_token(spec, kv) * BLOCK_TOKENS))
    return blocks * BLOCK_TOKENS


def engine_params(cfg: EngineConfig, capacity: int | None = None) -> dict:
    """The simulator's engine settings from the config's flags (vLLM defaults where unset)."""
    max_len = cfg.flag("max-model-len")
    if max_len is None:
        max_len = shape(cfg).max_position
    flags = {
        "max_num_batched_tokens": cfg.flag("max-num-batched-tokens", 2048),
        "enable_chunked_prefill": cfg.flag("enable-chunked-prefill", True),
        "long_prefill_token_threshold": cfg.flag("long-prefill-token-threshold", 0),
        "max_num_seqs": cfg.flag("max-num-seqs", 256),
        "enable_prefix_caching": cfg.flag("enable-prefix-caching", True),
        "block_size": cfg.flag("block-size", default_block_size(cfg)),
        "max_model_len": max_len,
        "scheduling_policy": cfg.flag("scheduling-policy", "fcfs"),
    }
    flags["kv_capacity_tokens"] = capacity if capacity is not None else kv_capacity(cfg)
    return flags


def default_block_size(cfg: EngineConfig) -> int:
    """vLLM's KV block size when the config leaves it out: 128 on its CPU backend, 16 on GPUs.
    Prefix caching reuses whole blocks only, so this sets how much of a shared prompt hits."""
    return 128 if cfg.hardware.kind == "cpu" else 16
