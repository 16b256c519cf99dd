"""`nightshift bench` on a real replica: the corpus, the replica and every scenario, one run.

Builds the benchmark's settings from the options, writes its corpus with the served tokenizer,
starts one replica from the engine config for the length of the run, runs the scenarios back to
back (bench/scenarios.py) and loads every scenario's run into the warehouse.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from bench.bench_options import RATE, WINDOW_S, BenchOptions, default_docs
from bench.chat_load import ChatLoadSpec
from bench.chat_sessions import ChatShape
from bench.scenarios import BenchConfig, bench_paths, job_sections, run_scenarios
from pipelines.config import PipelineConfig
from pipelines.corpus_maker import CorpusSpec, make_corpus, write_corpus
from scheduler.slo import SLO
from serving.engine_config import EngineConfig
from serving.launcher import ReplicaSet, free_port
from serving.replica_targets import fit_path
from serving.tokenizer import tokenizer_for
from warehouse.load import load_results

CPU_SCALE = 0.1
"""Chat token sizes × this on a CPU replica unless `--scale` says otherwise."""


class BenchInputError(ValueError):
    """Options the benchmark cannot run with; the message names the option and the fix."""


@dataclass(frozen=True)
class RealOptions(BenchOptions):
    """The options of a bench on a real replica; None means the CPU default (bench_options)."""

    warmup: float = 30.0
    port: int | None = None


def bench_config(config: EngineConfig, opts: RealOptions) -> BenchConfig:
    """The benchmark's settings: the options with their defaults filled in, checked."""
    model_path = opts.latency_model or fit_path(opts.engine_config, config)
    if not model_path.is_file():
        raise BenchInputError(
            f"no latency model at {model_path}: fit one with `nightshift calibrate "
            f"--engine-config {opts.engine_config} --out {model_path}`"
        )
    if opts.itl_slo_ms is not None and opts.ttft_slo_ms is None:
        raise BenchInputError("--itl-slo-ms needs --ttft-slo-ms too (a TTFT SLO alone is allowed)")
    window_s = WINDOW_S if opts.window_s is None else opts.window_s
    slo = None
    if opts.itl_slo_ms is not None and opts.ttft_slo_ms is not None:
        slo = SLO(
            chat_itl_p99_ms=opts.itl_slo_ms, chat_ttft_p99_ms=opts.ttft_slo_ms, window_s=window_s
        )
    scale = opts.scale if opts.scale is not None else (
        CPU_SCALE if config.hardware.kind == "cpu" else 1.0
    )  # fmt: skip
    rate = RATE if opts.rate is None else opts.rate
    pipeline = PipelineConfig(
        max_model_len=int(config.flag("max-model-len", 32768)),
        ignore_eos=config.model.local_name is not None,
        section_summary_tokens=64,
        final_summary_tokens=96,
    )
    try:
        pipeline = job_sections(pipeline, opts.section_tokens)
    except ValidationError as exc:  # checked before any replica starts, in the option's name
        why = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
        raise BenchInputError(f"--section-tokens {opts.section_tokens}: {why}") from None
    return BenchConfig(
        engine_config=str(opts.engine_config),
        corpus="",
        latency_model=str(model_path),
        chat=ChatLoadSpec(shape=ChatShape().scaled(scale), rate=rate, seed=opts.seed),
        scenarios=opts.scenarios,
        duration_s=opts.duration,
        warmup_s=opts.warmup,
        slo=slo,
        fixed_ttft_slo_ms=opts.ttft_slo_ms if slo is None else None,
        e2e_slo_ms=opts.e2e_slo_ms,
        slo_factor=opts.slo_factor,
        window_s=window_s,
        results=str(opts.results),
        **({"static_sweep": opts.static_sweep} if opts.static_sweep else {}),
        **({"budget_sweep": opts.budget_sweep} if opts.budget_sweep else {}),
        pipeline=pipeline,
    )


def run_real_bench(config: EngineConfig, opts: RealOptions) -> tuple[dict, Path]:
    """Run the benchmark; return OUT.json's content and the bench's folder (for its report)."""
    cfg = bench_config(config, opts)
    tokenizer = tokenizer_for(config)
    out_dir = bench_paths(opts.results, cfg.bench_id)
    docs = default_docs(opts.duration) if opts.docs is None else opts.docs
    spec = CorpusSpec(docs=docs, min_tokens=opts.min_tokens, max_tokens=opts.max_tokens,
                      seed=opts.seed)  # fmt: skip
    cfg.corpus = str(write_corpus(make_corpus(spec, tokenizer), out_dir / "corpus.parquet"))
    port = opts.port if opts.port is not None else free_port()
    engines = ReplicaSet(opts.results / "engines")
    with engines.running(config, str(opts.engine_config), port) as started:
        replicas = [(r.name, r.base_url) for r in started]
        out = run_scenarios(cfg, replicas, config.model.served_name, tokenizer)
    out["bench_id"] = cfg.bench_id
    load_results(opts.results, list(out["run_ids"].values()))
    return out, out_dir
