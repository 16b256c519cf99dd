"""A calibration as `nightshift calibrate` runs it: the sweep for a config, its prior, the run.

Measures a running replica, or one started from the engine config for the length of the sweep
(on the first free port from `serving.paths.DEFAULT_PORT`), and fits the step-time model. A GPU
config's fit starts from its roofline prior, which fills in terms a sweep cannot excite.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from scheduler.latency_model import LatencyModel
from scheduler.specs import SpecError
from serving.calibration import CalibrationResult, calibrate, prompt_vocab
from serving.calibration_plan import QUICK, SweepConfig, SweepPlan, engine_limits, plan_sweep
from serving.engine_config import EngineConfig
from serving.engine_profile import ProfileError, kv_capacity, step_model

Say = Callable[[str], None]


def sweep_plan(config: EngineConfig, quick: bool, repeats: int | None) -> SweepPlan:
    """The shapes to time on a replica of `config`: the full sweep, or the quick one for tests."""
    sweep = QUICK if quick else SweepConfig()
    if repeats is not None:
        sweep = dataclasses.replace(sweep, repeats=repeats)
    return plan_sweep(engine_limits(config, _kv_capacity(config)), sweep)


def _kv_capacity(config: EngineConfig) -> int | None:
    """The simulator's KV pool size for this config; None when the config names no model spec."""
    try:
        return kv_capacity(config)
    except (ProfileError, SpecError):
        return None


def prior(config: EngineConfig) -> LatencyModel | None:
    """The roofline prior on GPUs: it fills in terms a sweep cannot excite; CPUs have none."""
    if config.hardware.kind != "gpu" or config.hardware.gpu_type is None or not config.model.spec:
        return None
    return step_model(config, None)  # type: ignore[return-value]


def measure(
    url: str,
    config: EngineConfig,
    plan: SweepPlan,
    seed: int,
    say: Say,
    engine_steps: Path | None = None,
) -> CalibrationResult:
    """Time `plan`'s steps on the replica at `url` and fit them; progress lines go to `say`.
    `engine_steps` is the step log of a replica that times its own steps (the plug-in's)."""
    start = time.monotonic()

    def progress(message: str) -> None:
        say(f"  [{time.monotonic() - start:4.0f} s] {message}")

    return asyncio.run(
        calibrate(url, config.model.served_name, plan, prompt_vocab(config), prior(config),
                  seed, progress, engine_steps)
    )  # fmt: skip


def measure_own_replica(
    config: EngineConfig,
    config_path: Path,
    plan: SweepPlan,
    seed: int,
    port: int | None,
    state_dir: Path,
    timeout_s: float,
    say: Say,
) -> CalibrationResult:
    """`measure` on a replica started from the config for the sweep and stopped after it.
    Raises NoFreePort, SetupError or EngineStartError when no replica can be started."""
    from serving.engine_site.step_log import STEP_LOG_ENV
    from serving.launcher import ReplicaSet, free_port, uses_plugin

    port = port if port is not None else free_port()
    say(f"starting {config.name} on port {port} (stopped when calibration ends)")
    # A replica with the plug-in times its own steps: the fit then sees them without the
    # request overhead that timing from outside adds (serving/engine_site/step_log.py).
    steps = state_dir / f"{config.name}-{port}.steps.jsonl" if uses_plugin(config) else None
    if steps is not None:
        state_dir.mkdir(parents=True, exist_ok=True)
        steps.unlink(missing_ok=True)
    with ReplicaSet(state_dir).running(
        config,
        str(config_path),
        port,
        timeout_s=timeout_s,
        extra_env={STEP_LOG_ENV: str(steps.resolve())} if steps else None,
    ) as started:
        return measure(started[0].base_url, config, plan, seed, say, steps)
