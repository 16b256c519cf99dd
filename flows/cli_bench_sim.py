"""`nightshift bench --sim`: the side-by-side benchmark on simulated replicas of an engine config.

Kept apart from flows/cli_bench.py, which stays the real benchmark's thin CLI. This module turns the
same options into simulator settings (reading the engine config as `nightshift simulate` does: KV
capacity from the planner, step times from the profile's roofline or a fitted model) and settles the
defaults that differ on a GPU profile (bench/sim_scenarios.py `GpuDefaults`). No engine, tokenizer
or replica is started: documents and chat turns are token counts.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from flows.cli_engine import fail

if TYPE_CHECKING:
    from bench.sim_scenarios import SimBench
    from serving.engine_config import EngineConfig

CONTROL = {"interval_s": 2.0, "observe_window_s": 20.0}
"""Decisions every 2 s from a 20 s sensor window, as bench/controller_targets.py tuned them: a
window p99 needs ~100 chat tokens to mean anything."""


@dataclass
class SimOptions:
    """The `bench` options a simulated run reads; None means the profile's default."""

    engine_config: Path
    scenarios: tuple[str, ...]
    duration: float
    json_out: Path
    results: Path
    seed: int = 0
    rate: float | None = None
    latency_model: Path | None = None
    docs: int | None = None
    doc_tokens: int | None = None
    min_tokens: int = 2000
    max_tokens: int = 12000
    slo_factor: float = 3.0
    itl_slo_ms: float | None = None
    ttft_slo_ms: float | None = None
    window_s: float | None = None
    scale: float | None = None
    static_sweep: tuple[tuple[int, int], ...] | None = None
    budget_sweep: tuple[tuple[int, float], ...] | None = None
    replicas: int = 1


def bench_sim(config: EngineConfig, opts: SimOptions) -> None:
    """Simulate the scenarios, then write OUT.json, the records, the warehouse and the report."""
    from pydantic import ValidationError

    from bench.report import write
    from bench.sim_scenarios import run_sim_scenarios
    from flows.cli_simulate import explain
    from warehouse.load import load_results

    try:
        bench = build(config, opts)
        started = time.perf_counter()
        out = run_sim_scenarios(bench, progress=lambda line: typer.echo(line, err=True))
    except ValidationError as exc:
        raise fail(explain(exc)) from None
    except (ValueError, OSError) as exc:  # profile, spec, planner, latency model, SLO errors
        raise fail(str(exc)) from None
    wall = time.perf_counter() - started
    opts.json_out.parent.mkdir(parents=True, exist_ok=True)
    opts.json_out.write_text(json.dumps(out, indent=2))
    load_results(opts.results, list(out["run_ids"].values()))
    command = shlex.join(["nightshift", *sys.argv[1:]])
    md, page = write(out, Path(opts.results) / "bench" / bench.bench_id, command)
    typer.echo(md.read_text())
    typer.echo(f"simulated {len(out['run_ids'])} runs of {opts.duration:g} s in {wall:.1f} s wall")
    typer.echo(f"OUT.json: {opts.json_out}\nreport: {page}")


def build(config: EngineConfig, opts: SimOptions) -> SimBench:
    """The simulated benchmark of `config` under `opts`, defaults filled in for its kind."""
    from bench.sim_scenarios import GPU, SimBench, chat_workload
    from flows.cli_bench import DOCS, RATE, WINDOW_S
    from flows.cli_simulate import engine_params, sim_config, step_model
    from scheduler.budget_controller import BudgetControllerConfig

    gpu = config.hardware.kind == "gpu"
    window = opts.window_s or (GPU.window_s if gpu else WINDOW_S)
    rate = opts.rate if opts.rate is not None else (GPU.rate if gpu else RATE)
    docs = opts.docs if opts.docs is not None else (GPU.docs if gpu else DOCS)
    doc_tokens = opts.doc_tokens or (
        GPU.doc_tokens if gpu else (opts.min_tokens + opts.max_tokens) // 2
    )
    scale = opts.scale if opts.scale is not None else (1.0 if gpu else 0.1)
    base = sim_config(
        config,
        engine=engine_params(config),
        chat=chat_workload(rate, scale).model_dump(),
        batch={"docs": docs, "doc_tokens": doc_tokens, "mode": "map"},
        control=CONTROL,
        duration_s=opts.duration,
        seed=opts.seed,
        replicas=opts.replicas,
    )
    controller = config.controller or BudgetControllerConfig()
    sweep = opts.static_sweep or (GPU.static_sweep if gpu else None)
    return SimBench(
        base=base,
        model=step_model(config, _latency_model(config, opts.latency_model)),
        profile=config.name,
        scenarios=opts.scenarios,
        slo=_slo(opts, gpu, window),
        slo_factor=opts.slo_factor,
        window_s=window,
        controller=controller,
        results=str(opts.results),
        hardware_count=config.hardware.count,
        hourly_usd=config.hardware.hourly_usd,
        **({"static_sweep": sweep} if sweep else {}),
        **({"budget_sweep": opts.budget_sweep} if opts.budget_sweep else {}),
    )


def _slo(opts: SimOptions, gpu: bool, window: float):
    """Both targets given: those. On a GPU profile: 50 ms / 1 s for whichever is missing. On a CPU
    profile, as the real bench does: None, so the chat-only run sets it."""
    from bench.sim_scenarios import GPU
    from scheduler.slo import SLO

    itl, ttft = opts.itl_slo_ms, opts.ttft_slo_ms
    if itl is not None and ttft is not None:
        return SLO(chat_itl_p99_ms=itl, chat_ttft_p99_ms=ttft, window_s=window)
    if gpu:
        return SLO(
            chat_itl_p99_ms=itl or GPU.itl_slo_ms,
            chat_ttft_p99_ms=ttft or GPU.ttft_slo_ms,
            window_s=window,
        )
    return None


def _latency_model(config: EngineConfig, given: Path | None) -> Path | None:
    """The fit to price steps with: the one given; on a CPU profile, the real bench's default
    (engine_configs/fits/<name>.json); on a GPU profile none, so the roofline prior prices them."""
    if given is not None or config.hardware.kind == "gpu":
        return given
    path = Path("engine_configs/fits") / f"{config.name}.json"
    if not path.is_file():
        raise ValueError(
            f"no latency model at {path} for the CPU profile {config.name}: fit one with "
            f"`nightshift calibrate --engine-config CONFIG --out {path}`, or pass --latency-model"
        )
    return path
