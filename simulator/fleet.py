"""Fleet planning by simulation: what chat alone needs, and what that fleet adds for batch.

Three answers for one replica class and one chat load, each from the simulator's own replicas:

1. **Chat alone.** The fewest replicas, and the engine step budget (`max-num-batched-tokens`), that
   hold the chat SLO in at least `required_share` of its windows. Replica counts are tried in
   increasing order, so the first count that holds is the smallest. At each count the engine
   config's own budget is probed first and kept when it holds: the search changes the budget only
   when it must. Otherwise the budget is bisected over its logarithm, steered by the probe's
   window verdicts: a budget lengthens every step (ITL rises with it) and sets how much prompt a
   step prefills (TTFT falls with it), so the worse part says which way to move, and the search
   closes in on the budget where the two pressures are equal, where the worse of them is
   lowest. A probe that misses both parts proves the count too small (no budget fixes both), and
   the next count is tried at once. Of the probes that held, the one with the lowest pressure is
   chosen.
2. **The largest whole document** one replica of that fleet takes without preempting: its KV pool
   minus what chat held at its peak in the chosen chat-alone run, less the instruction and the
   summary the document's request also holds, and never more than `max_model_len` allows.
   Beside it, the largest the SLO controller admits, which stays under its KV high-water mark.
3. **Documents per night** the fleet adds at the SLO: the fleet is simulated with a backlog of
   whole documents under the SLO controller (the `slo` policy, one controller for every replica,
   as the Gate runs it), and the batch prompt tokens prefilled in windows that held the SLO are
   scaled from the simulated minutes to the night. Prefill counted per window, finished or not,
   keeps a run shorter than a document's prefill from counting its progress as nothing. The
   controller starts cold, so a short run understates a night.

Every run judges only the windows after a chat warm-up (`FleetSearch.warmup_minutes`), and batch
starts there. Invariants: every probe runs the same seed, chat workload and engine except the
budget and the replica count, so probes differ only by what the search changes; pressure is a
part's window p99 over its SLO in the window that ranks at `required_share` from the best, so a
pressure at or below 1 means exactly that this part alone held in enough windows. The search
assumes each part is monotone in the budget (the mechanism above); where one is not, the
bisection may miss a budget that holds. A run judges `minutes` worth of windows, so a miss rarer
than one window in that many goes unseen: longer runs give firmer answers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from scheduler.budget_controller import BudgetControllerConfig
from scheduler.policy_factory import PolicyChoice, make_policy
from scheduler.step import PrefillChunk, StepBatch, StepTimeModel
from simulator.config import EngineParams, SimConfig
from simulator.run import SimResult, simulate
from simulator.summary import WindowVerdicts
from simulator.trace import TraceRow

BUDGET_GRANULARITY = 16
"""Budgets are probed in multiples of one GPU KV block."""
PROBE_DRAIN_S = 30.0
"""Longest a probe waits for chat in flight after its run: a replica count that queues chat fails
its windows whether the queue drains or not, and draining a long queue costs the most time."""


class FleetError(ValueError):
    """Settings a fleet search cannot run with; the message names the setting and the fix."""


@dataclass(frozen=True)
class FleetSearch:
    """One fleet question: a replica class, its chat load and SLO, and how hard to look."""

    base: SimConfig
    """Engine (its budget is the search's starting point), chat workload, control loop, SLO and
    seed; the search sets replicas, duration, budget and backlog."""
    model: StepTimeModel
    """Step-time model of one replica (a fit, or the roofline prior)."""
    controller: BudgetControllerConfig = field(default_factory=BudgetControllerConfig)
    """Tuning of the SLO controller in the batch run (the engine config's `controller:`)."""
    trace: list[TraceRow] | None = None
    """Replayed chat, when the load is a trace rather than `base.chat.rate`."""
    minutes: float = 3.0
    """Simulated minutes judged in every run: each probe and the batch run."""
    warmup_minutes: float = 2.0
    """Simulated minutes before the judged ones, never judged. Chat sessions are all born during
    the run, and multi-turn sessions (4 turns about 20 s apart by default) take about two minutes
    to bring the load up to its rate; judged earlier, a fleet would be planned for less chat than
    it gets. Batch starts after it, as a night starts beside chat already running. 0 for a
    trace, which is the load from its first row."""
    max_replicas: int = 8
    """Largest replica count tried before giving up."""
    probes_per_count: int = 4
    """Most budget probes at one replica count (the configured budget, then bisection steps)."""
    budget_span: float = 4.0
    """Budgets are searched within the configured budget ÷ and × this."""
    required_share: float = 0.99
    """Share of SLO windows that must hold."""
    doc_tokens: int = 80_000
    """Tokens of one backlog document."""
    night_hours: float = 8.0
    """Length of the night the batch run is scaled to."""

    def __post_init__(self) -> None:
        problems = []
        if self.minutes <= 0 or self.warmup_minutes < 0:
            problems.append(
                f"minutes {self.minutes}, warm-up {self.warmup_minutes}: judge at least a "
                "fraction of a minute, after a warm-up of 0 or more"
            )
        if self.max_replicas < 1:
            problems.append(f"max replicas {self.max_replicas}: must be >= 1")
        if self.probes_per_count < 1:
            problems.append(f"probes per count {self.probes_per_count}: must be >= 1")
        if self.budget_span < 1:
            problems.append(f"budget span {self.budget_span}: must be >= 1")
        if not 0 < self.required_share <= 1:
            problems.append(f"required share {self.required_share}: must be in (0, 1]")
        if self.doc_tokens < 1 or self.night_hours <= 0:
            problems.append("doc tokens and night hours must be positive")
        if self.base.chat.rate <= 0 and not self.trace and not self.base.chat.trace:
            problems.append("no chat load: give a chat rate above 0 or a trace")
        if problems:
            raise FleetError("; ".join(problems))


@dataclass(frozen=True)
class Probe:
    """One simulated chat-alone run at a replica count and a budget, and its verdict."""

    replicas: int
    budget: int
    windows_met: float
    """Share of SLO windows where every part held."""
    itl_pressure: float
    """Chat ITL p99 over its SLO in the window ranked at `required_share` (`part_pressure`)."""
    ttft_pressure: float
    """Chat TTFT p99 over its SLO, likewise."""
    verdict: str
    """`holds`; `smaller` or `larger` (the way the worse part asks the budget to move); or
    `no-budget` (both parts missed: no budget holds at this count)."""
    kv_peak_tokens: int
    """Most KV one replica held (chat alone), in tokens."""
    wall_s: float

    @property
    def pressure(self) -> float:
        return max(self.itl_pressure, self.ttft_pressure)


@dataclass(frozen=True)
class DocumentFit:
    """The largest whole document one replica takes beside chat at its peak (answer 2)."""

    kv_capacity_tokens: int
    chat_peak_tokens: int
    request_extra_tokens: int
    """Instruction and summary tokens the document's request holds besides the document."""
    max_model_len: int
    largest_doc_tokens: int
    """Without preempting: KV left by chat's peak, less the extras, within max_model_len."""
    limited_by: str
    """`kv` or `max-model-len`: which bound set `largest_doc_tokens`."""
    kv_high_water: float
    largest_admitted_doc_tokens: int
    """The largest the SLO controller admits while chat is at its peak (under its high water)."""


@dataclass(frozen=True)
class BatchRun:
    """What the fleet added under the SLO controller, scaled to the night (answer 3)."""

    docs: int
    """Backlog documents, more than the fleet can finish in the run."""
    windows_met: float
    itl_windows_met: float
    ttft_windows_met: float
    slo_held: bool
    docs_done: int
    preemptions: int
    prefill_tokens_per_s: float
    """Batch prompt tokens prefilled per second, all windows."""
    slo_prefill_tokens_per_s: float
    """The same, counting only windows that held the SLO."""
    docs_per_night: float
    """`slo_prefill_tokens_per_s` × the night ÷ a document's prompt."""
    chat_itl_p99_ms: float | None
    chat_ttft_p99_ms: float | None
    wall_s: float


@dataclass
class FleetPlan:
    """The three answers, and every probe that led to them."""

    replicas: int | None
    budget: int | None
    probes: list[Probe]
    document: DocumentFit | None = None
    batch: BatchRun | None = None
    sim_minutes: float = 0.0
    warmup_minutes: float = 0.0
    windows_required: float = 0.99
    night_hours: float = 0.0
    doc_tokens: int = 0
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def budget_engine(engine: EngineParams, budget: int) -> EngineParams:
    """`engine` with step budget `budget`. A per-request prefill cap that was the whole budget (or
    more) stays the whole budget, so one chat prompt may still fill a step; a smaller cap stays,
    within the new budget; no cap stays none."""
    threshold = engine.long_prefill_token_threshold
    if threshold >= engine.max_num_batched_tokens:
        threshold = budget
    elif threshold:
        threshold = min(threshold, budget)
    return engine.model_copy(
        update={"max_num_batched_tokens": budget, "long_prefill_token_threshold": threshold}
    )


def part_pressure(p99_ms: np.ndarray, slo_ms: float, share: float) -> float:
    """A part's window p99 over its SLO in the k-th best window, k = ⌈share × windows⌉ (windows
    with no samples count as 0: nothing there to violate). At or below 1 exactly when the part
    held in at least `share` of the windows."""
    ratios = np.sort(np.nan_to_num(np.asarray(p99_ms, dtype=float) / slo_ms, nan=0.0))
    if len(ratios) == 0:
        return 0.0
    k = max(1, math.ceil(share * len(ratios) - 1e-9))
    return float(ratios[k - 1])


def verdict(windows_met: float, itl: float, ttft: float, share: float) -> str:
    """The probe's verdict, from its windows and the two part pressures (see `Probe.verdict`)."""
    if itl > 1 and ttft > 1:
        return "no-budget"
    if windows_met >= share - 1e-9:
        return "holds"
    return "smaller" if itl > ttft else "larger"


ProbeRunner = Callable[[FleetSearch, int, int], Probe]
"""Runs one chat-alone probe: (search, replicas, budget) -> Probe. `run_probe` simulates it."""


def plan_fleet(
    search: FleetSearch,
    progress: Callable[[str], None] | None = None,
    probe: ProbeRunner | None = None,
) -> FleetPlan:
    """All three answers for `search`; `progress` hears one line per simulated run. `probe`
    replaces the simulated chat-alone probe (tests of the search give a formula)."""
    say = progress or (lambda _line: None)
    probes: list[Probe] = []
    chosen: Probe | None = None
    for replicas in range(1, search.max_replicas + 1):
        chosen = search_budget(search, replicas, probes, say, probe or run_probe)
        if chosen is not None:
            break
    plan = FleetPlan(
        replicas=chosen.replicas if chosen else None,
        budget=chosen.budget if chosen else None,
        probes=probes,
        sim_minutes=search.minutes,
        warmup_minutes=search.warmup_minutes,
        windows_required=search.required_share,
        night_hours=search.night_hours,
        doc_tokens=search.doc_tokens,
    )
    if chosen is None:
        plan.warnings.append(
            f"no fleet of up to {search.max_replicas} replicas held the SLO in "
            f"{search.required_share:.0%} of windows at any budget probed: raise the replica "
            "limit, or relax the SLO"
        )
        return plan
    plan.document = document_fit(search, chosen)
    if search.doc_tokens > plan.document.largest_admitted_doc_tokens:
        plan.warnings.append(
            f"a {search.doc_tokens:,}-token document does not fit beside chat's KV peak under the "
            f"controller's high water ({plan.document.largest_admitted_doc_tokens:,} tokens at "
            "most): no batch run; use shorter documents or a replica with more KV"
        )
        return plan
    plan.batch = batch_run(search, chosen.replicas, chosen.budget, say)
    if not plan.batch.slo_held:
        plan.warnings.append(
            f"with batch under the SLO controller the fleet held the SLO in only "
            f"{plan.batch.windows_met:.0%} of windows; documents per night count only the "
            "windows that held"
        )
    return plan


def search_budget(
    search: FleetSearch,
    replicas: int,
    probes: list[Probe],
    say: Callable[[str], None],
    run: ProbeRunner,
) -> Probe | None:
    """Bisect the budget at one replica count (module docstring, answer 1); the best probe that
    held, or None when none did."""
    start = search.base.engine.max_num_batched_tokens
    lo, hi = math.log(start / search.budget_span), math.log(start * search.budget_span)
    x = math.log(start)
    held: list[Probe] = []
    tried: set[int] = set()
    for _ in range(search.probes_per_count):
        budget = _round_budget(math.exp(x), search.base.engine.max_model_len)
        if budget in tried:
            break
        tried.add(budget)
        probe = run(search, replicas, budget)
        probes.append(probe)
        say(_probe_line(probe))
        if probe.verdict == "no-budget":
            break
        if probe.verdict == "holds":
            held.append(probe)
            if len(tried) == 1:
                break  # the configured budget holds: keep it
        if probe.itl_pressure > probe.ttft_pressure:
            hi = x
        else:
            lo = x
        x = (lo + hi) / 2
    if not held:
        return None
    return min(held, key=lambda p: (p.pressure, -p.budget))


def _round_budget(value: float, ceiling: int) -> int:
    step = BUDGET_GRANULARITY
    return max(step, min(ceiling, step * round(value / step)))


def judged(v: WindowVerdicts, skip: int) -> WindowVerdicts:
    """The verdicts of the windows after the first `skip` (the warm-up)."""
    return WindowVerdicts(*(getattr(v, f.name)[skip:] for f in fields(WindowVerdicts)))


def _warmup_windows(search: FleetSearch) -> int:
    """Windows that begin inside the warm-up; judging starts with the first one that does not."""
    return math.ceil(60.0 * search.warmup_minutes / search.base.slo.window_s - 1e-9)


def _duration_s(search: FleetSearch) -> float:
    return _warmup_windows(search) * search.base.slo.window_s + 60.0 * search.minutes


def run_probe(search: FleetSearch, replicas: int, budget: int) -> Probe:
    """Chat alone on `replicas` replicas at step budget `budget`, judged per SLO window after
    the warm-up."""
    cfg = search.base.model_copy(
        update={
            "replicas": replicas,
            "duration_s": _duration_s(search),
            "drain_s": min(search.base.drain_s, PROBE_DRAIN_S),
            "engine": budget_engine(search.base.engine, budget),
            "batch": search.base.batch.model_copy(update={"docs": 0}),
        }
    )
    no_batch = make_policy(PolicyChoice("static", seats=0, chunk_tokens=1), cfg.slo)
    started = time.perf_counter()
    result = simulate(cfg, search.model, lambda _replica: no_batch, search.trace)
    v = judged(result.window_verdicts(), _warmup_windows(search))
    slo, share = cfg.slo, search.required_share
    met = float(np.mean(v.met))
    itl = part_pressure(v.itl_p99_ms, slo.chat_itl_p99_ms, share)
    ttft = part_pressure(v.ttft_p99_ms, slo.chat_ttft_p99_ms, share)
    return Probe(
        replicas=replicas,
        budget=budget,
        windows_met=met,
        itl_pressure=itl,
        ttft_pressure=ttft,
        verdict=verdict(met, itl, ttft, share),
        kv_peak_tokens=_kv_peak_tokens(result),
        wall_s=time.perf_counter() - started,
    )


def _kv_peak_tokens(result: SimResult) -> int:
    replica = max(result.sim.replicas, key=lambda r: r.peak_used_blocks)
    return replica.peak_used_blocks * replica.kv.block_size


def document_fit(search: FleetSearch, chosen: Probe) -> DocumentFit:
    """Answer 2 for the fleet of `chosen`, from its chat-alone KV peak."""
    engine, batch = search.base.engine, search.base.batch
    return largest_document(
        kv_capacity_tokens=(engine.kv_capacity_tokens // engine.block_size) * engine.block_size,
        chat_peak_tokens=chosen.kv_peak_tokens,
        extra_tokens=batch.instruction_tokens + batch.summary_tokens,
        max_model_len=engine.max_model_len,
        block_size=engine.block_size,
        kv_high_water=search.controller.kv_high_water,
    )


def largest_document(
    kv_capacity_tokens: int,
    chat_peak_tokens: int,
    extra_tokens: int,
    max_model_len: int,
    block_size: int,
    kv_high_water: float,
) -> DocumentFit:
    """The largest document whose request (document plus `extra_tokens`) fits, in whole KV blocks,
    beside `chat_peak_tokens`; and the largest the controller admits under `kv_high_water`."""

    def fits_in(free_tokens: float) -> int:
        return max(0, (int(free_tokens) // block_size) * block_size - extra_tokens)

    by_kv = fits_in(kv_capacity_tokens - chat_peak_tokens)
    by_len = max(0, max_model_len - extra_tokens)
    admitted = fits_in(kv_high_water * kv_capacity_tokens - chat_peak_tokens)
    return DocumentFit(
        kv_capacity_tokens=kv_capacity_tokens,
        chat_peak_tokens=chat_peak_tokens,
        request_extra_tokens=extra_tokens,
        max_model_len=max_model_len,
        largest_doc_tokens=min(by_kv, by_len),
        limited_by="kv" if by_kv < by_len else "max-model-len",
        kv_high_water=kv_high_water,
        largest_admitted_doc_tokens=min(admitted, by_len),
    )


def backlog_docs(search: FleetSearch, replicas: int) -> int:
    """More documents than `replicas` can finish in the run: a document's prompt prefilled in one
    step alone is the fastest any replica can go, so this many never run dry."""
    prompt = search.doc_tokens + search.base.batch.instruction_tokens
    fastest = max(search.model.step_seconds(StepBatch((PrefillChunk(prompt, 0),))), 1e-3)
    per_replica = math.ceil(_duration_s(search) / fastest) + search.controller.max_seats
    return replicas * per_replica


def batch_run(
    search: FleetSearch, replicas: int, budget: int, say: Callable[[str], None] | None = None
) -> BatchRun:
    """Answer 3: the fleet with a backlog of whole documents under the SLO controller."""
    docs = backlog_docs(search, replicas)
    skip = _warmup_windows(search)
    batch = {"docs": docs, "doc_tokens": search.doc_tokens, "mode": "whole"}
    batch["start_s"] = skip * search.base.slo.window_s
    cfg = search.base.model_copy(
        update={
            "replicas": replicas,
            "duration_s": _duration_s(search),
            "engine": budget_engine(search.base.engine, budget),
            "batch": search.base.batch.model_copy(update=batch),
        }
    )
    controller = make_policy(
        PolicyChoice("slo"), cfg.slo, search.model, search.controller, cfg.engine.max_num_seqs
    )
    started = time.perf_counter()
    result = simulate(cfg, search.model, lambda _replica: controller, search.trace)
    verdicts = judged(result.window_verdicts(), skip)
    met = verdicts.met
    by_window = {}  # judged windows only, numbered from the first judged one
    for w, n in result.sim.batch_prefill_by_window.items():
        if w >= skip:
            k = min(w - skip, len(met) - 1)  # the run's last window takes what ends after it
            by_window[k] = by_window.get(k, 0) + n
    held_tokens = sum(n for k, n in by_window.items() if met[k])
    seconds = 60.0 * search.minutes
    held_per_s = held_tokens / seconds
    prompt = search.doc_tokens + cfg.batch.instruction_tokens
    share = float(np.mean(met))
    chat = result.summary["chat"]
    run = BatchRun(
        docs=docs,
        windows_met=share,
        itl_windows_met=float(np.mean(verdicts.itl_met)),
        ttft_windows_met=float(np.mean(verdicts.ttft_met)),
        slo_held=share >= search.required_share - 1e-9,
        docs_done=result.summary["batch"]["docs_done"],
        preemptions=result.summary["preemptions"],
        prefill_tokens_per_s=sum(by_window.values()) / seconds,
        slo_prefill_tokens_per_s=held_per_s,
        docs_per_night=held_per_s * 3600.0 * search.night_hours / prompt,
        chat_itl_p99_ms=chat["itl_ms"]["p99"],
        chat_ttft_p99_ms=chat["ttft_ms"]["p99"],
        wall_s=time.perf_counter() - started,
    )
    if say is not None:
        say(
            f"batch  {replicas} replicas, budget {budget}: SLO held in {share:.0%} of windows "
            f"(ITL {run.itl_windows_met:.0%}, TTFT {run.ttft_windows_met:.0%}), "
            f"{run.docs_per_night:,.0f} documents per night ({run.wall_s:.1f} s)"
        )
    return run


def _probe_line(p: Probe) -> str:
    return (
        f"probe  {p.replicas} replicas, budget {p.budget}: windows met {p.windows_met:.0%}, "
        f"ITL pressure {p.itl_pressure:.2f}, TTFT pressure {p.ttft_pressure:.2f} -> {p.verdict} "
        f"({p.wall_s:.1f} s)"
    )
