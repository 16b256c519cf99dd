"""The plug-in's correction of its latency model on the engine it runs in (docs/design.md §6).

The control document's model is a fit taken on another hour, or on another host of the same kind,
and even a fresh fit is right only on average: the same step composition takes a different time
from one step to the next (other processes, caches, the host's clock). Sized to the model's mean,
half of the steps that carry a batch chunk run over the target, and an ITL p99 SLO is judged by the
slowest 1% of chat's gaps. So the plug-in scales the model by the *tail* of its own error: the
`TAIL_QUANTILE` of measured over modelled time across the recent steps whose length it chose
(those that carried a batch prefill chunk). Chunks sized to the scaled model then keep all but
about 1% of those steps within the target, which is what a target of T ms promises: batch steps of
at most about T ms here. Under 100 samples the 99th percentile is their slowest.

Only batch steps teach the scale, and the scale decides whether batch steps run: a spell of slow
steps (a process starting beside the engine, a cold cache) can set it so high that no block of
any waiting prompt prices within the target, and then nothing would ever show it too high. So
evidence is dated and lasts `SAMPLE_LIFE_S`: once every sample has expired the model is taken as
it is (scale 1), the next batch step is sized to it, and that step's own error becomes the scale.
A scale that is right keeps being re-learnt from the steps it allows; one a passing spell set too
high holds batch back for at most `SAMPLE_LIFE_S`, at the price of one step sized to the bare
model (over the target by the host's real error) each `SAMPLE_LIFE_S` at worst.

Clock-agnostic: the caller passes `now` (the engine's monotonic clock, or simulated time).
"""

from __future__ import annotations

import math
from collections import deque

SCALE_BOUNDS = (1.0, 3.0)
"""Never below 1: where steps run faster than the model says, a controller's feedback raises the
target (it reads the ratio left); where slower, a fixed target is still kept, controller or not.
Past 3x the model describes another machine."""
TAIL_QUANTILE = 0.99
"""The quantile of the model's error the scale takes: the tail an ITL p99 SLO judges."""
SIZED_STEPS = 256
"""Most batch steps the tail is taken over: a few seconds of batch work at CPU step times, a
fraction of a second on a GPU; the 99th of 256 is the third-slowest."""
SAMPLE_LIFE_S = 15.0
"""How long a batch step's error counts. Long enough to hold a few hundred batch steps on a CPU
(at ~10 a second beside chat), so a flowing prefill's tail is taken over the full `SIZED_STEPS`;
short enough that a scale set by a spell that has passed frees batch within a quarter of a
one-minute SLO window."""


class StepTimeScale:
    """Measured over modelled step time on this engine, as the plug-in sizes batch chunks by it.

    Invariants: `value` is within `SCALE_BOUNDS`; it is 1 when no batch step of the last
    `SAMPLE_LIFE_S` has been observed, else the tail of those steps' ratios (the last
    `SIZED_STEPS` of them). Evidence changes only in `observe` and `at`; `value` is derived from
    it when read, so a step that drops an expired sample and adds its own sorts once.
    """

    def __init__(self) -> None:
        self.sized: deque[tuple[float, float]] = deque(maxlen=SIZED_STEPS)
        """(when, measured over modelled) of the recent batch steps, oldest first."""
        self._value: float | None = SCALE_BOUNDS[0]
        """The scale of the evidence as it stands; None once the evidence has changed."""

    @property
    def value(self) -> float:
        if self._value is None:
            ratios = [r for _, r in self.sized]
            self._value = _bounded(_quantile(ratios, TAIL_QUANTILE)) if ratios else SCALE_BOUNDS[0]
        return self._value

    def observe(self, now: float, measured_s: float, modelled_s: float) -> None:
        """A step that carried a batch prefill chunk the plug-in sized ended at `now`, having run
        `measured_s` where the unscaled model said `modelled_s`."""
        if not modelled_s > 0 or not measured_s >= 0:
            return
        self._expire(now)
        self.sized.append((now, measured_s / modelled_s))
        self._value = None

    def at(self, now: float) -> float:
        """The scale to size the step that starts at `now`, evidence older than
        `SAMPLE_LIFE_S` dropped."""
        self._expire(now)
        return self.value

    def _expire(self, now: float) -> None:
        sized = self.sized
        while sized and now - sized[0][0] > SAMPLE_LIFE_S:
            sized.popleft()
            self._value = None


def _quantile(values: list[float], q: float) -> float:
    """The smallest value with at least `q` of `values` at or below it."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _bounded(ratio: float) -> float:
    lo, hi = SCALE_BOUNDS
    return min(hi, max(lo, ratio))
