"""The side-by-side benchmark: every policy on the same replica, same chat load, same corpus.

Scenarios run back to back in one invocation, because this machine (and any shared one) is too
noisy for numbers taken at different times to be compared:

- `chat-only`: the chat load alone; its latency sets the baseline (and, unless given, the SLO).
- `uncontrolled`: stock engine scheduling, batch documents at full concurrency (policy `none`).
- `static-engine`: stock engine scheduling, fixed seats and map-reduce sections of a fixed size,
  what an operator can do without the plug-in (policy `static`): a small sweep, the best that
  holds the SLO chosen in hindsight.
- `static-budget`: the engine plug-in at a fixed batch step target and fixed seats (policy
  `budget`): a sweep, the best in hindsight.
- `controlled`: the Gate's SLO controller steering the plug-in (policy `slo`).

They run in that order whatever order they are asked in: a plug-in once steered stays steered
(its last document expires into a pause, never back to stock scheduling), so the scenarios that
need stock scheduling come first.

A derived SLO's ITL is no tighter than two full engine steps (`bench.verdicts.itl_floor_ms`),
priced as this host runs its steps: before the first steered scenario, a short steered run (the
step probe, as long as the warm-up) has the plug-in measure its steps against the latency fit,
and the floor is the fit's scaled by the median measured/modelled ratio of its batch steps. A fit
taken on another host set a floor the host's steps were far from: loose on a faster one, out of
reach on a slower.

Each scenario's batch requests carry its own prefix-cache salt (`salted`): the documents are the
same in every scenario, and none may find another's prefill cached. Each scenario is a run of its
own under `results/runs/`, with chat and batch records side by side, so the warehouse and the
report can compare them. Chat ITL is judged from the engine's side, scraped every second through
the scenario (serving/engine_itl.py says why): the plug-in's chat-only gaps where the replica runs
it, in every scenario (with no control document it only observes), else vLLM's histogram, which
counts batch sequences' gaps too. The client's streamed gaps are reported beside it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from bench.chat_load import ChatLoadSpec
from bench.chat_thread import ChatLoadThread
from bench.scoring import (
    batch_prompts,
    batch_throughput,
    chat_latency,
    window_verdicts,
)
from bench.verdicts import (
    MeasuredModel,
    engine_itl_floor_ms,
    measured_bound,
    measured_step_ratio,
    score_sweeps,
    slo_from_chat_only,
    summary,
    with_e2e,
)
from pipelines.config import PipelineConfig
from pipelines.job import JobSpec, run_job
from scheduler.records import RequestRecord
from scheduler.slo import SLO
from scheduler.step import StepTimeModel
from serving.engine_itl import EngineItlRecorder, HistogramSeries

SCENARIOS = ("chat-only", "uncontrolled", "static-engine", "static-budget", "controlled")
STEERED = ("static-budget", "controlled")
"""The scenarios that steer the plug-in; every other runs before them (module docstring)."""
PROBE_SEATS = 4
"""Documents in flight during the step probe: enough to keep a batch chunk in every step."""


@dataclass
class BenchConfig:
    """One benchmark invocation."""

    engine_config: str
    corpus: str
    latency_model: str
    chat: ChatLoadSpec
    scenarios: tuple[str, ...] = SCENARIOS
    duration_s: float = 90.0
    warmup_s: float = 30.0
    """Unmeasured seconds of chat plus uncontrolled batch before the first scenario: a fresh CPU
    engine runs its first tens of seconds of mixed load several times slower (new step shapes).
    The step probe before the first steered scenario runs as long; 0 skips both, and the ITL
    floor is then priced with the fit as it is."""
    slo: SLO | None = None
    """Fixed SLO; None derives it from the chat-only run (`slo_factor` × its p99s)."""
    fixed_ttft_slo_ms: float | None = None
    """With a derived SLO: a fixed TTFT target instead of `slo_factor` × chat-only's TTFT p99."""
    e2e_slo_ms: float | None = None
    """A chat E2E p99 target added to the SLO, given or derived: the controller defends it and
    every scenario is judged by it (None: E2E is reported, not judged)."""
    slo_factor: float = 3.0
    window_s: float = 15.0
    control_interval_s: float = 3.0
    """Seconds between the Gate's decisions. Each sees the engine's ITL over that span: at light
    chat load a 1 s span holds a few dozen gaps, so its p99 is one slow step and the controller
    cuts on noise; 3 s gives five decisions per 15 s SLO window on steadier readings."""
    static_sweep: tuple[tuple[int, int], ...] = ((1, 512), (2, 1024), (4, 2048))
    """Seats × section tokens of the static-engine sweep."""
    budget_sweep: tuple[tuple[int, float], ...] = ((4, 0.4), (8, 0.6), (16, 0.8))
    """Seats × batch step target (a share of the ITL SLO) of the static-budget sweep."""
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    results: str = "results"
    bench_id: str = field(default_factory=lambda: time.strftime("bench-%Y%m%d-%H%M%S"))


@dataclass
class ScenarioRun:
    """What one scenario produced."""

    name: str
    run_id: str
    t0: float
    t1: float
    chat: list[RequestRecord]
    batch_rows: list[dict]
    docs_done: int = 0
    engine_itl: HistogramSeries | None = None
    """The replicas' ITL histograms through the scenario; None judges ITL by the client's gaps."""


def run_scenarios(cfg: BenchConfig, replicas: list[tuple[str, str]], model: str, tokenizer) -> dict:
    """Run every scenario on `replicas` and return OUT.json's content."""
    runs: dict[str, ScenarioRun] = {}
    if cfg.warmup_s > 0:
        warm = replace(cfg, duration_s=cfg.warmup_s)
        _with_batch(warm, "warmup", replicas, model, tokenizer, SLO(), "none")
    baseline = _chat_only(cfg, replicas, model, tokenizer)
    fit_floor = floor = _itl_floor_ms(cfg)
    slo = _slo(cfg, baseline, floor)
    probe_ratio: float | None = None
    probe = cfg.slo is None and cfg.warmup_s > 0  # still to run before the first steered scenario
    if "chat-only" in cfg.scenarios:
        runs["chat-only"] = baseline
    sweeps: dict[str, dict[str, ScenarioRun]] = {}
    for name in (s for s in SCENARIOS if s in cfg.scenarios):
        if name in STEERED and probe:
            probe = False
            probe_ratio = _probe_step_ratio(cfg, replicas, model, tokenizer, slo, floor)
            if probe_ratio:  # the SLO every scenario is judged by, stock ones included
                floor = _itl_floor_ms(cfg, probe_ratio)
                slo = _slo(cfg, baseline, floor)
        if name == "uncontrolled":
            runs[name] = _with_batch(cfg, name, replicas, model, tokenizer, slo, "none")
        elif name == "static-engine":
            sweeps[name] = {
                f"{name}-{s}x{c}": _with_batch(
                    cfg,
                    f"{name}-{s}x{c}",
                    replicas,
                    model,
                    tokenizer,
                    slo,
                    "static",
                    (s, c),
                    pipeline=in_sections(cfg.pipeline, c),
                )  # fmt: skip
                for s, c in cfg.static_sweep
            }
        elif name == "static-budget":
            sweeps[name] = {}
            for seats, share in cfg.budget_sweep:
                ms = round(share * slo.chat_itl_p99_ms, 1)
                key = f"{name}-{seats}x{ms:g}ms"
                sweeps[name][key] = _with_batch(
                    cfg, key, replicas, model, tokenizer, slo, "budget", budget=(seats, ms)
                )
        elif name == "controlled":
            runs[name] = _with_batch(cfg, name, replicas, model, tokenizer, slo, "slo")
    scored = {name: score(run, slo) for name, run in runs.items()}
    sweep = score_sweeps(sweeps, runs, scored, lambda r: score(r, slo))
    run_ids = {n: r.run_id for n, r in {**runs, **sweep}.items()}
    record_judging_slo(cfg.results, run_ids.values(), slo)
    out = {
        "scenarios": scored,
        "slo": slo.model_dump(),
        "slo_basis": {
            "given": cfg.slo is not None,
            "chat_only_factor": cfg.slo_factor,
            "itl_floor_ms": floor,
            "itl_floor_ms_fit": fit_floor,
            "floor_step_ratio": probe_ratio,
            "fixed_ttft_ms": cfg.fixed_ttft_slo_ms,
            "e2e_ms": cfg.e2e_slo_ms,
        },
        "section_tokens": (
            cfg.pipeline.section_tokens if cfg.pipeline.mode == "map_reduce" else None
        ),
        "run_ids": run_ids,
    }
    out["summary"] = summarize(scored, cfg, runs.get("controlled") or baseline, slo)
    return out


def record_judging_slo(results: str | Path, run_ids: Iterable[str], slo: SLO) -> None:
    """Write into each scenario's `run.json` the SLO the bench judged it by. The stock scenarios
    run before the step probe prices the ITL floor, so their runs started under the fit's floor;
    kept, the warehouse's SLO reports would judge them by another SLO than OUT.json does."""
    from warehouse.run_files import read_meta, run_dir, write_meta

    for run_id in run_ids:
        directory = run_dir(results, run_id)
        write_meta(directory, replace(read_meta(directory), slo=slo.model_dump()))


def job_sections(pipeline: PipelineConfig, section_tokens: int | None) -> PipelineConfig:
    """The bench's job: documents whole (None), or in map-reduce sections of `section_tokens`
    for every scenario but static-engine, which sweeps its own (`in_sections`)."""
    return pipeline if section_tokens is None else in_sections(pipeline, section_tokens)


def in_sections(pipeline: PipelineConfig, section_tokens: int) -> PipelineConfig:
    """`pipeline` sending every document in map-reduce sections of `section_tokens`: what an
    operator without the engine plug-in does to bound a batch prompt (the static-engine sweep)."""
    return _with(pipeline, mode="map_reduce", section_tokens=section_tokens)


def salted(pipeline: PipelineConfig, run_id: str) -> PipelineConfig:
    """`pipeline` with batch prompts cached apart under `run_id`: every scenario sends the same
    documents to the same engine, and one that found an earlier scenario's prefill in the prefix
    cache would make tokens it never computed (as a night's new documents never would)."""
    return _with(pipeline, batch_cache_salt=run_id)


def _with(pipeline: PipelineConfig, **fields) -> PipelineConfig:
    """`pipeline` with `fields` changed, validated as a job's settings are."""
    return PipelineConfig.model_validate({**pipeline.model_dump(), **fields})


def derive_slo(
    chat_only: ScenarioRun, factor: float, window_s: float, itl_floor_ms: float = 0.0
) -> SLO:
    """The SLO for this CPU: `factor` × the p99s of chat alone, ITL no tighter than two full engine
    steps (written into OUT.json). Chat alone's ITL p99 on this host is a decode step or two and
    swings 2× between runs (3.9 to 13 ms); 3× its low end is under one full step, and which static
    caps hold such an SLO is then decided by the chat-only run's luck."""
    return slo_from_chat_only(
        chat_latency(chat_only.chat, _engine_quantiles(chat_only)), factor, window_s, itl_floor_ms
    )


def _slo(cfg: BenchConfig, chat_only: ScenarioRun, floor_ms: float) -> SLO:
    """The given SLO, or the one derived from chat alone with an ITL no tighter than `floor_ms`."""
    slo = cfg.slo or derive_slo(chat_only, cfg.slo_factor, cfg.window_s, floor_ms)
    if cfg.slo is None and cfg.fixed_ttft_slo_ms is not None:
        slo = slo.model_copy(update={"chat_ttft_p99_ms": cfg.fixed_ttft_slo_ms})
    return with_e2e(slo, cfg.e2e_slo_ms)


def _itl_floor_ms(cfg: BenchConfig, step_ratio: float = 1.0) -> float:
    """Two full engine steps, priced with the fit and every step `step_ratio` times as long."""
    from scheduler.latency_model import LatencyModel
    from serving.engine_config import load_engine_config

    engine = load_engine_config(cfg.engine_config)
    model = MeasuredModel(LatencyModel.from_json(cfg.latency_model), step_ratio)
    return engine_itl_floor_ms(model, engine.vllm)


def _probe_step_ratio(
    cfg: BenchConfig, replicas, model, tokenizer, slo: SLO, fit_floor_ms: float
) -> float | None:
    """The plug-in's median measured/modelled batch step time over `warmup_s` of chat and batch
    at a fixed target of one full step by the fit (chunks as full as stock's where the host is as
    fast as the fit says or faster); None where it priced no step."""
    probe = replace(cfg, duration_s=cfg.warmup_s)
    target = (PROBE_SEATS, fit_floor_ms / 2)
    run = _with_batch(probe, "step-probe", replicas, model, tokenizer, slo, "budget", budget=target)
    return measured_step_ratio(_engine_steps(cfg, run.run_id))


def score(run: ScenarioRun, slo: SLO) -> dict:
    engine = run.engine_itl
    verdicts = window_verdicts(
        run.chat,
        run.t0,
        run.t1,
        slo,
        engine_itl=(lambda a, b: engine.quantile_ms(a, b, 0.99)) if engine is not None else None,
    )
    chat = chat_latency(run.chat, _engine_quantiles(run), slo, run.t1 - run.t0)
    chat["slo_windows_met"] = sum(verdicts) / len(verdicts)
    batch = batch_throughput(run.batch_rows, run.t0, run.t1, slo, verdicts)
    return {"run_id": run.run_id, "chat": chat, "batch": {**batch, "docs_done": run.docs_done}}


def _engine_quantiles(run: ScenarioRun) -> dict[str, float | None] | None:
    if run.engine_itl is None:
        return None
    q = run.engine_itl.quantiles_ms(run.t0, run.t1)
    return q if q["p99"] is not None else None


def summarize(scored: dict, cfg: BenchConfig, controlled: ScenarioRun, slo: SLO) -> dict:
    from scheduler.latency_model import LatencyModel
    from serving.engine_config import load_engine_config

    engine = load_engine_config(cfg.engine_config)
    chunked = engine.flag("enable-chunked-prefill", True)
    prompts = batch_prompts(controlled.batch_rows)

    def bound_with(model: StepTimeModel) -> tuple[float, float, float, float]:
        return measured_bound(
            model,
            slo,
            controlled.chat,
            (controlled.t0, controlled.t1),
            prompts,
            int(engine.flag("max-num-batched-tokens", 2048)) if chunked else None,
            int(engine.flag("long-prefill-token-threshold", 0)),
            cfg.pipeline.max_model_len,
        )

    fit = LatencyModel.from_json(cfg.latency_model)
    bound, seqs, ctx, share = bound_with(fit)
    ratio = measured_step_ratio(_engine_steps(cfg, controlled.run_id))
    measured = (ratio, bound_with(MeasuredModel(fit, ratio))[0]) if ratio else None
    return summary(scored, slo, bound, seqs, ctx, share, _corpus_docs(cfg.corpus), measured)


def _engine_steps(cfg: BenchConfig, run_id: str) -> list[dict]:
    """The plug-in's status rows a scenario recorded (none where it wrote none)."""
    from warehouse.run_files import read_table, run_dir

    return read_table(run_dir(cfg.results, run_id), "engine_steps").to_pylist()


def _corpus_docs(corpus: str) -> int | None:
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(corpus).metadata.num_rows
    except (OSError, ValueError):
        return None


def _chat_only(cfg: BenchConfig, replicas, model, tokenizer) -> ScenarioRun:
    run_id = f"{cfg.bench_id}-chat-only"
    with _itl_recorder(cfg, replicas) as engine:
        t0 = time.time()
        chat = ChatLoadThread(replicas, model, tokenizer, _chat_spec(cfg), run_id).start().join()
    _write_chat_only(cfg, run_id, chat, engine.series)
    return ScenarioRun(
        "chat-only", run_id, t0, t0 + cfg.duration_s, chat.records, [], engine_itl=engine.series
    )


def _with_batch(
    cfg: BenchConfig,
    name: str,
    replicas,
    model,
    tokenizer,
    slo: SLO,
    policy: str,
    static_caps: tuple[int, int] = (1, 512),
    pipeline: PipelineConfig | None = None,
    budget: tuple[int, float] = (4, 40.0),
) -> ScenarioRun:
    from warehouse.run_files import read_table, write_table

    run_id = f"{cfg.bench_id}-{name}"
    chat = ChatLoadThread(replicas, model, tokenizer, _chat_spec(cfg), run_id, gate_run_id=run_id)
    started: list[float] = []

    def start_chat() -> None:  # once documents are ready: batch and chat start together
        started.append(time.time())
        chat.start()

    with _itl_recorder(cfg, replicas) as engine:
        job = run_job(
            JobSpec(
                corpus=cfg.corpus,
                engine_config=cfg.engine_config,
                replicas=replicas,
                run_id=run_id,
                results=cfg.results,
                engine_state_dir=str(Path(cfg.results) / "engines"),
                pipeline=salted(pipeline or cfg.pipeline, run_id),
                slo=slo,
                policy=policy,
                latency_model=cfg.latency_model,
                static_caps=static_caps,
                budget=budget,
                interval_s=cfg.control_interval_s,
                sensor=_gate_sensor(slo),
                show_progress=False,
                stop_after_s=cfg.duration_s,
                on_summarize_start=start_chat,
            )
        )
        if not started:
            raise RuntimeError(f"scenario {name}: no document to summarize in {cfg.corpus}")
        t0 = started[0]
        result = chat.join()
    run_dir = job.run_dir
    write_table(run_dir, "requests", [r.row() for r in result.records], run_id=run_id, part="chat")
    write_table(
        run_dir, "token_gaps", [_gap_row(g) for g in result.gaps], run_id=run_id, part="chat"
    )
    batch_rows = [r for r in read_table(run_dir, "requests").to_pylist() if r["class"] == "batch"]
    return ScenarioRun(
        name,
        run_id,
        t0,
        t0 + cfg.duration_s,
        result.records,
        batch_rows,
        job.docs_done,
        engine_itl=engine.series,
    )


def _itl_recorder(cfg: BenchConfig, replicas: list[tuple[str, str]]) -> EngineItlRecorder:
    """Chat's gaps as the engine saw them: the plug-in's status where it runs (read from the
    replica's control folder when the bench started it, else its status route)."""
    from serving.replica_targets import control_targets

    return EngineItlRecorder(
        replicas, plugin_status=control_targets(replicas, Path(cfg.results) / "engines")
    )


def _gate_sensor(slo: SLO) -> dict:
    """What the Gate reads: the statistics this bench judges, so the controller acts on the SLO's
    own verdict. ITL from the engine's histogram (see serving/engine_itl.py), TTFT from the chat
    client (the engine's TTFT mixes in batch prompts), both over a sliding SLO window."""
    return {"kind": "vllm", "report_ttft": False, "itl": "engine", "window_s": slo.window_s}


def _chat_spec(cfg: BenchConfig) -> ChatLoadSpec:
    return replace(cfg.chat, duration_s=cfg.duration_s)


def _gap_row(g) -> dict:
    return {"request_id": g.request_id, "idx": g.idx, "gap_s": g.gap_s, "t": g.t}


def _write_chat_only(cfg: BenchConfig, run_id: str, chat, engine_itl: HistogramSeries) -> None:
    from bench.chat_results import write_run
    from serving.engine_config import load_engine_config
    from warehouse.run_files import run_dir, write_table

    engine = load_engine_config(cfg.engine_config)
    directory = run_dir(cfg.results, run_id)
    write_run(
        directory,
        chat,
        engine_config=engine.name,
        hourly_usd=engine.hardware.hourly_usd,
        hardware_count=engine.hardware.count,
    )
    write_table(directory, "engine_itl", engine_itl.rows(run_id), run_id=run_id, part="engine")


def bench_paths(results: str | Path, bench_id: str) -> Path:
    return Path(results) / "bench" / bench_id
