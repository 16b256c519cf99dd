"""`nightshift bench`: every admission policy side by side on the same replica, in one run."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import typer

from flows.cli_engine import fail, load_config_or_exit

RATE, DOCS, WINDOW_S = 1.5, 200, 15.0
"""Defaults of --rate, --docs and --window-s (a CPU replica's; `--sim` on a GPU profile has its own)."""


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
    warmup: float = typer.Option(30.0, help="Unmeasured seconds of mixed load first (real bench)."),
    json_out: Path = typer.Option(Path("results/bench.json"), "--json", help="OUT.json path."),
    rate: float = typer.Option(
        None, min=0, help="Chat requests per second (Poisson; default 1.5, 5 in --sim on a GPU)."
    ),
    latency_model: Path = typer.Option(
        None, help="Fitted latency model (default engine_configs/fits/<config name>.json)."
    ),
    docs: int = typer.Option(
        None,
        min=0,
        help="Documents in the benchmark corpus, more than any scenario finishes "
        "(default 200, 300 in --sim on a GPU).",
    ),
    min_tokens: int = typer.Option(2000, help="Shortest document."),
    max_tokens: int = typer.Option(12000, help="Longest document."),
    slo_factor: float = typer.Option(3.0, help="SLO = this × the chat-only p99s, unless given."),
    itl_slo_ms: float = typer.Option(None, help="Fixed chat ITL p99 SLO (with --ttft-slo-ms)."),
    ttft_slo_ms: float = typer.Option(
        None, help="Fixed chat TTFT p99 SLO; alone, the ITL SLO still derives from chat-only."
    ),
    window_s: float = typer.Option(
        None, min=1, help="SLO window in seconds (default 15, 60 in --sim on a GPU)."
    ),
    scale: float = typer.Option(None, help="Chat token sizes × this (default 0.1 on a CPU)."),
    port: int = typer.Option(8600, help="Port of the replica the benchmark starts."),
    results: Path = typer.Option(Path("results"), help="Where runs and reports go."),
    seed: int = typer.Option(0, help="Seed of the chat load and the corpus."),
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
    """Run chat-only, uncontrolled, static-engine and static-budget (each the best of a sweep)
    and controlled back to back."""
    from bench.sim_scenarios import SCENARIOS

    config = load_config_or_exit(engine_config)
    chosen = tuple(s.strip() for s in scenarios.split(",") if s.strip())
    unknown = [s for s in chosen if s not in SCENARIOS]
    if unknown:
        raise fail(f"unknown scenario {unknown[0]!r}; choose from {', '.join(SCENARIOS)}")
    sweep = _parse_sweep(static_sweep)
    budgets = _parse_budgets(budget_sweep)
    if sim:
        from flows.cli_bench_sim import SimOptions, bench_sim

        return bench_sim(
            config,
            SimOptions(
                engine_config=engine_config,
                scenarios=chosen,
                duration=duration,
                json_out=json_out,
                rate=rate,
                latency_model=latency_model,
                docs=docs,
                doc_tokens=doc_tokens,
                min_tokens=min_tokens,
                max_tokens=max_tokens,
                slo_factor=slo_factor,
                itl_slo_ms=itl_slo_ms,
                ttft_slo_ms=ttft_slo_ms,
                window_s=window_s,
                scale=scale,
                results=results,
                seed=seed,
                static_sweep=sweep,
                budget_sweep=budgets,
                replicas=sim_replicas,
            ),
        )
    from bench.chat_load import ChatLoadSpec
    from bench.chat_sessions import ChatShape
    from bench.report import write
    from bench.scenarios import BenchConfig, bench_paths, run_scenarios
    from pipelines.config import PipelineConfig
    from pipelines.corpus_maker import CorpusSpec, make_corpus, write_corpus
    from scheduler.slo import SLO
    from serving.launcher import ReplicaSet
    from serving.tokenizer import tokenizer_for

    rate = RATE if rate is None else rate
    docs = DOCS if docs is None else docs
    window_s = WINDOW_S if window_s is None else window_s
    model_path = latency_model or Path("engine_configs/fits") / f"{config.name}.json"
    if not model_path.is_file():
        raise fail(
            f"no latency model at {model_path}: fit one with `nightshift calibrate "
            f"--engine-config {engine_config} --out {model_path}`"
        )
    if itl_slo_ms is not None and ttft_slo_ms is None:
        raise fail("--itl-slo-ms needs --ttft-slo-ms too (a TTFT SLO alone is allowed)")
    slo = None
    if itl_slo_ms is not None and ttft_slo_ms is not None:
        slo = SLO(chat_itl_p99_ms=itl_slo_ms, chat_ttft_p99_ms=ttft_slo_ms, window_s=window_s)
    factor = scale if scale is not None else (0.1 if config.hardware.kind == "cpu" else 1.0)
    tokenizer = tokenizer_for(config)
    cfg = BenchConfig(
        engine_config=str(engine_config),
        corpus="",
        latency_model=str(model_path),
        chat=ChatLoadSpec(shape=ChatShape().scaled(factor), rate=rate, seed=seed),
        scenarios=chosen,
        duration_s=duration,
        warmup_s=warmup,
        slo=slo,
        fixed_ttft_slo_ms=ttft_slo_ms if slo is None else None,
        slo_factor=slo_factor,
        window_s=window_s,
        results=str(results),
        **({"static_sweep": sweep} if sweep else {}),
        **({"budget_sweep": budgets} if budgets else {}),
        pipeline=PipelineConfig(
            max_model_len=int(config.flag("max-model-len", 32768)),
            ignore_eos=config.model.local_name is not None,
            section_summary_tokens=64,
            final_summary_tokens=96,
        ),
    )
    out_dir = bench_paths(results, cfg.bench_id)
    cfg.corpus = str(
        write_corpus(
            make_corpus(
                CorpusSpec(docs=docs, min_tokens=min_tokens, max_tokens=max_tokens, seed=seed),
                tokenizer,
            ),
            out_dir / "corpus.parquet",
        )
    )
    with ReplicaSet(results / "engines").running(config, str(engine_config), port) as started:
        replicas = [(r.name, r.base_url) for r in started]
        out = run_scenarios(cfg, replicas, config.model.served_name, tokenizer)
    out["bench_id"] = cfg.bench_id
    command = shlex.join(["nightshift", *sys.argv[1:]])
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(out, indent=2))
    _load(results, list(out["run_ids"].values()))
    md, page = write(out, out_dir, command)
    typer.echo(md.read_text())
    typer.echo(f"OUT.json: {json_out}\nreport: {page}")


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


def _load(results: Path, run_ids: list[str]) -> None:
    from warehouse.load import load_results

    load_results(results, run_ids)
