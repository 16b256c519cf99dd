"""The feedback half of the controller: read measured p99s against the SLO, cut fast, grow slowly.

The latency model is a prediction; the measured window p99 is the truth. This module turns the truth
into one of four verdicts and supplies the AIMD arithmetic (multiplicative decrease, additive
increase) that acts on them. It holds no state: the controller owns the per-replica memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from scheduler.records import percentile


class Verdict(StrEnum):
    """What the measured window says about chat latency."""

    ITL_VIOLATION = "itl-violation"
    TTFT_VIOLATION = "ttft-violation"
    SLACK = "slack"
    HOLD = "hold"


def observed_itl(chat_itl_p99_s: float | None, step_samples_s: tuple[float, ...]) -> float | None:
    """Chat ITL p99, or the p99 of step-time samples when no chat token was measured.

    Every decoding sequence of a step waits that step's time, so the step-time p99 is what a chat
    user would have seen had one been decoding."""
    if chat_itl_p99_s is not None:
        return chat_itl_p99_s
    if step_samples_s:
        return percentile(sorted(step_samples_s), 99)
    return None


@dataclass(frozen=True, slots=True)
class Bands:
    """Where a window p99, as a fraction of its SLO, stops being slack and starts being acted on.

    Between a slack fraction and `cut` lies the hold band that keeps a loop sitting near its
    operating point from oscillating. `cut` sits below 1 because the SLO is judged over windows
    longer than the controller's: acting only once a short window breaks it leaves the long one
    broken. ITL and TTFT get their own slack fractions because chat alone already spends most of
    the ITL budget (every step is as long as the engine's step budget allows) but rarely most of
    the TTFT budget."""

    itl_slack: float = 0.7
    """ITL p99 below this × SLO is slack."""
    ttft_slack: float = 0.7
    """TTFT p99 below this × SLO is slack."""
    cut: float = 1.0
    """Either p99 above this × its SLO is a violation."""


def verdict(
    itl_s: float | None,
    ttft_s: float | None,
    itl_slo_s: float,
    ttft_slo_s: float,
    bands: Bands,
) -> Verdict:
    """Classify a window. A missing measurement (no chat, no samples) is no evidence of harm and
    counts as slack for that signal."""
    if itl_s is not None and itl_s > bands.cut * itl_slo_s:
        return Verdict.ITL_VIOLATION
    if ttft_s is not None and ttft_s > bands.cut * ttft_slo_s:
        return Verdict.TTFT_VIOLATION
    itl_slack = itl_s is None or itl_s < bands.itl_slack * itl_slo_s
    ttft_slack = ttft_s is None or ttft_s < bands.ttft_slack * ttft_slo_s
    return Verdict.SLACK if itl_slack and ttft_slack else Verdict.HOLD


def cut(value: int, factor: float, floor: int, quantum: int = 1) -> int:
    """Multiplicative decrease that always moves: at least one `quantum` down unless at `floor`."""
    target = math.floor(value * factor / quantum) * quantum
    return max(floor, min(value - quantum, target))


def grow(value: int, step: int, ceiling: int) -> int:
    """Additive increase, bounded."""
    return min(ceiling, value + step)
