"""What the real and the simulated benchmark conclude from scored scenarios, in one place.

Both benches score their runs with bench/scoring.py; from there on the judgement is the same: the
SLO derived from chat alone, which static caps count as "best", the summary ratios and the bound.
Pure: scored dictionaries in, figures out.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bench.scoring import bound_tokens_per_s, chat_decode_load, chat_prompt_share
from scheduler.engine_flags import engine_step_tokens
from scheduler.slo import SLO
from scheduler.step import PrefillChunk, StepBatch, StepTimeModel

if TYPE_CHECKING:
    from simulator.config import SimConfig


def slo_from_chat_only(
    chat: dict, factor: float, window_s: float, itl_floor_ms: float = 0.0
) -> SLO:
    """`factor` × chat-only's ITL and TTFT p99s (`chat` is a scored scenario's "chat"), the ITL no
    tighter than `itl_floor_ms` (see `itl_floor_ms`)."""
    itl, ttft = chat["itl_ms"]["p99"], chat["ttft_ms"]["p99"]
    if itl is None or ttft is None:
        raise ValueError(
            "the chat-only run streamed no chat tokens, so there is no SLO to derive: check the "
            "replica serves and the chat rate is above 0, or give --itl-slo-ms and --ttft-slo-ms"
        )
    return SLO(
        chat_itl_p99_ms=max(round(itl * factor, 1), itl_floor_ms),
        chat_ttft_p99_ms=round(ttft * factor, 1),
        window_s=window_s,
    )


def with_e2e(slo: SLO, e2e_p99_ms: float | None) -> SLO:
    """`slo` with a chat E2E p99 target added where one is given (a derived SLO has none: chat
    alone's E2E says how long its answers are, not what users will wait for)."""
    if e2e_p99_ms is None:
        return slo
    return SLO.model_validate({**slo.model_dump(), "chat_e2e_p99_ms": e2e_p99_ms})


def itl_floor_ms(model: StepTimeModel, step_tokens: int, chat_context_tokens: int = 1024) -> float:
    """The tightest chat ITL p99 worth promising beside batch work: two engine steps that each
    prefill a full `step_tokens` budget at the start of a prompt, beside one decoding chat, by
    `model`. Chat's own prompts are prefilled in such steps, so a chat stream's gaps include them
    whenever chats overlap; under two of them no batch chunk fits beside one. Chat alone on an idle
    host can show a p99 of a decode step or two, and 3x that is below one such step: an SLO derived
    from it alone would pin the controller at its floor and judge every window failed."""
    step = StepBatch((PrefillChunk(step_tokens, 0),), 1, chat_context_tokens)
    return round(2 * model.step_seconds(step) * 1000, 1)


def engine_itl_floor_ms(model: StepTimeModel, engine_flags: Mapping[str, Any]) -> float:
    """`itl_floor_ms` at the step budget of an engine config's `vllm:` flags; 0 when the engine
    prefills whole prompts in one step (no step budget to price)."""
    step = engine_step_tokens(engine_flags)
    return 0.0 if step is None else itl_floor_ms(model, step)


def holds(s: dict) -> bool:
    """Chat held the SLO in every window, without a failed request."""
    return s["chat"]["slo_windows_met"] == 1.0 and s["chat"]["errors"] == 0


def pick_static(sweep: dict[str, dict]) -> str:
    """The caps with the most batch throughput among those that held the SLO in every window;
    when none did, the one that met the most windows (and `static_held_slo` says so)."""
    holding = [k for k, s in sweep.items() if holds(s)]
    if holding:
        return max(holding, key=lambda k: sweep[k]["batch"]["tokens_per_s"])
    return max(sweep, key=lambda k: sweep[k]["chat"]["slo_windows_met"])


def score_sweeps(
    sweeps: dict[str, dict[str, Any]],
    runs: dict[str, Any],
    scored: dict[str, dict],
    score: Callable[[Any], dict],
) -> dict[str, Any]:
    """Score every run of every sweep (scenario -> caps -> run), and enter each scenario as its
    best caps (`pick_static`) in `scored` and `runs`, the whole sweep beside it. Returns every
    run of every sweep by caps, for the run ids."""
    every: dict[str, Any] = {}
    for name, runs_of in sweeps.items():
        scored_sweep = {k: score(r) for k, r in runs_of.items()}
        best = pick_static(scored_sweep)
        scored[name] = {**scored_sweep[best], "caps": best, "sweep": scored_sweep}
        runs[name] = runs_of[best]
        every.update(runs_of)
    return every


def step_chunk_cap(
    step_tokens: int | None, long_prefill_threshold: int, max_model_len: int, decode_seqs: float
) -> int:
    """Largest batch prefill chunk one engine step can carry beside `decode_seqs` chat decodes.

    The step budget (`step_tokens`, None without chunked prefill) counts decode tokens too, and
    the long-prefill threshold caps one request's chunk; a bound that ignored them would price
    steps the engine never runs."""
    cap = step_room(step_tokens, max_model_len, decode_seqs)
    if long_prefill_threshold > 0:
        cap = min(cap, long_prefill_threshold)
    return max(1, cap)


def step_room(step_tokens: int | None, max_model_len: int, decode_seqs: float) -> int:
    """Prefill tokens one engine step has room for beside `decode_seqs` decodes (without chunked
    prefill, a whole prompt)."""
    return max_model_len if step_tokens is None else max(1, step_tokens - round(decode_seqs))


def measured_bound(
    model: StepTimeModel,
    slo: SLO,
    chat: list,
    span: tuple[float, float],
    batch_prompts: Sequence[int],
    step_tokens: int | None,
    long_prefill_threshold: int,
    max_model_len: int,
) -> tuple[float, float, float, float]:
    """(bound, chat decode sequences, their mean context, chat prompts' share of the steps): the
    latency model's bound (`bench.scoring.bound_tokens_per_s`) beside the chat load `chat`
    measured over `span`, its decodes and its prompts (`chat_prompt_share`), through
    `batch_prompts`, at the step the engine's flags allow beside that load (`step_chunk_cap`)."""
    seqs, ctx = chat_decode_load(chat, *span)
    cap = step_chunk_cap(step_tokens, long_prefill_threshold, max_model_len, seqs)
    room = step_room(step_tokens, max_model_len, seqs)
    share = chat_prompt_share(model, chat, *span, seqs, ctx, cap, room)
    return bound_tokens_per_s(model, slo, seqs, ctx, cap, batch_prompts, share), seqs, ctx, share


@dataclass(frozen=True)
class MeasuredModel:
    """`model` with every step `ratio` times as long: the fit as the plug-in measured this
    replica's steps (its measured/predicted ratio), so a bound priced with it is this host's."""

    model: StepTimeModel
    ratio: float

    def step_seconds(self, batch: StepBatch) -> float:
        return self.ratio * self.model.step_seconds(batch)


def measured_step_ratio(engine_steps: Sequence[Mapping[str, Any]]) -> float | None:
    """The median of the plug-in's measured/modelled time of its batch steps over the
    `engine_steps` rows of a run's intervals that prefilled batch tokens (None where there were
    none, or it priced no step: no control document): how far this host's batch steps are from the
    latency fit's, before the plug-in's own tail scale. Steps of chat alone are left out by the
    plug-in: their small steps are mostly fixed cost, which a fit prices differently."""
    ratios = [
        r["step_time_ratio"]
        for r in engine_steps
        if (r.get("step_time_ratio") or 0) > 0 and (r.get("batch_prefill_tokens") or 0) > 0
    ]
    return statistics.median(ratios) if ratios else None


def sim_bound(
    model: StepTimeModel,
    slo: SLO,
    chat: list,
    cfg: SimConfig,
    batch_prompts: list[int],
    since: float = 0.0,
) -> tuple[float, float, float, float]:
    """`measured_bound` for a simulated run: chat measured from `since` to the run's end, at the
    step its simulated engine's flags allow."""
    engine = cfg.engine
    return measured_bound(
        model,
        slo,
        chat,
        (since, cfg.duration_s),
        batch_prompts,
        engine.max_num_batched_tokens if engine.enable_chunked_prefill else None,
        engine.long_prefill_token_threshold,
        engine.max_model_len,
    )


def corpus_bound(scored: dict, corpus_docs: int | None) -> list[str]:
    """Scenarios that finished every document of the corpus before their end: their batch
    tokens/s measures the corpus, not the policy, and a ratio with them in it is no verdict."""
    if not corpus_docs:
        return []
    return [n for n, s in scored.items() if s["batch"].get("docs_done", 0) >= corpus_docs]


def summary(
    scored: dict,
    slo: SLO,
    bound: float,
    decode_seqs: float,
    context: float,
    chat_prompt_share: float,
    corpus_docs: int | None = None,
    measured: tuple[float, float] | None = None,
) -> dict:
    """OUT.json's summary: the ratios the benchmark's targets are stated in, the bound, and the
    scenarios whose batch figures the corpus bounded (`corpus_bound`). `measured` is (the
    controlled run's measured/predicted step ratio, the bound priced with it), where the plug-in
    measured one: a fit taken on another host prices this one's steps wrong, and both ways."""

    def batch(name: str, key: str = "tokens_per_s") -> float | None:
        return scored[name]["batch"][key] if name in scored else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or not b else a / b

    unc = scored.get("uncontrolled")
    unc_itl = unc["chat"]["itl_ms"]["p99"] if unc else None
    good = "slo_batch_tokens_per_s"
    return {
        "controlled_vs_uncontrolled_batch": ratio(batch("controlled"), batch("uncontrolled")),
        "controlled_vs_static_engine_batch": ratio(
            batch("controlled", good), batch("static-engine", good)
        ),
        "controlled_vs_static_budget_batch": ratio(
            batch("controlled", good), batch("static-budget", good)
        ),
        "uncontrolled_itl_p99_over_slo": unc_itl / slo.chat_itl_p99_ms if unc_itl else None,
        "static_engine_held_slo": holds(scored["static-engine"])
        if "static-engine" in scored
        else None,
        "static_budget_held_slo": holds(scored["static-budget"])
        if "static-budget" in scored
        else None,
        "bound_tokens_per_s": bound,
        "controlled_fraction_of_bound": ratio(batch("controlled", "slo_batch_tokens_per_s"), bound),
        "step_time_ratio": measured[0] if measured else None,
        "bound_tokens_per_s_measured": measured[1] if measured else None,
        "controlled_fraction_of_bound_measured": ratio(batch("controlled", good), measured[1])
        if measured
        else None,
        "chat_decode_seqs": decode_seqs,
        "chat_decode_context": context,
        "chat_prompt_share": chat_prompt_share,
        "corpus_bound": corpus_bound(scored, corpus_docs),
    }
