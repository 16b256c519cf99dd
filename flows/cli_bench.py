"""`nightshift bench`: every admission policy side by side on the same replica, in one run."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer

from flows.cli_engine import fail, load_config_or_exit, slo_from_options
from flows.cli_options import write_json

OPTION_OF = {
    "duration_s": "--duration",
    "seed": "--seed",
    "replicas": "--replicas",
    "chat.rate": "--rate",
    "batch.docs": "--docs",
    "batch.doc_tokens": "--doc-tokens",
    "batch.section_tokens": "--section-tokens",
}
"""The `bench` option behind each simulator setting `--sim` fills, for validation errors."""


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)


def bench(
    engine_config: Path = typer.Option(..., help="Engine config of the replica to measure."),
    scenarios: str = typer.Option(
        "chat-only,uncontrolled,static-engine,static-budget,controlled",
        help="Comma-separated scenarios: chat-only; uncontrolled (policy none); static-engine "
        "(policy static, best of a sweep); static-budget (policy budget, best of a sweep); "
        "controlled (policy slo).",
    ),
    duration: float = typer.Option(90.0, help="Seconds per scenario."),
    warmup: float = typer.Option(
        30.0,
        help="Unmeasured seconds of mixed load first, and of the step probe that prices the SLO's "
        "ITL floor before the first steered scenario; 0 skips both (real bench).",
    ),
    json_out: Path = typer.Option(
        Path("results/bench.json"),
        "--json",
        help="OUT.json path (- for stdout); OUT.csv, one row per scenario, goes beside it.",
    ),
    rate: float = typer.Option(
        None, min=0, help="Chat requests per second (Poisson; default 1.5, 5 in --sim on a GPU)."
    ),
    latency_model: Path = typer.Option(
        None,
        help="Fitted latency model (default: the engine config's latency_fit, else "
        "fits/<config name>.json beside it).",
    ),
    docs: int = typer.Option(
        None,
        min=0,
        help="Documents in the benchmark corpus, more than any scenario finishes "
        "(default 2.5 per second of --duration, at least 200; 300 in --sim on a GPU).",
    ),
    min_tokens: int = typer.Option(2000, help="Shortest document."),
    max_tokens: int = typer.Option(12000, help="Longest document."),
    slo_factor: float = typer.Option(3.0, help="SLO = this × the chat-only p99s, unless given."),
    itl_slo_ms: float = typer.Option(None, help="Fixed chat ITL p99 SLO (with --ttft-slo-ms)."),
    ttft_slo_ms: float = typer.Option(
        None, help="Fixed chat TTFT p99 SLO; alone, the ITL SLO still derives from chat-only."
    ),
    e2e_slo_ms: float = typer.Option(
        None,
        help="Chat E2E p99 SLO, beside the ITL and TTFT ones, given or derived: the "
        "controller defends it and every scenario's windows are judged by it.",
    ),
    window_s: float = typer.Option(
        None, min=1, help="SLO window in seconds (default 15, 60 in --sim on a GPU)."
    ),
    scale: float = typer.Option(None, help="Chat token sizes × this (default 0.1 on a CPU)."),
    port: int = typer.Option(
        None, help="Port of the replica the benchmark starts (default: first free from 8000)."
    ),
    results: Path = typer.Option(Path("results"), help="Where runs and reports go."),
    seed: int = typer.Option(0, help="Seed of the chat load and the corpus."),
    section_tokens: int = typer.Option(
        None,
        min=1,
        help="The job's sections: uncontrolled, static-budget and controlled send documents in "
        "map-reduce sections of this many tokens (default: whole); static-engine sweeps its own.",
    ),
    static_sweep: str = typer.Option(
        None,
        help="Static caps to sweep, SEATSxCHUNK,... (default 1x512,2x1024,4x2048; in "
        "--sim on a GPU the grid of bench/controller_targets.py).",
    ),
    budget_sweep: str = typer.Option(
        None,
        help="Fixed budgets to sweep for static-budget, SEATSxSHARE,... where SHARE is the batch "
        "step target as a share of the ITL SLO (default 4x0.4,8x0.6,16x0.8; --sim: every seat "
        "count of 2,4,8 at 0.3,0.5,0.7).",
    ),
    sim: bool = typer.Option(
        False,
        "--sim",
        help="Run the scenarios on simulated replicas of the engine config: no "
        "engine, tokenizer or replica.",
    ),
    doc_tokens: int = typer.Option(
        None,
        min=1,
        help="--sim: tokens per document (default 80000 on a GPU, else the mean of "
        "--min-tokens and --max-tokens).",
    ),
    sim_replicas: int = typer.Option(
        1, "--replicas", min=1, help="--sim: simulated replicas behind one router."
    ),
) -> None:
    """Run chat-only, uncontrolled (policy none), static-engine (policy static) and
    static-budget (policy budget), each the best of a sweep, and controlled (policy slo) back to
    back."""
    from pydantic import ValidationError

    from bench.real_bench import BenchInputError, RealOptions, run_real_bench
    from bench.sim_bench import SimOptions, run_sim_bench
    from bench.sim_scenarios import SCENARIOS
    from pipelines.ray_session import stop_on_sigterm
    from serving.launcher import EngineStartError, NoFreePort
    from serving.paths import SetupError
    from simulator.config import explain

    slo_from_options(itl_slo_ms, ttft_slo_ms, e2e_slo_ms)  # each given target checked, by name
    stop_on_sigterm()  # a supervisor's stop ends the bench as Ctrl-C does
    config = load_config_or_exit(engine_config)
    chosen = tuple(s.strip() for s in scenarios.split(",") if s.strip())
    unknown = [s for s in chosen if s not in SCENARIOS]
    if unknown:
        raise fail(f"unknown scenario {unknown[0]!r}; choose from {', '.join(SCENARIOS)}")
    shared = dict(
        engine_config=engine_config, scenarios=chosen, duration=duration, results=results,
        seed=seed, rate=rate, latency_model=latency_model, docs=docs, min_tokens=min_tokens,
        max_tokens=max_tokens, slo_factor=slo_factor, itl_slo_ms=itl_slo_ms,
        ttft_slo_ms=ttft_slo_ms, e2e_slo_ms=e2e_slo_ms, window_s=window_s, scale=scale,
        section_tokens=section_tokens,
        static_sweep=_parse_sweep(static_sweep), budget_sweep=_parse_budgets(budget_sweep),
    )  # fmt: skip
    try:
        if sim:
            opts = SimOptions(json_out=json_out, doc_tokens=doc_tokens, replicas=sim_replicas,
                              **shared)  # fmt: skip
            out, out_dir, wall = run_sim_bench(config, opts, progress=_progress)
        else:
            out, out_dir = run_real_bench(config, RealOptions(warmup=warmup, port=port, **shared))
    except ValidationError as exc:
        raise fail(explain(exc, OPTION_OF)) from None
    except (BenchInputError, NoFreePort, EngineStartError, SetupError) as exc:
        raise fail(str(exc)) from None
    except (ValueError, OSError) as exc:  # profile, spec, planner, latency model, SLO errors
        raise fail(str(exc) or f"{type(exc).__name__} (no message)") from None
    _report(out, out_dir, json_out)
    if sim:
        typer.echo(f"simulated {len(out['run_ids'])} runs of {duration:g} s in {wall:.1f} s wall")


def _progress(line: str) -> None:
    typer.echo(line, err=True)


def _report(out: dict, out_dir: Path, json_out: Path) -> None:
    """OUT.json (and OUT.csv beside it), the bench's Markdown and HTML page, and where they are."""
    from bench.bench_table import write_csv
    from bench.report import write

    to_stdout = write_json(json_out, out)
    csv_path = write_csv(out, json_out)
    md, page = write(out, out_dir, shlex.join(["nightshift", *sys.argv[1:]]))
    typer.echo(md.read_text(), err=to_stdout)
    typer.echo(f"OUT.json: {json_out}\nOUT.csv: {csv_path}\nreport: {page}", err=to_stdout)


def _parse_sweep(text: str | None) -> tuple[tuple[int, int], ...] | None:
    """`1x512,2x1024` → ((1, 512), (2, 1024)); None when not given."""
    if text is None:
        return None
    caps = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        seats, _, chunk = item.partition("x")
        if not (seats.isdigit() and chunk.isdigit() and int(seats) >= 1 and int(chunk) >= 1):
            raise fail(
                f"--static-sweep {item!r}: write SEATSxCHUNK with positive whole numbers, "
                "e.g. 2x1024"
            )
        caps.append((int(seats), int(chunk)))
    if not caps:
        raise fail("--static-sweep is empty: give at least one SEATSxCHUNK, e.g. 2x1024")
    return tuple(caps)


def _parse_budgets(text: str | None) -> tuple[tuple[int, float], ...] | None:
    """`4x0.4,8x0.6` → ((4, 0.4), (8, 0.6)); None when not given."""
    if text is None:
        return None
    budgets = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        seats, _, share = item.partition("x")
        try:
            ok = seats.isdigit() and int(seats) >= 1 and 0 < float(share) <= 1
        except ValueError:
            ok = False
        if not ok:
            raise fail(
                f"--budget-sweep {item!r}: write SEATSxSHARE, seats a positive whole number and "
                "SHARE of the ITL SLO in (0, 1], e.g. 8x0.6"
            )
        budgets.append((int(seats), float(share)))
    if not budgets:
        raise fail("--budget-sweep is empty: give at least one SEATSxSHARE, e.g. 8x0.6")
    return tuple(budgets)
