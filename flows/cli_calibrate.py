"""`nightshift calibrate`: fit the step-latency model to a real replica and save it as JSON.

Parses the options and prints the fit; the sweep is `serving.calibration_run` (a running replica,
`--replica-url`, or one started from the engine config for the length of the sweep). It prints how
well the fitted model reproduces the measured steps. The saved file is
what `nightshift simulate --latency-model` and the SLO controller read; the measured steps go
beside it (FIT.samples.jsonl), and `--refit` fits such a file again without any replica.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from flows.cli_engine import fail, load_config_or_exit

if TYPE_CHECKING:
    from serving.calibration import CalibrationResult
    from serving.calibration_plan import SweepPlan
    from serving.engine_config import EngineConfig

COEFFICIENT_HELP = {
    "s_per_token": "a: matmul s per scheduled token",
    "s_weight_read": "b: s to stream the weights once",
    "s_per_attention_unit": "c: s per prefill attention unit C·(p + C/2)",
    "s_per_context_token": "d: s per decode-context token",
    "overhead_s": "e: fixed s per step",
    "s_per_chunk_prefix_token": "f: s per prefix token of each prefill chunk",
    "s_per_decode_seq": "g: s per decode sequence",
}


def register(app: typer.Typer) -> None:
    app.command("calibrate")(calibrate_command)


def calibrate_command(
    out: Annotated[Path, typer.Option(help="Where to write the fitted model (JSON).")],
    engine_config: Annotated[
        Path | None,
        typer.Option(
            help="Engine config YAML of the replica (with --refit: optional, gives GPU configs "
            "their roofline prior)."
        ),
    ] = None,
    refit: Annotated[
        Path | None,
        typer.Option(
            help="Fit the steps a calibration saved (FIT.samples.jsonl, or its FIT.json) "
            "instead of measuring a replica."
        ),
    ] = None,
    replica_url: Annotated[
        str | None,
        typer.Option(
            help="Measure this running replica (otherwise idle: other traffic shares its steps) "
            "instead of starting one from the config."
        ),
    ] = None,
    quick: Annotated[
        bool, typer.Option(help="A small sweep (~10 s on cpu-tiny), for tests.")
    ] = False,
    port: Annotated[
        int | None,
        typer.Option(help="Port of the started replica (default: first free from 8000)."),
    ] = None,
    repeats: Annotated[
        int | None,
        typer.Option(
            min=1, help="Runs of every shape (default 3, --quick 4); more on a busy host."
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the random prompts.")] = 0,
    state_dir: Annotated[
        Path, typer.Option(help="Replica logs and state of the started replica.")
    ] = Path("results/engines"),
    start_timeout: Annotated[float, typer.Option(help="Seconds to wait for the replica.")] = 300.0,
) -> None:
    """Time engine steps across decode batches, contexts and prefill positions; fit and save."""
    from serving.calibration import save
    from serving.calibration_plan import CalibrationError
    from serving.calibration_run import measure, sweep_plan

    if out.name.endswith(".samples.jsonl"):
        raise fail(f"--out {out}: name the model's JSON file (FIT.json); its steps go beside it")
    if refit is not None:
        if replica_url is not None or quick or repeats is not None:
            raise fail("--refit fits saved steps without a replica: drop --replica-url, "
                       "--quick and --repeats")  # fmt: skip
        return _refit(refit, out, engine_config)
    if engine_config is None:
        raise fail("pass --engine-config CONFIG to measure a replica, or --refit SAMPLES to fit "
                   "saved steps")  # fmt: skip
    config = load_config_or_exit(engine_config)
    try:
        plan = sweep_plan(config, quick, repeats)
        _echo_plan(plan)
        if replica_url is not None:
            _check_replica(replica_url, config.model.served_name)
            result = measure(replica_url, config, plan, seed, _say)
        else:
            result = _measure_own_replica(
                config, engine_config, plan, seed, port, state_dir, start_timeout
            )
    except CalibrationError as exc:
        raise fail(str(exc)) from None
    provenance = {
        "engine_config": config.name,
        "engine_config_path": str(engine_config),
        "replica": replica_url or "started by calibrate",
        "sweep": {"name": "quick" if quick else "full", **dataclasses.asdict(plan.sweep)},
    }
    save(result, out, provenance)
    _echo_result(config.name, result)
    _echo_written(out)


def _refit(samples: Path, out: Path, engine_config: Path | None) -> None:
    """Fit saved steps, with the config's prior when one is named, and save like a calibration."""
    from serving.calibration import refit, save
    from serving.calibration_run import prior

    config = load_config_or_exit(engine_config) if engine_config is not None else None
    try:
        result = refit(samples, prior(config) if config is not None else None)
    except ValueError as exc:
        raise fail(str(exc)) from None
    provenance = {"refit_from": str(samples)}
    if config is not None:
        provenance |= {"engine_config": config.name, "engine_config_path": str(engine_config)}
    save(result, out, provenance)
    _echo_result(config.name if config else samples.name, result)
    _echo_written(out)


def _measure_own_replica(
    config: EngineConfig,
    config_path: Path,
    plan: SweepPlan,
    seed: int,
    port: int | None,
    state_dir: Path,
    timeout_s: float,
) -> CalibrationResult:
    from serving.calibration_run import measure_own_replica
    from serving.launcher import EngineStartError, NoFreePort
    from serving.paths import SetupError

    try:
        return measure_own_replica(
            config, config_path, plan, seed, port, state_dir, timeout_s, _say
        )
    except (SetupError, EngineStartError, NoFreePort) as exc:
        raise fail(str(exc)) from None


def _say(line: str) -> None:
    typer.echo(line, err=True)


def _check_replica(url: str, served_name: str) -> None:
    """Fail early, and say how to fix it, when the URL answers nothing or serves another model."""
    from flows.replicas import ReplicaUnreachable, check_replica

    try:
        check_replica(url, served_name)
    except ReplicaUnreachable as exc:
        raise fail(str(exc)) from None


def _echo_written(out: Path) -> None:
    from serving.step_samples import samples_path

    typer.echo(f"wrote {out} and its steps, {samples_path(out)}")


def _echo_plan(plan: SweepPlan) -> None:
    chunks = sum(len(g.sizes) for g in plan.chunks)
    typer.echo(
        f"sweep: {len(plan.decode)} decode shapes and {chunks} chunk shapes "
        f"({len(plan.chunks)} prefix groups), {plan.sweep.repeats} runs each",
        err=True,
    )
    for note in plan.skipped:
        typer.echo(f"  skipped {note}", err=True)


def _echo_result(name: str, result: CalibrationResult) -> None:
    r, load = result.report, result.host_load
    steps = r.samples + len(result.stalled)
    if load:
        typer.echo(
            f"{name}: {steps} engine steps timed in {result.wall_s:.0f} s (host load "
            f"{load['before']:.1f} -> {load['after']:.1f} on {load['cpus']} CPUs); "
            f"fitted to {r.samples}"
        )
    else:
        typer.echo(f"{name}: {steps} saved engine steps; fitted to {r.samples}")
    typer.echo(
        f"fit error: mean {r.mean_abs_pct_error:.1f}%  p90 {r.p90_abs_pct_error:.1f}%  "
        f"max {r.max_abs_pct_error:.1f}%  R² {r.r2:.3f}"
    )
    typer.echo("coefficients:")
    for key, value in result.model.coefficients().items():
        typer.echo(f"  {key:<24} {value:.4g}   {COEFFICIENT_HELP[key]}")
    for note in result.notes:
        typer.echo(f"note: {note}")
    if load and max(load["before"], load["after"]) > (load["cpus"] or 1):
        typer.secho(
            "warning: the host was busier than its CPU count; measured steps include time "
            "other processes took. Rerun on a quieter host for a cleaner fit.",
            err=True,
            fg="yellow",
        )
