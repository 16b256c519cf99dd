"""`nightshift plan --fleet`: an engine config and a chat load in, a fleet plan out.

The search is `simulator.fleet`; this module reads the engine config as `nightshift simulate` does
(`serving.engine_profile`: engine flags, KV capacity from the planner or the CPU KV space) and
picks its step-time model: `--latency-model` when given, else the config's latency fit
(`latency_fit`, by default `fits/<name>.json` beside it), else the roofline prior of a GPU config.
A CPU config without a fit has no honest step times, so it is refused with the command that
makes one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from serving.engine_config import EngineConfig
    from simulator.fleet import FleetPlan, FleetSearch

CONTROL = {"interval_s": 2.0, "observe_window_s": 20.0}
"""The SLO controller's loop in the batch run: a decision every 2 s from a 20 s sensor window, as
the simulated benchmark runs it (a window p99 needs ~100 chat tokens to mean anything)."""


@dataclass(frozen=True)
class FleetOptions:
    """The `plan --fleet` options, as typed."""

    engine_config: Path | None
    chat_rate: float | None
    chat_trace: Path | None
    itl_slo_ms: float
    ttft_slo_ms: float
    window_s: float = 60.0
    doc_tokens: int = 80_000
    night_hours: float = 8.0
    max_replicas: int = 8
    sim_minutes: float = 3.0
    seed: int = 0
    latency_model: Path | None = None
    json_out: Path | None = None


def fleet_command(opts: FleetOptions) -> None:
    """Run the fleet search and report it; bad input exits 2, no fleet found exits 1."""
    from pydantic import ValidationError

    from flows.cli_options import write_json
    from simulator.config import explain
    from simulator.fleet import plan_fleet

    try:
        config = _engine_config(opts)
        search = fleet_search(config, opts)
    except ValidationError as exc:
        _fail(explain(exc))
    except (ValueError, OSError) as exc:  # config, spec, planner, trace, fit and search errors
        _fail(str(exc))
    plan = plan_fleet(search, progress=lambda line: typer.echo(line, err=True))
    doc = _document(config, opts, plan)
    to_stdout = write_json(opts.json_out, doc)
    if not to_stdout:
        typer.echo(render(doc))
    for warning in plan.warnings:
        typer.echo(f"warning: {warning}", err=True)
    if plan.replicas is None:
        raise typer.Exit(1)


def _engine_config(opts: FleetOptions) -> EngineConfig:
    from serving.engine_config import load_engine_config

    if opts.engine_config is None:
        raise ValueError("--fleet needs --engine-config CFG: the replica class to plan a fleet of")
    if (opts.chat_rate is None) == (opts.chat_trace is None):
        raise ValueError(
            "--fleet needs one chat load: give --chat-rate R (Poisson requests/s) or "
            "--chat-trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens), not both or neither"
        )
    if opts.chat_rate is not None and opts.chat_rate <= 0:
        raise ValueError(f"--chat-rate {opts.chat_rate:g}: must be above 0 requests/s")
    return load_engine_config(opts.engine_config)


def step_model_path(config: EngineConfig, config_path: Path, given: Path | None) -> Path | None:
    """The fit to price steps with (None: the roofline prior); raises when there is neither, or
    when the config names a fit that is missing."""
    from serving.replica_targets import configured_fit, fit_path

    if given is not None:
        return given
    fit = configured_fit(config_path, config)
    if fit is not None or config.hardware.gpu_type is not None:
        return fit
    path = fit_path(config_path, config)
    raise ValueError(
        f"engine config {config.name} has no latency fit at {path} and no hardware.gpu_type "
        f"to price steps by roofline: fit one with `nightshift calibrate --engine-config "
        f"{config_path} --out {path}`, or pass --latency-model FIT.json"
    )


def fleet_search(config: EngineConfig, opts: FleetOptions) -> FleetSearch:
    """The simulator's fleet question for `config` under `opts`."""
    from scheduler.budget_controller import BudgetControllerConfig
    from serving.engine_profile import engine_params, step_model
    from simulator.config import sim_config
    from simulator.fleet import FleetSearch
    from simulator.trace import read_trace

    fit = step_model_path(config, opts.engine_config, opts.latency_model)
    base = sim_config(
        config.name,
        engine=engine_params(config),
        chat={"rate": opts.chat_rate or 0.0},
        control=CONTROL,
        slo={
            "chat_itl_p99_ms": opts.itl_slo_ms,
            "chat_ttft_p99_ms": opts.ttft_slo_ms,
            "window_s": opts.window_s,
        },
        seed=opts.seed,
    )
    return FleetSearch(
        base=base,
        model=step_model(config, fit),
        controller=config.controller or BudgetControllerConfig(),
        trace=read_trace(opts.chat_trace) if opts.chat_trace else None,
        minutes=opts.sim_minutes,
        warmup_minutes=0.0 if opts.chat_trace else 2.0,
        max_replicas=opts.max_replicas,
        doc_tokens=opts.doc_tokens,
        night_hours=opts.night_hours,
    )


def _document(config: EngineConfig, opts: FleetOptions, plan: FleetPlan) -> dict:
    chat = (
        {"rate": opts.chat_rate} if opts.chat_rate is not None else {"trace": str(opts.chat_trace)}
    )
    slo = {
        "itl_p99_ms": opts.itl_slo_ms,
        "ttft_p99_ms": opts.ttft_slo_ms,
        "window_s": opts.window_s,
    }
    return {"engine_config": config.name, "chat": chat, "slo": slo, **plan.to_dict()}


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
