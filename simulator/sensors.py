"""What the controller sees of a simulated replica: window statistics, as a live sensor reports them.

Samples are kept per control interval; an observation merges the last few intervals (the sensor
window). ITL p99 is token-weighted (one sample per streamed chat token), TTFT and end-to-end p99
request-weighted. Chat's answer lengths are kept over the whole run, as the plug-in counts them
since its engine started.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from scheduler.admission import BatchInFlight, Observation
from simulator.entities import Request


@dataclass(slots=True)
class Interval:
    """Samples of one control interval."""

    t_start: float = 0.0
    """When the interval began (the simulation starts at 0)."""
    chat_gaps: list[float] = field(default_factory=list)
    chat_ttfts: list[float] = field(default_factory=list)
    chat_e2es: list[float] = field(default_factory=list)
    steps: list[float] = field(default_factory=list)
    target_bound_steps: int = 0
    preemptions: int = 0


class ReplicaSensor:
    """Collects samples as steps finish and turns them into an `Observation` on demand."""

    def __init__(self, intervals_per_window: int) -> None:
        self.window: deque[Interval] = deque(maxlen=max(1, intervals_per_window))
        self.current = Interval()
        self.chat_answer_tokens: list[int] = []
        """Every chat answer's length so far, kept sorted (an hour holds tens of thousands)."""

    def answered(self, tokens: int) -> None:
        """A chat answer of `tokens` finished."""
        bisect.insort(self.chat_answer_tokens, tokens)

    def observe(
        self,
        t: float,
        replica: str,
        kv_usage: float,
        running: list[Request],
        waiting: list[Request],
        kv_capacity_tokens: int | None = None,
        step_time_ratio: float | None = None,
        chat_cache_tokens: int | None = None,
    ) -> Observation:
        """The observation at `t`; starts a fresh interval afterwards. `step_time_ratio` is the
        measured over predicted step time the replica's plug-in reports (None: no plug-in, and
        then no share of steps at the target either); `chat_cache_tokens` chat's prefix-cache
        working set as the plug-in counts it (None: not counted)."""
        self.window.append(self.current)
        self.current = Interval(t_start=t)
        steps = sum(len(iv.steps) for iv in self.window)
        bound = sum(iv.target_bound_steps for iv in self.window)
        gaps = [g for iv in self.window for g in iv.chat_gaps]
        ttfts = [x for iv in self.window for x in iv.chat_ttfts]
        e2es = [x for iv in self.window for x in iv.chat_e2es]
        chat_decoding = [r for r in running if r.cls == "chat" and r.output_tokens > 0]
        batch = [r for r in running + waiting if r.cls == "batch"]
        return Observation(
            t=t,
            replica=replica,
            chat_itl_p99_s=_p99(gaps),
            chat_ttft_p99_s=_p99(ttfts),
            chat_e2e_p99_s=_p99(e2es),
            kv_usage=kv_usage,
            kv_capacity_tokens=kv_capacity_tokens,
            preemptions=self.window[-1].preemptions,
            running=len(running),
            waiting=len(waiting),
            chat_decoding=len(chat_decoding),
            chat_decode_context_tokens=sum(r.num_tokens for r in chat_decoding),
            batch_in_flight=tuple(
                BatchInFlight(r.prompt_tokens, min(r.num_computed, r.prompt_tokens)) for r in batch
            ),
            step_samples_s=tuple(s for iv in self.window for s in iv.steps),
            step_time_ratio=step_time_ratio,
            target_bound_share=bound / steps if step_time_ratio is not None and steps else None,
            window_s=t - self.window[0].t_start,
            chat_cache_tokens=chat_cache_tokens,
            chat_answer_tokens_p99=_sorted_p99(self.chat_answer_tokens),
        )


def _p99(values: list[float]) -> float | None:
    return float(np.percentile(values, 99)) if values else None


def _sorted_p99(ordered: list[int]) -> float | None:
    """`_p99` of an already sorted list, without copying it."""
    if not ordered:
        return None
    at = 0.99 * (len(ordered) - 1)
    lo = int(at)
    hi = min(lo + 1, len(ordered) - 1)
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (at - lo))
