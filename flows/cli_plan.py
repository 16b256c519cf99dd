"""`nightshift plan`: size a replica from model and GPU specs, and write its engine config.

The arithmetic lives in `scheduler.planner` and the engine config it renders in
`serving.plan_config`; this module turns options into a plan and prints it (a table, or JSON with
`--json PATH`, `-` for stdout).
`--fleet` instead plans a fleet of an engine config by simulation (flows/plan_fleet.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from flows.cli_options import JsonOut, write_json

if TYPE_CHECKING:
    from scheduler.planner import Plan


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_command)


def plan_command(
    model: Annotated[str | None, typer.Option(help="Model spec name, e.g. llama-3.1-70b.")] = None,
    gpu: Annotated[str | None, typer.Option(help="GPU spec name, e.g. h100-sxm (or h100).")] = None,
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
    # --fleet: simulate replicas of --engine-config under a chat load (flows/plan_fleet.py).
    fleet: Annotated[
        bool, typer.Option(help="Plan a fleet of --engine-config by simulation.")
    ] = False,
    engine_config: Annotated[Path | None, typer.Option(help="--fleet: the replica class.")] = None,
    chat_rate: Annotated[float | None, typer.Option(help="--fleet: chat requests/s.")] = None,
    chat_trace: Annotated[Path | None, typer.Option(help="--fleet: chat trace CSV.")] = None,
    ttft_slo_ms: Annotated[float, typer.Option(help="--fleet: chat TTFT p99 SLO.")] = 1000.0,
    window_s: Annotated[float, typer.Option(help="--fleet: SLO window, seconds.")] = 60.0,
    night_hours: Annotated[float, typer.Option(help="--fleet: length of the night.")] = 8.0,
    max_replicas: Annotated[int, typer.Option(help="--fleet: most replicas tried.")] = 8,
    sim_minutes: Annotated[float, typer.Option(help="--fleet: simulated minutes per run.")] = 3.0,
    seed: Annotated[int, typer.Option(help="--fleet: random seed of every run.")] = 0,
    latency_model: Annotated[Path | None, typer.Option(help="--fleet: latency fit JSON.")] = None,
) -> None:
    """Size a replica: KV and weight memory, concurrency, decode roofline, chunk sizes per position."""
    from scheduler.planner import Efficiency, PlanError, plan
    from scheduler.specs import SpecError
    from serving.plan_config import write_engine_config

    if fleet:
        from bench.fleet_run import FleetOptions
        from flows.plan_fleet import fleet_command

        return fleet_command(
            FleetOptions(
                engine_config,
                chat_rate,
                chat_trace,
                itl_slo_ms,
                ttft_slo_ms,
                window_s,
                doc_tokens or 80_000,
                night_hours,
                max_replicas,
                sim_minutes,
                seed,
                latency_model,
                json_out,
            )  # fmt: skip
        )
    if model is None or gpu is None:
        typer.echo("error: plan needs --model and --gpu (or --fleet --engine-config)", err=True)
        raise typer.Exit(2)
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
            write_engine_config(result, emit_engine_config)
    except (SpecError, PlanError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if not write_json(json_out, result.to_dict()):
        _print_table(result)
    if emit_engine_config is not None:
        typer.echo(f"wrote engine config {emit_engine_config}", err=True)


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
