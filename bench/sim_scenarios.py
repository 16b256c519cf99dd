"""The side-by-side benchmark in the simulator: `nightshift bench --sim`.

The real benchmark (bench/scenarios.py) needs a replica, a tokenizer and wall time, so it can only
measure the hardware at hand. This runs the same scenarios on simulated replicas of any engine
config, the 70B/2×H100 profile included, in virtual time:

- `chat-only`: the chat load alone (its p99s set the SLO unless one is given).
- `uncontrolled`: stock engine scheduling, the whole backlog at once, documents whole.
- `static-engine`: stock engine scheduling, fixed seats and map-reduce sections of a fixed size,
  what an operator can do without the plug-in: a sweep, the best that held the SLO in every
  window, chosen in hindsight.
- `static-budget`: the engine plug-in at a fixed batch step target and fixed seats, documents
  whole: a sweep, the best in hindsight.
- `controlled`: the SLO controller steering the plug-in, documents whole, one object for every
  replica, as the Gate runs it.

Every scenario shares the engine, the chat workload, the backlog and the seed; only the admission
policy differs. Chat is the same random stream in each, though a session's next turn follows its
answer, so a replica slowed by batch work also shifts later chat arrivals, as it would real users'. Scoring goes through bench/scoring.py
over the same record shapes the real bench scores (chat `RequestRecord`s with their token gaps,
batch request rows), so a simulated OUT.json reads exactly like a real one. Each scenario is written
as a run directory under `results/runs/`, as the real runs are, for the warehouse to load.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from bench.controller_targets import CHUNKS, SEATS
from bench.scoring import (
    batch_prompts,
    batch_throughput,
    chat_latency,
    window_verdicts,
)
from bench.verdicts import score_sweeps, sim_bound, slo_from_chat_only, summary, with_e2e
from scheduler.admission import AdmissionPolicy
from scheduler.budget_controller import BudgetControllerConfig
from scheduler.policy_factory import PolicyChoice, make_policy
from scheduler.records import RequestRecord, TokenGap
from scheduler.slo import SLO
from scheduler.step import StepTimeModel
from simulator.config import ChatWorkload, SimConfig
from simulator.run import SimResult, simulate

SCENARIOS = ("chat-only", "uncontrolled", "static-engine", "static-budget", "controlled")
CHAT_SIZES = ("system_prompt_tokens", "context_tokens", "user_tokens", "output_tokens")
"""Token sizes of the simulator's chat session that `--scale` multiplies."""
POLICIES = {
    "chat-only": "chat-only",
    "uncontrolled": "none",
    "static-engine": "static",
    "static-budget": "budget",
    "controlled": "slo",
}
SWEEPS = ("static-engine", "static-budget")
"""Scenarios scored as the best of a sweep, in hindsight."""
"""The runs table's policy of each scenario, as the real benchmark writes it."""


@dataclass(frozen=True)
class GpuDefaults:
    """Settings a GPU profile gets when the command line leaves them out: the load, SLO and
    static sweep of the 70B/2×H100 workload bench/controller_targets.py measures. CPU profiles
    take the real benchmark's defaults instead."""

    rate: float = 5.0
    """Chat requests per second."""
    window_s: float = 60.0
    """SLO window."""
    docs: int = 300
    """Backlog documents: more than any policy finishes in an hour, so none runs dry."""
    doc_tokens: int = 80_000
    """Tokens per document."""
    itl_slo_ms: float = 50.0
    """Chat ITL p99 SLO."""
    ttft_slo_ms: float = 1000.0
    """Chat TTFT p99 SLO."""
    static_sweep: tuple[tuple[int, int], ...] = tuple((s, c) for s in SEATS for c in CHUNKS)
    """Seats × section tokens of the static sweep."""


GPU = GpuDefaults()


@dataclass
class SimBench:
    """One `bench --sim` invocation: the simulated replicas, their load, and how to score them."""

    base: SimConfig
    """Engine, chat workload, backlog, control loop, duration and seed every scenario shares."""
    model: StepTimeModel
    """Step-time model of the replica: the profile's roofline, or a fit."""
    profile: str
    """Engine config name, written into OUT.json and the runs table."""
    scenarios: tuple[str, ...] = SCENARIOS
    """Scenarios to run; chat-only always runs, as the baseline."""
    slo: SLO | None = None
    """Fixed SLO; None derives it from the chat-only run (`slo_factor` × its p99s)."""
    slo_factor: float = 3.0
    """SLO = this × the chat-only p99s, when no SLO is given."""
    e2e_slo_ms: float | None = None
    """A chat E2E p99 target added to the SLO, given or derived (None: reported, not judged)."""
    section_tokens: int | None = None
    """The job's sections for every scenario but static-engine, which sweeps its own: map-reduce
    in sections of this many tokens; None sends each document whole."""
    window_s: float = 15.0
    """SLO window of a derived SLO."""
    static_sweep: tuple[tuple[int, int], ...] = ((1, 512), (2, 1024), (4, 2048))
    """Seats × section tokens of the static-engine sweep."""
    budget_sweep: tuple[tuple[int, float], ...] = tuple(
        (s, f) for s in (2, 4, 8) for f in (0.3, 0.5, 0.7)
    )
    """Seats × batch step target (as a share of the ITL SLO) of the static-budget sweep."""
    controller: BudgetControllerConfig = field(default_factory=BudgetControllerConfig)
    """Tuning of the SLO controller of `controlled`."""
    results: str = "results"
    """Where run directories go (`results/runs/<run_id>`)."""
    bench_id: str = field(default_factory=lambda: time.strftime("bench-sim-%Y%m%d-%H%M%S"))
    """Prefix of every run id of this invocation."""
    hardware_count: int = 1
    """Devices per replica, for the runs table's cost columns."""
    hourly_usd: float = 0.0
    """Price of one replica-hour, for the runs table's cost columns."""


@dataclass
class SimScenario:
    """What one simulated scenario produced, in the real bench's record shapes."""

    name: str
    run_id: str
    chat: list[RequestRecord]
    batch_rows: list[dict]
    docs_done: int


def chat_workload(rate: float, scale: float) -> ChatWorkload:
    """The simulator's chat session shape (shared system prompt, retrieved context, multi-turn) at
    `rate`, its token sizes × `scale`, as the real bench scales its chat shape on a CPU."""
    base = ChatWorkload()
    sizes = {k: max(1, round(getattr(base, k) * scale)) for k in CHAT_SIZES}
    return ChatWorkload(rate=rate, **sizes)


def run_sim_scenarios(bench: SimBench, progress: Callable[[str], None] | None = None) -> dict:
    """Simulate every scenario of `bench` and return OUT.json's content (the real bench's shape,
    plus `mode` and `profile`)."""
    say = progress or (lambda _line: None)
    baseline_result = simulate_scenario(
        bench, "chat-only", _policy(bench, "static", bench.slo or SLO()), bench.slo or SLO(), docs=0
    )
    baseline = scenario_records(baseline_result, "chat-only")
    derived = bench.slo or slo_from_chat_only(
        chat_latency(baseline.chat), bench.slo_factor, bench.window_s
    )
    slo = with_e2e(derived, bench.e2e_slo_ms)
    _write_run(bench, baseline_result, "chat-only", slo)
    say(_line("chat-only", baseline_result.summary))
    del baseline_result
    runs: dict[str, SimScenario] = {"chat-only": baseline} if "chat-only" in bench.scenarios else {}
    sweeps: dict[str, dict[str, SimScenario]] = {}
    job = ("whole", None) if bench.section_tokens is None else ("map", bench.section_tokens)
    for name in bench.scenarios:
        if name == "uncontrolled":
            runs[name] = _run(bench, name, name, _policy(bench, "none", slo), slo, say, job)
        elif name == "static-engine":
            sweeps[name] = {
                f"static-engine-{s}x{c}": _run(
                    bench,
                    f"static-engine-{s}x{c}",
                    name,
                    _policy(bench, "static", slo, s, chunk=c),
                    slo,
                    say,
                )  # fmt: skip
                for s, c in bench.static_sweep
            }
        elif name == "static-budget":
            sweeps[name] = {}
            for seats, share in bench.budget_sweep:
                ms = round(share * slo.chat_itl_p99_ms, 1)
                key = f"static-budget-{seats}x{ms:g}ms"
                fixed = _policy(bench, "budget", slo, seats, target_ms=ms)
                sweeps[name][key] = _run(bench, key, name, fixed, slo, say, job)
        elif name == "controlled":
            ctrl = _policy(bench, "slo", slo)
            runs[name] = _run(bench, name, name, ctrl, slo, say, job)
    return _out(bench, slo, baseline, runs, sweeps)


def _policy(
    bench: SimBench, name: str, slo: SLO, seats: int = 0, chunk: int = 1, target_ms: float = 0.0
) -> AdmissionPolicy:
    """The policy of a scenario, built as the Gate builds it for a real run."""
    choice = PolicyChoice(name, seats, chunk, target_ms)  # type: ignore[arg-type]
    slots = bench.base.engine.max_num_seqs
    return make_policy(choice, slo, bench.model, bench.controller, slots)


def _out(bench: SimBench, slo: SLO, baseline: SimScenario, runs: dict, sweeps: dict) -> dict:
    scored = {name: score(run, slo, bench.base.duration_s) for name, run in runs.items()}
    sweep = score_sweeps(sweeps, runs, scored, lambda r: score(r, slo, bench.base.duration_s))
    scored = {name: scored[name] for name in SCENARIOS if name in scored}
    controlled = runs.get("controlled") or baseline
    out = {
        "mode": "sim",
        "profile": bench.profile,
        "bench_id": bench.bench_id,
        "scenarios": scored,
        "slo": slo.model_dump(),
        "section_tokens": bench.section_tokens,
        "run_ids": {n: r.run_id for n, r in {"chat-only": baseline, **runs, **sweep}.items()},
    }
    out["summary"] = summarize(scored, bench, controlled, slo)
    return out


def score(run: SimScenario, slo: SLO, duration_s: float) -> dict:
    """The real bench's scenario figures; windows count from virtual time 0."""
    verdicts = window_verdicts(run.chat, 0.0, duration_s, slo)
    chat = chat_latency(run.chat, None, slo, duration_s)
    if "itl_source" in chat:
        # Simulated token times are the engine's step ends: no client in between to add noise.
        chat["itl_source"] = "simulator"
    chat["slo_windows_met"] = sum(verdicts) / len(verdicts)
    batch = batch_throughput(run.batch_rows, 0.0, duration_s, slo, verdicts)
    return {"run_id": run.run_id, "chat": chat, "batch": {**batch, "docs_done": run.docs_done}}


def summarize(scored: dict, bench: SimBench, controlled: SimScenario, slo: SLO) -> dict:
    """The real bench's summary; the bound comes from the replica's own step-time model."""
    prompts = batch_prompts(controlled.batch_rows)
    bound, seqs, ctx, share = sim_bound(bench.model, slo, controlled.chat, bench.base, prompts)
    return summary(scored, slo, bound, seqs, ctx, share, corpus_docs=bench.base.batch.docs)


def _run(
    bench: SimBench,
    name: str,
    scenario: str,
    policy: AdmissionPolicy,
    slo: SLO,
    say: Callable[[str], None],
    batch: tuple[str, int | None] = ("map", None),
) -> SimScenario:
    """One scenario, recorded as a run; `batch` is its documents' (mode, section tokens)."""
    result = simulate_scenario(bench, name, policy, slo, bench.base.batch.docs, *batch)
    _write_run(bench, result, scenario, slo)
    say(_line(name, result.summary))
    return scenario_records(result, name)


def simulate_scenario(
    bench: SimBench,
    name: str,
    policy: AdmissionPolicy,
    slo: SLO,
    docs: int,
    mode: str | None = None,
    section_tokens: int | None = None,
) -> SimResult:
    """Scenario `name` of `bench`: the shared settings under its own run id, the SLO in force and
    `docs` documents (whole or in sections: `mode` and `section_tokens`, default the base's),
    with `policy` deciding for every replica."""
    data = bench.base.model_dump()
    data["run_id"] = f"{bench.bench_id}-{name}"
    data["slo"] = slo.model_dump()
    data["batch"]["docs"] = docs
    if mode is not None:
        data["batch"]["mode"] = mode
    if section_tokens is not None:
        data["batch"]["section_tokens"] = section_tokens
    return simulate(SimConfig.model_validate(data), bench.model, lambda _replica: policy)


def scenario_records(result: SimResult, name: str) -> SimScenario:
    """The run's records as the real bench holds them: chat records carry their token gaps."""
    rec = result.sim.recorder
    chat: list[RequestRecord] = []
    batch: list[dict] = []
    for r, gaps, times in zip(rec.records, rec.gaps, rec.gap_times, strict=True):
        if r.cls == "batch":
            batch.append(r.row())
            continue
        pairs = zip(gaps.tolist(), times.tolist(), strict=True)
        chat.append(
            replace(r, gaps=[TokenGap(r.request_id, i, g, t) for i, (g, t) in enumerate(pairs)])
        )
    return SimScenario(name, rec.run_id, chat, batch, result.sim.dispatcher.docs_done)


def _write_run(bench: SimBench, result: SimResult, scenario: str, slo: SLO) -> None:
    """The scenario as a run directory the warehouse loads like a real run (virtual seconds)."""
    from bench.sim_records import write_sim_run
    from warehouse.run_files import run_dir

    directory = run_dir(bench.results, result.sim.cfg.run_id)
    write_sim_run(
        directory, result, bench.profile, POLICIES[scenario], bench.hardware_count,
        bench.hourly_usd, slo,
    )  # fmt: skip


def _line(name: str, summary: dict) -> str:
    """Progress: the simulator's own summary of a scenario, before scoring."""
    itl, batch = summary["chat"]["itl_ms"]["p99"], summary["batch"]
    return (
        f"{name}: chat ITL p99 {'-' if itl is None else f'{itl:.1f}'} ms, batch "
        f"{batch['tokens_per_s']:,.0f} tok/s, {batch['docs_done']} documents "
        f"({summary['wall_seconds']:.1f} s wall)"
    )
