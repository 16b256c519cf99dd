"""The OUT.json of a simulated run: chat latency percentiles, SLO windows, batch throughput.

The shape is the one the benchmark reports for every scenario (issue 3 and issue 6), so `bench --sim`
and `simulate` read alike. Percentiles: TTFT and E2E request-weighted, ITL token-weighted, in ms.
SLO windows follow the warehouse's views (sql/rollup_run.sql, sql/slo_windows.sql), so OUT.json and
the SQL reports agree on a simulated run: TTFT counts in the window of the first token, ITL in that of
the later token of each gap, failures in the window the request ended; a window without chat traffic
is met. A chat request that never got its first token (the drain ran out) counts with the wait it had
(a lower bound), so starving chat cannot hide by never answering.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from scheduler.slo import SLO
from simulator.recorder import Recorder

QUANTILES = {"p50": 50, "p95": 95, "p99": 99}


@dataclass(frozen=True, slots=True)
class RunTotals:
    """Figures of the run that do not come from request records."""

    sim_seconds: float
    wall_seconds: float
    preemptions: int
    kv_peak: float
    docs_done: int
    closed_at: float
    """Virtual time the run closed: its duration plus however long chat took to drain."""


@dataclass(frozen=True)
class WindowVerdicts:
    """Each SLO window's chat p99s (ms; NaN where the window has no samples) and which parts of
    the SLO it held. `met` is the window's verdict: every part held and no chat request failed.
    Kept apart per part because they move opposite ways with the engine's step budget (a larger
    budget lengthens steps, so ITL; a smaller one queues prompts, so TTFT)."""

    itl_p99_ms: np.ndarray
    ttft_p99_ms: np.ndarray
    itl_met: np.ndarray
    ttft_met: np.ndarray
    e2e_met: np.ndarray
    no_failures: np.ndarray

    @property
    def met(self) -> np.ndarray:
        return self.itl_met & self.ttft_met & self.e2e_met & self.no_failures


def window_verdicts(rec: Recorder, totals: RunTotals, slo: SLO) -> WindowVerdicts:
    """Chat's verdict in every SLO window of the run (the module docstring says what counts where)."""
    n = window_count(totals.sim_seconds, slo.window_s)
    chat = [r for r in rec.records if r.cls == "chat"]
    ttft, ttft_at = _ttfts(chat, totals.closed_at)
    gaps, gap_at = rec.class_gaps("chat")
    itl_p99 = _window_p99(gaps, gap_at, n, slo.window_s)
    ttft_p99 = _window_p99(ttft, ttft_at, n, slo.window_s)
    e2e_met = np.ones(n, dtype=bool)
    if slo.chat_e2e_p99_ms is not None:
        done = [r for r in chat if r.status == "ok"]
        e2e, e2e_at = [r.e2e_s for r in done], [r.t_end for r in done]
        e2e_met = _within(_window_p99(e2e, e2e_at, n, slo.window_s), slo.chat_e2e_p99_ms)
    no_failures = np.ones(n, dtype=bool)
    for r in chat:
        if r.status != "ok":
            no_failures[
                _window_of(r.t_end if r.t_end is not None else r.t_submit, n, slo.window_s)
            ] = False
    return WindowVerdicts(
        itl_p99_ms=itl_p99 * 1000.0,
        ttft_p99_ms=ttft_p99 * 1000.0,
        itl_met=_within(itl_p99, slo.chat_itl_p99_ms),
        ttft_met=_within(ttft_p99, slo.chat_ttft_p99_ms),
        e2e_met=e2e_met,
        no_failures=no_failures,
    )


def summarize(rec: Recorder, totals: RunTotals, slo: SLO) -> dict:
    """The OUT.json dictionary."""
    chat = [r for r in rec.records if r.cls == "chat"]
    ttft, _ = _ttfts(chat, totals.closed_at)
    done = [r for r in chat if r.status == "ok"]
    e2e = [r.e2e_s for r in done]
    gaps, _ = rec.class_gaps("chat")
    met = window_verdicts(rec, totals, slo).met
    batch_tokens, goodput = _batch_tokens(rec, slo.window_s, met)
    return {
        "chat": {
            "ttft_ms": _ms_quantiles(ttft),
            "itl_ms": _ms_quantiles(gaps),
            "e2e_ms": _ms_quantiles(e2e),
            "slo_windows_met": float(np.mean(met)),
            "requests": len(done),
            "errors": sum(1 for r in chat if r.status == "error"),
        },
        "batch": {
            "tokens_per_s": batch_tokens / totals.sim_seconds,
            "docs_done": totals.docs_done,
            "slo_batch_tokens_per_s": goodput / totals.sim_seconds,
        },
        "preemptions": totals.preemptions,
        "kv_peak": totals.kv_peak,
        "sim_seconds": totals.sim_seconds,
        "wall_seconds": totals.wall_seconds,
    }


def _ttfts(chat: list, end: float) -> tuple[np.ndarray, np.ndarray]:
    values, at = [], []
    for r in chat:
        if r.ttft_s is not None:
            values.append(r.ttft_s)
            at.append(r.t_first_token)
        elif r.status == "cancelled":
            values.append(end - r.t_submit)
            at.append(r.t_submit)  # the window it arrived in is the one that failed it
    return np.asarray(values, dtype=float), np.asarray(at, dtype=float)


def _ms_quantiles(values) -> dict[str, float | None]:
    if len(values) == 0:
        return {k: None for k in QUANTILES}
    q = np.percentile(np.asarray(values, dtype=float), list(QUANTILES.values())) * 1000.0
    return {k: float(v) for k, v in zip(QUANTILES, q, strict=True)}


def window_count(sim_seconds: float, window_s: float) -> int:
    """SLO windows of a run: a partial last window counts, as in the warehouse's `run_clock`."""
    return max(1, math.ceil(sim_seconds / window_s - 1e-9))


def _window_of(t: float, n: int, window_s: float) -> int:
    """Window of time `t`; times outside the run fall into its first or last window (as in SQL)."""
    return min(n - 1, max(0, int(t // window_s)))


def _within(p99_s: np.ndarray, slo_ms: float) -> np.ndarray:
    """Per window: p99 within the SLO, or no samples (nothing to violate)."""
    return np.isnan(p99_s) | (p99_s * 1000.0 <= slo_ms + 1e-9)


def _window_p99(values, at, n: int, window_s: float) -> np.ndarray:
    """p99 of `values` per window of their times; NaN where a window has none."""
    out = np.full(n, np.nan)
    values, at = np.asarray(values, dtype=float), np.asarray(at, dtype=float)
    if len(values) == 0:
        return out
    idx = np.clip((at // window_s).astype(np.int64), 0, n - 1)
    order = np.argsort(idx, kind="stable")
    bounds = np.searchsorted(idx[order], np.arange(n + 1))
    for k in range(n):
        lo, hi = bounds[k], bounds[k + 1]
        if hi > lo:
            out[k] = np.percentile(values[order[lo:hi]], 99)
    return out


def _batch_tokens(rec: Recorder, window_s: float, met: np.ndarray) -> tuple[int, int]:
    """Prompt + output tokens of finished batch requests, all and inside SLO-met windows."""
    total = good = 0
    for r in rec.records:
        if r.cls != "batch" or r.status != "ok":
            continue
        tokens = r.prompt_tokens + r.output_tokens
        total += tokens
        if met[_window_of(r.t_end, len(met), window_s)]:
            good += tokens
    return total, good
