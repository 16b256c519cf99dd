"""The feedback half of the controller: read measured p99s against the SLO, cut fast, grow slowly.

The latency model is a prediction; the measured window p99 is the truth. This module turns the truth
into one of four verdicts and supplies the AIMD arithmetic (multiplicative decrease, additive
increase) that acts on them. It holds no state: the controller owns the per-replica memory.
"""

from __future__ import annotations

import math
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


def verdict(
    itl_s: float | None,
    ttft_s: float | None,
    itl_slo_s: float,
    ttft_slo_s: float,
    slack_fraction: float,
) -> Verdict:
    """Classify a window. A missing measurement (no chat, no samples) is no evidence of harm and
    counts as slack for that signal; between `slack_fraction × SLO` and the SLO is the hold band
    that keeps a loop sitting near its operating point from oscillating."""
    if itl_s is not None and itl_s > itl_slo_s:
        return Verdict.ITL_VIOLATION
    if ttft_s is not None and ttft_s > ttft_slo_s:
        return Verdict.TTFT_VIOLATION
    itl_slack = itl_s is None or itl_s < slack_fraction * itl_slo_s
    ttft_slack = ttft_s is None or ttft_s < slack_fraction * ttft_slo_s
    return Verdict.SLACK if itl_slack and ttft_slack else Verdict.HOLD


def cut(value: int, factor: float, floor: int, quantum: int = 1) -> int:
    """Multiplicative decrease that always moves: at least one `quantum` down unless at `floor`."""
    target = math.floor(value * factor / quantum) * quantum
    return max(floor, min(value - quantum, target))


def grow(value: int, step: int, ceiling: int) -> int:
    """Additive increase, bounded."""
    return min(ceiling, value + step)
