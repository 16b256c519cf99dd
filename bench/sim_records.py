"""A simulated run as a run directory the warehouse loads like a real one (virtual seconds).

One writer for `nightshift simulate --records` and every scenario of `bench --sim`, so a simulated
run's `run.json` always carries the same fields as a real run's.
"""

from __future__ import annotations

from pathlib import Path

from scheduler.slo import SLO
from simulator.run import SimResult
from warehouse.run_files import RunMeta, write_meta, write_table


def write_sim_run(
    directory: Path,
    result: SimResult,
    engine_config: str,
    policy: str,
    hardware_count: int,
    hourly_usd: float,
    slo: SLO | None = None,
) -> Path:
    """Write `result`'s tables and run.json into `directory`; `slo` defaults to the run's own.
    The run spans virtual time 0 to its duration, the windows the summary judges."""
    cfg = result.sim.cfg
    directory.mkdir(parents=True, exist_ok=True)
    for name, table in result.tables().items():
        write_table(directory, name, table, run_id=cfg.run_id)
    meta = RunMeta(
        run_id=cfg.run_id,
        engine_config=engine_config,
        policy=policy,
        hardware_count=hardware_count,
        replicas=cfg.replicas,
        hourly_usd=hourly_usd,
        slo=(slo or cfg.slo).model_dump(),
        started=0.0,
        ended=cfg.duration_s,
    )
    write_meta(directory, meta)
    return directory
