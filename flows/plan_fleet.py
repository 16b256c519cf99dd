"""`nightshift plan --fleet`: runs the fleet search of `bench/fleet_run.py` and prints the plan."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from bench.fleet_run import FleetOptions


def fleet_command(opts: FleetOptions) -> None:
    """Run the fleet search and report it; bad input exits 2, no fleet found exits 1."""
    from pydantic import ValidationError

    from bench.fleet_run import fleet_search, load_fleet_config, plan_document
    from flows.cli_options import write_json
    from simulator.config import explain
    from simulator.fleet import plan_fleet

    try:
        config = load_fleet_config(opts)
        search = fleet_search(config, opts)
    except ValidationError as exc:
        _fail(explain(exc))
    except (ValueError, OSError) as exc:  # config, spec, planner, trace, fit and search errors
        _fail(str(exc))
    plan = plan_fleet(search, progress=lambda line: typer.echo(line, err=True))
    doc = plan_document(config, opts, plan)
    to_stdout = write_json(opts.json_out, doc)
    if not to_stdout:
        typer.echo(render(doc))
    for warning in plan.warnings:
        typer.echo(f"warning: {warning}", err=True)
    if plan.replicas is None:
        raise typer.Exit(1)


def render(doc: dict) -> str:
    """The plan for people: one line per answer."""
    chat = doc["chat"]
    load = f"{chat['rate']:g} requests/s" if "rate" in chat else f"trace {chat['trace']}"
    slo = doc["slo"]
    lines = [
        f"fleet plan for {doc['engine_config']}, chat {load}, SLO ITL p99 {slo['itl_p99_ms']:g} "
        f"ms and TTFT p99 {slo['ttft_p99_ms']:g} ms in {doc['windows_required']:.0%} of "
        f"{slo['window_s']:g} s windows "
        f"({doc['sim_minutes']:g} simulated minutes judged per run, after "
        f"{doc['warmup_minutes']:g} of warm-up)"
    ]
    if doc["replicas"] is None:
        lines.append("chat alone     no fleet held the SLO (see the probes above)")
        return "\n".join(lines)
    best = next(
        p for p in doc["probes"] if (p["replicas"], p["budget"]) == (doc["replicas"], doc["budget"])
    )
    lines.append(
        f"chat alone     {doc['replicas']} replicas, max-num-batched-tokens {doc['budget']} "
        f"(windows met {best['windows_met']:.0%}; ITL at {best['itl_pressure']:.2f} and TTFT at "
        f"{best['ttft_pressure']:.2f} of the SLO)"
    )
    d = doc["document"]
    lines.append(
        f"largest doc    {d['largest_doc_tokens']:,} tokens per replica without preempting "
        f"(bound: {d['limited_by']}; KV {d['kv_capacity_tokens']:,}, chat peak "
        f"{d['chat_peak_tokens']:,}); the controller admits up to "
        f"{d['largest_admitted_doc_tokens']:,} (KV high water {d['kv_high_water']:g})"
    )
    b = doc["batch"]
    if b is None:
        lines.append("batch          not simulated (see the warning)")
        return "\n".join(lines)
    lines.append(
        f"batch          {b['docs_per_night']:,.0f} documents of {doc['doc_tokens']:,} tokens per "
        f"{doc['night_hours']:g} h night at the SLO (SLO held in {b['windows_met']:.0%} of "
        f"windows with batch; {b['slo_prefill_tokens_per_s']:,.0f} prompt tokens/s; "
        f"{b['preemptions']} preemptions)"
    )
    return "\n".join(lines)


def _fail(message: str):
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)
