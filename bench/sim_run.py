"""One simulated run of an engine config, as `nightshift simulate` asks for it.

Reads the engine config as the launcher does (`serving.engine_profile`: KV capacity from the
planner, step times from the roofline prior or a fitted model), builds the policy with the factory
the Gate uses, runs the simulator and, when asked, writes the records as a warehouse run directory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.sim_records import write_sim_run
from scheduler.policy_factory import PolicyChoice, make_policy
from serving.engine_profile import engine_params, load_profile, parse_assignment, step_model
from simulator.config import sim_config, with_settings
from simulator.run import SimResult, simulate
from simulator.trace import TraceRow, covering_s, read_trace, scale_trace

DEFAULT_DURATION_S = 600.0
"""Virtual seconds of a run without a trace; a replayed trace runs to its last arrival."""


@dataclass(frozen=True)
class SimRequest:
    """What to simulate: the engine config and its changes, the load, the policy and the run."""

    engine_config: Path
    policy: PolicyChoice = PolicyChoice("none")
    overrides: tuple[str, ...] = ()
    settings: tuple[str, ...] = ()
    """`--set SECTION.FIELD=VALUE` items, applied last."""
    chat: dict[str, Any] = field(default_factory=dict)
    batch: dict[str, Any] = field(default_factory=dict)
    control: dict[str, Any] = field(default_factory=dict)
    slo: dict[str, Any] = field(default_factory=dict)
    duration_s: float | None = None
    """None: the whole trace when one is replayed, else `DEFAULT_DURATION_S`."""
    seed: int = 0
    replicas: int = 1
    latency_model: Path | None = None
    kv_capacity_tokens: int | None = None
    records: Path | None = None
    run_id: str | None = None


def run_simulation(req: SimRequest) -> SimResult:
    """Simulate `req`, and write its records when `req.records` names a directory.
    Raises ValueError (pydantic's ValidationError among them) or OSError on bad input."""
    cfg = load_profile(req.engine_config, list(req.overrides))
    model = step_model(cfg, req.latency_model)
    trace = _trace(req)
    sim_cfg = sim_config(
        cfg.name,
        engine=engine_params(cfg, req.kv_capacity_tokens),
        chat=req.chat,
        batch=req.batch,
        control=req.control,
        slo=req.slo,
        duration_s=req.duration_s or (covering_s(trace) if trace else DEFAULT_DURATION_S),
        seed=req.seed,
        replicas=req.replicas,
        run_id=req.run_id or (req.records.name if req.records else "sim"),
    )
    sim_cfg = with_settings(sim_cfg, [parse_assignment(s, "--set") for s in req.settings])
    policy = make_policy(
        req.policy, sim_cfg.slo, model, cfg.controller, sim_cfg.engine.max_num_seqs
    )
    result = simulate(sim_cfg, model, lambda _replica: policy, trace)
    if req.records is not None:
        write_sim_run(
            req.records, result, cfg.name, req.policy.name, cfg.hardware.count,
            cfg.hardware.hourly_usd,
        )  # fmt: skip
    return result


def _trace(req: SimRequest) -> list[TraceRow] | None:
    path = req.chat.get("trace")
    if not path:
        return None
    return scale_trace(read_trace(path), speedup=req.chat.get("trace_speedup", 1.0))
