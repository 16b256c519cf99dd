"""The plug-in's correction of its latency model on the engine it runs in (docs/design.md §6).

The control document's model is a fit taken on another hour, or on another host of the same kind,
and even a fresh fit is right only on average: the same step composition takes a different time
from one step to the next (other processes, caches, the host's clock). Sized to the model's mean,
half of the steps that carry a batch chunk run over the target, and an ITL p99 SLO is judged by the
slowest 1% of chat's gaps. So the plug-in scales the model by the *tail* of its own error: the
`TAIL_QUANTILE` of measured over modelled time across the last `SIZED_STEPS` steps whose length it
chose (those that carried a batch prefill chunk). Chunks sized to the scaled model then keep all
but about 1% of those steps within the target, which is what a target of T ms promises: batch
steps of at most about T ms here.

Until `SIZED_MIN` such steps have run (cold start, or after a restart), the scale is the
time-weighted mean ratio over every step, chat's own included: those already tell how fast this
host is against the fit, though not yet how widely a batch step strays from it.

Both estimates are held within `SCALE_BOUNDS`. A controller reads the ratio left after the scale
(measured over scaled prediction, below 1 by the error's spread) and sends its target over it, so
under feedback the scale moves where steps sit, not the SLO the controller holds.
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
"""Steps with a batch chunk the tail is taken over: a few seconds of batch work at CPU step
times, a fraction of a second on a GPU; the 99th of 256 is the third-slowest."""
SIZED_MIN = 32
"""Steps with a batch chunk before the tail is trusted over the mean of every step."""
MEAN_MEMORY = 0.98
"""Decay per step of the measured and modelled seconds the mean ratio is taken over (about the last
50 steps)."""


class StepTimeScale:
    """Measured over modelled step time on this engine, as the plug-in sizes batch chunks by it.

    Invariants: `value` is within `SCALE_BOUNDS` and changes only in `observe`;
    a step without a modelled time (no control document) changes nothing.
    """

    def __init__(self) -> None:
        self.sized: deque[float] = deque(maxlen=SIZED_STEPS)
        self.measured_sum = self.modelled_sum = 0.0
        self.value = 1.0

    def observe(self, measured_s: float, modelled_s: float, batch_chunk: bool) -> None:
        """One step ran `measured_s` where the unscaled model said `modelled_s`; `batch_chunk`:
        the step carried a batch prefill chunk the plug-in sized."""
        if not modelled_s > 0 or not measured_s >= 0:
            return
        self.measured_sum = MEAN_MEMORY * self.measured_sum + measured_s
        self.modelled_sum = MEAN_MEMORY * self.modelled_sum + modelled_s
        if batch_chunk:
            self.sized.append(measured_s / modelled_s)
        if len(self.sized) < SIZED_MIN:
            self.value = _bounded(self.measured_sum / self.modelled_sum)
        elif batch_chunk:  # the tail moves only with the steps it is taken over: sort only then
            self.value = _bounded(_quantile(self.sized, TAIL_QUANTILE))


def _quantile(values: deque[float], q: float) -> float:
    """The smallest value with at least `q` of `values` at or below it."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _bounded(ratio: float) -> float:
    lo, hi = SCALE_BOUNDS
    return min(hi, max(lo, ratio))
