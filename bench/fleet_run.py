"""`nightshift plan --fleet`'s work: an engine config and a chat load in, the fleet question out.

The search is `simulator.fleet`; this module reads the engine config as `nightshift simulate` does
(`serving.engine_profile`: engine flags, KV capacity from the planner or the CPU KV space) and
picks its step-time model: `--latency-model` when given, else the config's latency fit
(`latency_fit`, by default `fits/<name>.json` beside it), else the roofline prior of a GPU config.
A CPU config without a fit has no honest step times, so it is refused with the command that
makes one. `flows/plan_fleet.py` prints what comes of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

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


def load_fleet_config(opts: FleetOptions) -> EngineConfig:
    """The engine config to plan a fleet of, once the options name one and one chat load."""
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


def plan_document(config: EngineConfig, opts: FleetOptions, plan: FleetPlan) -> dict:
    """The plan as `--json` writes it: the question asked, then `FleetPlan.to_dict()`."""
    chat = (
        {"rate": opts.chat_rate} if opts.chat_rate is not None else {"trace": str(opts.chat_trace)}
    )
    slo = {
        "itl_p99_ms": opts.itl_slo_ms,
        "ttft_p99_ms": opts.ttft_slo_ms,
        "window_s": opts.window_s,
    }
    return {"engine_config": config.name, "chat": chat, "slo": slo, **plan.to_dict()}
