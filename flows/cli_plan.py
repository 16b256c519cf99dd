"""`nightshift plan`: size a replica from model and GPU specs, and write its engine config.

The arithmetic lives in `scheduler.planner`; this module turns options into a plan, prints it (a
table, or JSON with `--json PATH`, `-` for stdout), and renders the plan as an engine config the launcher accepts.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from flows.cli_options import JsonOut, write_json

if TYPE_CHECKING:
    from scheduler.planner import Plan

VLLM_KV_CACHE_DTYPE = {"fp8": "fp8", "int8": "int8_per_token_head", "int4": "int4_per_token_head"}
"""Engine names of the quantized KV dtypes; 16-bit KV is `auto` (the model dtype) or named."""
VLLM_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_command)


def plan_command(
    model: Annotated[str, typer.Option(help="Model spec name, e.g. llama-3.1-70b.")],
    gpu: Annotated[str, typer.Option(help="GPU spec name, e.g. h100-sxm (or h100).")],
    gpus: Annotated[int, typer.Option(help="GPUs per replica (tensor parallel).")] = 1,
    weight_dtype: Annotated[str, typer.Option(help="bf16, fp16, fp8, int8 or int4.")] = "bf16",
    kv_dtype: Annotated[str, typer.Option(help="KV cache dtype: bf16, fp16, fp8, ...")] = "bf16",
    context: Annotated[int, typer.Option(help="Total context per sequence, tokens.")] = 4096,
    shared_prefix: Annotated[
        int, typer.Option(help="Part of --context all sequences share, stored once.")
    ] = 0,
    itl_slo_ms: Annotated[float, typer.Option(help="Chat ITL SLO the chunk advice keeps.")] = 50.0,
    reserve_gb: Annotated[
        float | None,
        typer.Option(
            help="Memory kept free of weights and KV, whole replica (default: 5 GB per GPU)."
        ),
    ] = None,
    batch: Annotated[
        int | None,
        typer.Option(help="Decode batch to plan for (default: as many as the KV holds)."),
    ] = None,
    prompt_tokens: Annotated[
        int | None, typer.Option(help="Prompt length for prefill_s (default: --context).")
    ] = None,
    doc_tokens: Annotated[
        int | None,
        typer.Option(
            help="Longest batch prompt the chunk advice covers (default: the model's max position)."
        ),
    ] = None,
    flops_efficiency: Annotated[float, typer.Option(help="Share of peak FLOP/s for _est.")] = 0.5,
    bandwidth_efficiency: Annotated[
        float, typer.Option(help="Share of peak bandwidth for _est.")
    ] = 0.7,
    overhead_ms: Annotated[float, typer.Option(help="Fixed ms per engine step for _est.")] = 2.0,
    json_out: JsonOut = None,
    emit_engine_config: Annotated[
        Path | None, typer.Option(help="Write an engine config YAML for this plan to PATH.")
    ] = None,
) -> None:
    """Size a replica: KV and weight memory, concurrency, decode roofline, chunk sizes per position."""
    from scheduler.planner import Efficiency, PlanError, plan
    from scheduler.specs import SpecError

    try:
        result = plan(
            model,
            gpu,
            gpus=gpus,
            weight_dtype=weight_dtype,
            kv_dtype=kv_dtype,
            context=context,
            shared_prefix=shared_prefix,
            itl_slo_ms=itl_slo_ms,
            reserve_gb=reserve_gb,
            batch=batch,
            prompt_tokens=prompt_tokens,
            doc_tokens=doc_tokens,
            efficiency=Efficiency(flops_efficiency, bandwidth_efficiency, overhead_ms / 1000),
        )
        if emit_engine_config is not None:
            _write_engine_config(result, emit_engine_config)
    except (SpecError, PlanError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if not write_json(json_out, result.to_dict()):
        _print_table(result)
    if emit_engine_config is not None:
        typer.echo(f"wrote engine config {emit_engine_config}", err=True)


def engine_config_for(p: Plan) -> dict:
    """The engine config (serving.engine_config schema) that runs plan `p` on vLLM.

    The step budget `max-num-batched-tokens` counts decode tokens too, so it is the chunk advised
    at prefix 0 plus one token per planned sequence; `long-prefill-token-threshold` caps each long
    prompt's chunk at the size advised for the deepest position, safe at any position.
    """
    from scheduler.planner import CHUNK_GRANULARITY, PlanError
    from scheduler.specs import SHAPE_FIELDS, model_spec

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
        "vllm": _vllm_flags(p, budget, min(chunks)),
    }


def _vllm_flags(p: Plan, budget: int, threshold: int) -> dict:
    dtype = "float16" if p.weight_dtype == "fp16" else "bfloat16"
    kv = VLLM_KV_CACHE_DTYPE.get(p.kv_dtype) or VLLM_DTYPE[p.kv_dtype]
    flags = {
        "tensor-parallel-size": p.gpus,
        "dtype": dtype,
        "max-model-len": p.max_model_len,
        "max-num-seqs": p.decode_batch,
        "max-num-batched-tokens": budget,
        "long-prefill-token-threshold": threshold,
        "enable-chunked-prefill": True,
        "enable-prefix-caching": True,
        "scheduling-policy": "priority",
        "kv-cache-dtype": "auto" if kv == dtype else kv,
        "gpu-memory-utilization": p.gpu_memory_utilization,
    }
    if p.weight_dtype == "fp8":
        flags["quantization"] = "fp8"
    return flags


def _write_engine_config(p: Plan, path: Path) -> None:
    """Validate against the launcher's schema before writing, so a written file always loads.
    int8/int4 weights need a pre-quantized checkpoint: vLLM reads its method from the checkpoint,
    so put that checkpoint's path under model.path."""
    import yaml

    from serving.engine_config import EngineConfig

    doc = engine_config_for(p)
    EngineConfig.model_validate(doc)
    header = (
        f"# Written by `nightshift plan` for {p.model} on {p.gpus} x {p.gpu} "
        f"({p.weight_dtype} weights, {p.kv_dtype} KV, {p.context}-token context, "
        f"{p.itl_slo_ms:g} ms ITL SLO).\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + yaml.safe_dump(doc, sort_keys=False))


def _print_table(p: Plan) -> None:
    from rich.console import Console
    from rich.table import Table

    gb, kib = 1e9, 1024
    table = Table(title=f"{p.model} on {p.gpus} × {p.gpu}", show_header=False)
    table.add_column("quantity", style="bold")
    table.add_column("value", justify="right")
    rows = [
        ("weights", f"{p.weights_bytes / gb:,.1f} GB ({p.weight_dtype})"),
        ("GPU memory", f"{p.memory_bytes / gb:,.0f} GB, reserve {p.reserve_bytes / gb:,.1f} GB"),
        ("KV per token", f"{p.kv_bytes_per_token / kib:,.0f} KiB ({p.kv_dtype})"),
        ("usable KV", f"{p.usable_kv_bytes / gb:,.1f} GB"),
        ("KV capacity", f"{p.kv_capacity_tokens:,} tokens"),
        ("max concurrent sequences", f"{p.max_concurrent_seqs:,} at {p.context:,} tokens"),
        ("decode batch", f"{p.decode_batch:,} ({p.decode_bytes_per_step / gb:,.1f} GB per step)"),
        ("decode step", f"{p.decode_step_ms_bound:.1f} ms bound, {p.decode_step_ms_est:.1f} est"),
        (
            "decode tokens/s",
            f"{p.decode_tokens_per_s_bound:,.0f} bound, {p.decode_tokens_per_s_est:,.0f} est",
        ),
        (
            f"prefill {p.prompt_tokens:,} tokens",
            f"{p.prefill_s:.3f} s bound, {p.prefill_s_est:.3f} est",
        ),
        ("cost", f"${p.hourly_usd:,.2f} per replica-hour"),
    ]
    for chunk in p.recommended_chunk_tokens:
        rows.append((f"chunk at prefix {chunk.prefix_tokens:,}", f"{chunk.chunk_tokens:,} tokens"))
    for name, value in rows:
        table.add_row(name, value)
    console = Console()
    console.print(table)
    for warning in p.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}")
