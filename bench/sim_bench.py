"""`nightshift bench --sim`: the side-by-side benchmark on simulated replicas of an engine config.

Turns the bench options into simulator settings (reading the engine config as `nightshift simulate`
does: KV capacity from the planner, step times from the profile's roofline or a fitted model) and
settles the defaults that differ on a GPU profile (bench/sim_scenarios.py `GpuDefaults`). No
engine, tokenizer or replica is started: documents and chat turns are token counts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bench.bench_options import RATE, WINDOW_S, BenchOptions, default_docs
from bench.sim_scenarios import run_sim_scenarios

if TYPE_CHECKING:
    from bench.sim_scenarios import SimBench
    from serving.engine_config import EngineConfig

CONTROL = {"interval_s": 2.0, "observe_window_s": 20.0}
"""Decisions every 2 s from a 20 s sensor window, as bench/controller_targets.py tuned them: a
window p99 needs ~100 chat tokens to mean anything."""


@dataclass(frozen=True)
class SimOptions(BenchOptions):
    """The `bench --sim` options; None means the profile's default."""

    json_out: Path | None = None
    doc_tokens: int | None = None
    replicas: int = 1


def run_sim_bench(
    config: EngineConfig, opts: SimOptions, progress=None
) -> tuple[dict, Path, float]:
    """Simulate the scenarios; write the records and load them into the warehouse. Returns
    OUT.json's content, the bench's folder (for its report) and the wall seconds the scenarios
    took. Raises ValueError (pydantic's ValidationError among them) or OSError on bad input."""
    from warehouse.load import load_results

    bench = build(config, opts)
    started = time.perf_counter()
    out = run_sim_scenarios(bench, progress=progress)
    wall = time.perf_counter() - started
    load_results(opts.results, list(out["run_ids"].values()))
    return out, Path(opts.results) / "bench" / bench.bench_id, wall


def build(config: EngineConfig, opts: SimOptions) -> SimBench:
    """The simulated benchmark of `config` under `opts`, defaults filled in for its kind."""
    from bench.sim_scenarios import GPU, SimBench, chat_workload
    from scheduler.budget_controller import BudgetControllerConfig
    from serving.engine_profile import engine_params, step_model
    from simulator.config import sim_config

    gpu = config.hardware.kind == "gpu"
    window = opts.window_s or (GPU.window_s if gpu else WINDOW_S)
    rate = opts.rate if opts.rate is not None else (GPU.rate if gpu else RATE)
    docs = (
        opts.docs if opts.docs is not None else (GPU.docs if gpu else default_docs(opts.duration))
    )
    doc_tokens = opts.doc_tokens or (
        GPU.doc_tokens if gpu else (opts.min_tokens + opts.max_tokens) // 2
    )
    scale = opts.scale if opts.scale is not None else (1.0 if gpu else 0.1)
    base = sim_config(
        config.name,
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
        e2e_slo_ms=opts.e2e_slo_ms,
        section_tokens=opts.section_tokens,
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
