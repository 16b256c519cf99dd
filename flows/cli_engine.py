"""`nightshift engine up|status|down` and `nightshift model build`: replicas from engine configs."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import typer

from serving.paths import DEFAULT_PORT

engine_app = typer.Typer(
    help="Start, inspect and stop vLLM replicas from engine configs.", no_args_is_help=True
)
model_app = typer.Typer(
    help="Build the local models the embedded default engines serve.", no_args_is_help=True
)

StateDir = typer.Option(
    Path("results/engines"),
    "--state-dir",
    help="Where replica logs and the list of running replicas live.",
)


def register(app: typer.Typer) -> None:
    app.add_typer(engine_app, name="engine")
    app.add_typer(model_app, name="model")


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print `message` to stderr and return the Exit to raise."""
    typer.secho(message, err=True, fg="red")
    return typer.Exit(code)


def slo_from_options(itl_ms: float | None, ttft_ms: float | None, e2e_ms: float | None):
    """The SLO the three latency options give (defaults for those left out), or an exit naming
    the option the SLO model refused: checked before a command starts anything."""
    from pydantic import ValidationError

    from scheduler.slo import SLO

    given = {"chat_itl_p99_ms": ("--itl-slo-ms", itl_ms),
             "chat_ttft_p99_ms": ("--ttft-slo-ms", ttft_ms),
             "chat_e2e_p99_ms": ("--e2e-slo-ms", e2e_ms)}  # fmt: skip
    try:
        return SLO(**{field: ms for field, (_, ms) in given.items() if ms is not None})
    except ValidationError as exc:  # the SLO model holds the rule; the error names the option
        option, ms = given[exc.errors()[0]["loc"][0]]
        raise fail(f"{option} {ms:g}: give the p99 latency in milliseconds, above 0") from None


def load_config_or_exit(path: Path):
    from serving.engine_config import EngineConfigError, load_engine_config

    try:
        return load_engine_config(path)
    except EngineConfigError as exc:
        raise fail(str(exc)) from None


@engine_app.command("up")
def up(
    config_arg: Path = typer.Argument(
        None, metavar="[CONFIG]", help="The engine config, as --engine-config (older spelling)."
    ),
    engine_config: Path = typer.Option(
        None, help="Engine config YAML, e.g. engine_configs/cpu-tiny.yaml"
    ),
    port: int = typer.Option(
        DEFAULT_PORT, help="Port of the first replica; further replicas count up."
    ),
    replicas: int = typer.Option(1, min=1, help="How many replicas to start."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    timeout: float = typer.Option(300.0, help="Seconds to wait for /health."),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the engine command line and exit."
    ),
    state_dir: Path = StateDir,
) -> None:
    """Start replicas and wait until every one answers /health."""
    from serving.engine_config import EngineConfigError
    from serving.launcher import (
        EngineStartError,
        ReplicaSet,
        engine_argv,
        engine_env,
        model_location,
    )
    from serving.paths import SetupError
    from serving.vllm_flags_check import check_vllm_flags

    config_path = _one_config(engine_config, config_arg)
    config = load_config_or_exit(config_path)
    try:
        model_location(config)  # a model not built yet is named before vLLM is imported to check
        check_vllm_flags(config, config_path)  # vLLM's own parser, before anything starts
        if dry_run:
            for i in range(replicas):
                env = " ".join(f"{k}={shlex.quote(v)}" for k, v in engine_env(config, {}).items())
                typer.echo(f"{env} {shlex.join(engine_argv(config, port + i, host))}".strip())
            return
        started = ReplicaSet(state_dir).up(config, str(config_path), port, replicas, host, timeout)
    except (SetupError, EngineStartError, EngineConfigError) as exc:
        raise fail(str(exc)) from None
    for r in started:
        typer.echo(f"{r.name}  {r.base_url}  pid {r.pid}  log {r.log}")


def _one_config(option: Path | None, positional: Path | None) -> Path:
    """`--engine-config PATH`, or the config given positionally as before; exactly one."""
    if option is not None and positional is not None and option != positional:
        raise fail(
            f"two engine configs given ({positional} and --engine-config {option}): keep one"
        )
    path = option or positional
    if path is None:
        raise fail("give the engine config: --engine-config engine_configs/cpu-tiny.yaml")
    return path


@engine_app.command("status")
def status(state_dir: Path = StateDir) -> None:
    """List recorded replicas and whether each is healthy, starting or dead."""
    from rich.console import Console
    from rich.table import Table

    from serving.engine_control import ControlTarget, read_status
    from serving.launcher import ReplicaSet

    rows = ReplicaSet(state_dir).status()
    if not rows:
        typer.echo("no replicas recorded")
        return
    table = Table("replica", "url", "model", "pid", "state", "log")
    lines = []
    for r, state in rows:
        table.add_row(r.name, r.base_url, r.served_model, str(r.pid), state, r.log)
        doc = read_status(ControlTarget(r.name, folder=r.control_dir))
        if doc is not None:
            lines.append(plugin_line(r.name, doc))
    Console().print(table)
    for line in lines:
        typer.echo(line)


def plugin_line(name: str, doc: dict) -> str:
    """One replica's engine plug-in, as `engine status` shows it: what it applies, and its last
    status interval (about a second): steps (and how many ran at the target: the target held a
    batch prefill back), their measured and predicted time and the scale the plug-in prices its
    model with here (`scheduler/step_scale.py`; 1 under a controller, which corrects it), batch
    prefill tokens per step that carried batch, and chat's own ITL p99 since the engine started."""
    from serving.metrics import histogram_quantile
    from serving.plugin_sensor import status_histogram

    recent = doc.get("recent", {})

    def ms(v) -> str:
        return "-" if v is None else f"{v:.1f} ms"

    target, mean = doc.get("batch_step_target_ms"), doc.get("mean_step_target_ms")
    applies = doc.get("state", "?") + ("" if target is None else f", target {target:g} ms")
    applies += "" if mean is None else f", mean {mean:g} ms"
    p99 = histogram_quantile(status_histogram(doc, "chat_itl_seconds"), 0.99)
    cache = doc.get("chat_cache_tokens")
    scale = doc.get("model_scale")
    return (
        f"{name}: plug-in {applies} (seq {doc.get('control_seq')}, {doc.get('rejected', 0)} "
        f"rejected); last interval {recent.get('steps', 0)} steps "
        f"({recent.get('target_bound_steps', 0)} at the target), "
        f"mean {ms(recent.get('mean_step_ms'))}"
        f" (predicted {ms(recent.get('mean_predicted_ms'))}"
        + ("" if scale is None else f", model x{scale:.2f} here")
        + "), batch "
        f"{recent.get('batch_prefill_tokens_per_batch_step', 0):.0f} tokens per batch step; "
        f"chat ITL p99 {ms(None if p99 is None else 1000 * p99)} since start"
        + ("" if cache is None else f"; chat's cached histories {cache} tokens")
    )


@engine_app.command("down")
def down(
    names: list[str] = typer.Argument(None, help="Replica names to stop; all when omitted."),
    state_dir: Path = StateDir,
) -> None:
    """Stop replicas: their whole process group, nothing left behind."""
    from serving.launcher import ReplicaSet

    stopped = ReplicaSet(state_dir).down(names or None)
    typer.echo(f"stopped {len(stopped)} replica(s)" + "".join(f"\n  {r.name}" for r in stopped))


@model_app.command("build")
def build(
    names: list[str] = typer.Argument(..., help="Local model names: tiny, small."),
    force: bool = typer.Option(False, help="Rebuild even when an identical build exists."),
) -> None:
    """Build local models into the cache (runs in the engine environment, which has torch)."""
    from serving.local_models import RECIPES
    from serving.paths import SetupError, engine_python

    unknown = [n for n in names if n not in RECIPES]
    if unknown:
        raise fail(f"unknown local model {unknown[0]!r}; known: {', '.join(sorted(RECIPES))}")
    try:
        python = engine_python()
    except SetupError as exc:
        raise fail(str(exc)) from None
    cmd = [
        str(python),
        "-m",
        "serving.local_models",
        "build",
        *names,
        *(["--force"] if force else []),
    ]
    sys.exit(subprocess.call(cmd))


@engine_app.command("budget")
def budget(
    replica: str = typer.Argument(..., help="A replica's name (see `engine status`) or its URL."),
    target_ms: float = typer.Option(
        None, "--target-ms", min=0, help="Batch step target: the step time batch chunks fit."
    ),
    pause: bool = typer.Option(False, "--pause", help="Stop batch prefill; chat goes on."),
    ttl_s: float = typer.Option(
        3600.0, "--ttl-s", min=1, help="Seconds until the plug-in pauses batch unless renewed."
    ),
    min_chunk_tokens: int = typer.Option(0, min=0, help="Smallest batch chunk worth a step."),
    latency_model: Path = typer.Option(
        None, help="Latency fit to price chunks with; default: the replica config's fit."
    ),
    api_key: str = typer.Option(
        None, envvar="NIGHTSHIFT_REPLICA_API_KEY", help="The replica's API key (remote replicas)."
    ),
    state_dir: Path = StateDir,
) -> None:
    """Set a replica's batch step budget by hand (what the controller does every interval)."""
    from serving import engine_control
    from serving.replica_targets import ReplicaLookupError, resolve_target

    if (target_ms is None) == (not pause):
        raise fail("give exactly one of --target-ms X or --pause")
    try:
        target, model = resolve_target(replica, state_dir, latency_model, api_key)
        doc = engine_control.decision_document(
            engine_control.next_seq(), target_ms or 0.0, model, ttl_s, pause, min_chunk_tokens
        )
        engine_control.send(target, doc)
    except (ReplicaLookupError, engine_control.ControlError, ValueError) as exc:
        raise fail(str(exc)) from None
    what = "batch prefill paused" if pause else f"batch step target {target_ms:g} ms"
    typer.echo(f"{target.name}: {what} (seq {doc.seq}, expires in {ttl_s:g} s)")


@engine_app.command("import-config")
def import_config(
    vllm_config: Path = typer.Argument(..., help="A `vllm serve --config` YAML file."),
    name: str = typer.Option(None, help="Replica class name; default: the file's stem."),
    out: Path = typer.Option(
        None, help="Engine config to write; default: engine_configs/<name>.yaml."
    ),
    kind: str = typer.Option("gpu", help="Hardware kind of the replicas: gpu or cpu."),
    gpu_type: str = typer.Option(None, help="GPU name in the planner's table, e.g. h100-sxm."),
    hourly_usd: float = typer.Option(0.0, min=0, help="Price of one replica-hour."),
    plugin: bool = typer.Option(
        True, help="Select the engine plug-in and priority scheduling (what nightshift steers)."
    ),
    force: bool = typer.Option(False, help="Overwrite OUT when it exists."),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the engine config and the engine command; write nothing."
    ),
) -> None:
    """Turn a team's `vllm serve --config` file into an engine config."""
    import yaml
    from pydantic import ValidationError

    from serving.engine_config import EngineConfig, describe_errors
    from serving.launcher import engine_argv
    from serving.paths import SetupError
    from serving.vllm_config_import import ImportConfigError, import_vllm_config

    if not vllm_config.is_file():
        raise fail(f"{vllm_config}: no such file")
    name = name or vllm_config.stem
    out = out or Path("engine_configs") / f"{name}.yaml"
    try:
        raw = yaml.safe_load(vllm_config.read_text())
        imported = import_vllm_config(raw, name, kind, gpu_type, hourly_usd, plugin)
        config = EngineConfig.model_validate(imported.config)
    except yaml.YAMLError as exc:
        raise fail(f"{vllm_config}: not valid YAML: {exc}") from None
    except ImportConfigError as exc:
        raise fail(f"{vllm_config}: {exc}") from None
    except ValidationError as exc:
        raise fail(describe_errors(vllm_config, exc)) from None
    text = (
        f"# Imported from {vllm_config.name} by `nightshift engine import-config`.\n"
        + yaml.safe_dump(
            config.model_dump(exclude_none=True, exclude_defaults=False), sort_keys=False
        )  # fmt: skip
    )
    for note in imported.notes:
        typer.secho(f"note: {note}", err=True)
    if dry_run:
        typer.echo(text)
        try:
            typer.echo(shlex.join(engine_argv(config, 8000)))
        except SetupError as exc:
            raise fail(str(exc)) from None
        return
    if out.exists() and not force:
        raise fail(f"{out} exists; pass --force to overwrite it or --out another path")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    typer.echo(f"wrote {out}; check it with `nightshift engine up {out} --dry-run`")
