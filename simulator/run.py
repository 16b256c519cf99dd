"""Run one simulation end to end: build, loop until the duration, drain chat, close, summarize."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pyarrow as pa

from scheduler.admission import NoAdmissionControl
from scheduler.step import StepTimeModel
from simulator.config import SimConfig
from simulator.loop import EventLoop
from simulator.simulation import PolicyFactory, Simulation
from simulator.summary import RunTotals, WindowVerdicts, summarize, window_verdicts
from simulator.trace import TraceRow


@dataclass
class SimResult:
    """The OUT.json summary, plus the run itself for records and closer inspection."""

    summary: dict
    sim: Simulation
    events: int
    totals: RunTotals

    def window_verdicts(self) -> WindowVerdicts:
        """Chat's p99s and verdicts per SLO window, by part of the SLO (the summary's windows)."""
        return window_verdicts(self.sim.recorder, self.totals, self.sim.cfg.slo)

    def tables(self) -> dict[str, pa.Table]:
        """requests, token_gaps, decisions and documents, in the warehouse's column layout."""
        return self.sim.recorder.tables(self.sim.dispatcher.document_rows(self.sim.cfg.run_id))


def simulate(
    cfg: SimConfig,
    model: StepTimeModel,
    policy_factory: PolicyFactory | None = None,
    trace: list[TraceRow] | None = None,
) -> SimResult:
    """Simulate `cfg.duration_s` virtual seconds; batch is uncontrolled unless a policy is given."""
    started = time.perf_counter()
    sim = Simulation(cfg, model, policy_factory or (lambda _name: NoAdmissionControl()), trace)
    loop = EventLoop(sim, sim.initial_events())
    loop.run(cfg.duration_s)
    sim.end_intake()
    loop.run(cfg.duration_s + cfg.drain_s, stop=lambda: sim.chat_in_flight == 0)
    sim.close()
    totals = RunTotals(
        sim_seconds=cfg.duration_s,
        wall_seconds=time.perf_counter() - started,
        preemptions=sum(r.engine.preemptions for r in sim.replicas),
        kv_peak=max(r.kv_peak for r in sim.replicas),
        docs_done=sim.dispatcher.docs_done,
        closed_at=sim.now,
    )
    return SimResult(summarize(sim.recorder, totals, cfg.slo), sim, loop.handled, totals)
