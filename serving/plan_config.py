"""A capacity plan as an engine config the launcher accepts (`nightshift plan --emit-engine-config`).

The plan's numbers become vLLM flags: the step budget from the chunk advised at prefix 0 (what
chat alone needs: chat prompts start there), the KV dtype in the engine's names, and the engine
plug-in (`serving/engine_site/budget_scheduler.py`), which sizes each batch chunk to its position
inside that budget. A written file is validated against the launcher's schema first, so it always
loads.
"""

from __future__ import annotations

import math
from pathlib import Path

import yaml

from scheduler.planner import CHUNK_GRANULARITY, Plan, PlanError
from scheduler.specs import SHAPE_FIELDS, model_spec
from serving.engine_config import EngineConfig

VLLM_KV_CACHE_DTYPE = {"fp8": "fp8", "int8": "int8_per_token_head", "int4": "int4_per_token_head"}
"""Engine names of the quantized KV dtypes; 16-bit KV is `auto` (the model dtype) or named."""
VLLM_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}


def engine_config_for(p: Plan) -> dict:
    """The engine config (serving.engine_config schema) that runs plan `p` on vLLM.

    The step budget `max-num-batched-tokens` counts decode tokens too, so it is the chunk advised
    at prefix 0 plus one token per planned sequence. `long-prefill-token-threshold` equals it: one
    chat prompt may fill a step, which keeps chat TTFT down. Batch prompts are not capped by a
    flag: the plug-in grants each of their chunks what fits the controller's step target at its
    prefix, so the deepest position's advice no longer has to cap every position.
    """
    chunks = [c.chunk_tokens for c in p.recommended_chunk_tokens if c.chunk_tokens > 0]
    if not chunks or p.recommended_chunk_tokens[0].chunk_tokens == 0:
        raise PlanError(
            f"no prefill chunk fits the {p.itl_slo_ms:g} ms ITL SLO beside {p.decode_batch} "
            f"decoding sequences (decode alone ~{p.decode_step_ms_est:.1f} ms): lower --batch "
            "or raise --itl-slo-ms"
        )
    spec = model_spec(p.model)
    budget = CHUNK_GRANULARITY * math.ceil((chunks[0] + p.decode_batch) / CHUNK_GRANULARITY)
    return {
        "name": f"{p.model}-{p.gpus}x{p.gpu}-{p.weight_dtype}",
        "model": {
            "path": spec.path,
            "served_name": spec.name,
            "spec": spec.name,
            "architecture": {k: getattr(spec, k) for k in SHAPE_FIELDS},
        },
        "hardware": {
            "kind": "gpu",
            "gpu_type": p.gpu,
            "count": p.gpus,
            "hourly_usd": round(p.hourly_usd, 4),
        },
        "vllm": _vllm_flags(p, budget),
    }


PLUGIN = "serving.engine_site.budget_scheduler.AsyncBudgetScheduler"
"""The plug-in's class on a GPU host, where vLLM schedules asynchronously."""


def _vllm_flags(p: Plan, budget: int) -> dict:
    dtype = "float16" if p.weight_dtype == "fp16" else "bfloat16"
    kv = VLLM_KV_CACHE_DTYPE.get(p.kv_dtype) or VLLM_DTYPE[p.kv_dtype]
    flags = {
        "tensor-parallel-size": p.gpus,
        "dtype": dtype,
        "max-model-len": p.max_model_len,
        "max-num-seqs": p.decode_batch,
        "max-num-batched-tokens": budget,
        "long-prefill-token-threshold": budget,
        "enable-chunked-prefill": True,
        "enable-prefix-caching": True,
        "scheduling-policy": "priority",
        "scheduler-cls": PLUGIN,
        "enable-prompt-tokens-details": True,
        "kv-cache-dtype": "auto" if kv == dtype else kv,
        "gpu-memory-utilization": p.gpu_memory_utilization,
    }
    if p.weight_dtype == "fp8":
        flags["quantization"] = "fp8"
    return flags


def write_engine_config(p: Plan, path: Path) -> None:
    """Validate against the launcher's schema before writing, so a written file always loads.
    int8/int4 weights need a pre-quantized checkpoint: vLLM reads its method from the checkpoint,
    so put that checkpoint's path under model.path."""
    doc = engine_config_for(p)
    EngineConfig.model_validate(doc)
    header = (
        f"# Written by `nightshift plan` for {p.model} on {p.gpus} x {p.gpu} "
        f"({p.weight_dtype} weights, {p.kv_dtype} KV, {p.context}-token context, "
        f"{p.itl_slo_ms:g} ms ITL SLO).\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + yaml.safe_dump(doc, sort_keys=False))
