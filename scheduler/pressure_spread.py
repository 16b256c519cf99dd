"""How much chat's window pressure varies at one batch step target: the margin growth keeps.

Windows at one target do not read alike: chat's mix and arrivals, the documents in flight and, on
a shared host, other processes move a window's p99 with no change of target. How wide a margin
that needs is a property of the replica, not a constant (a GPU's p99 read over thousands of steps
varies by a few percent, a 2-core CPU host running its own clients by ten or more), so it is
measured, as the deviation of a window from what the controller expected of it:

- two windows at the same target that do not overlap are independent draws about the level the
  target sets: half the square of their log-pressure difference samples one window's variance;
- the first window to show a growth's target deviates from the pressure the growth aimed at by
  the noise and the growth's own error: its squared log deviation is a sample too (it is the one
  that counts where the controller grows from nearly every window and seldom holds two).

The slack mark is where the next window breaks the SLO with odds of one in a hundred:
`slack = exp(-MISS_T * sigma)`. Sigma is itself an estimate from the few samples the running
variance holds, so the next window's log pressure over it follows Student's t, not the normal:
taken at its word with the normal quantile, a narrow estimate let 2.9% of windows break.

A sample past the deviation the mark already allows for (`MISS_T` standard deviations) counts as
one at it. A window that far out is a spell, not the spread: a process stalling a small host's
engine for a second breaks the SLO at any target, and the cut answers it. Taken at its word, one
such window would halve the mark and set the margin for many windows after it; clipped, it
widens the spread by a bounded step, and windows that are normal about their level lose nothing
(their margin still breaks the SLO about one window in a hundred).

Invariant: `slack_mark()` is in (0, 1); before any sample it is the operator's prior, and each
sample moves the running variance by `SPREAD_WEIGHT` of its error, at most tripling it, so a
replica whose noise really widens (a busier host, a new chat mix) is followed within a few
windows. Pure and clock-agnostic: the caller passes each window's end and start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SPREAD_WEIGHT = 0.25
"""Weight of a new sample in the running variance: the last eight carry 90% of it."""
SPREAD_DOF = (2 - SPREAD_WEIGHT) / SPREAD_WEIGHT
"""Samples the running variance is worth (its own variance is that of a mean of seven)."""
MISS_T = 2.998
"""Student's t 0.99 quantile at `SPREAD_DOF` (7) degrees of freedom: at the slack mark, one
window in a hundred at the same target breaks the SLO by noise alone (the 99%-of-windows
target), the estimate's own error counted."""


@dataclass
class PressureSpread:
    """The running variance of log window pressure at one target, and the slack mark it sets."""

    variance: float
    """Of one window's log pressure about its target's level."""
    last: tuple[float, float] | None = None
    """(end, pressure) of the last window sampled since the target changed; None after a change."""
    aimed: float | None = None
    """The pressure the last growth sized its target to reach, until a window has judged it."""

    @classmethod
    def from_slack(cls, slack: float) -> PressureSpread:
        """The spread whose slack mark is `slack` (the prior before any pair is measured)."""
        if not 0 < slack < 1:
            raise ValueError(f"slack mark must be in (0, 1), got {slack}")
        return cls((math.log(slack) / MISS_T) ** 2)

    def slack_mark(self) -> float:
        """The pressure growth stops at: one window in a hundred above 1 from here, by the spread."""
        return math.exp(-MISS_T * math.sqrt(self.variance))

    def observe(self, end: float, start: float, pressure: float) -> None:
        """A window over [`start`, `end`] at the current target read `pressure` (> 0). It pairs
        with the last sampled window if it begins after that one ended; an overlapping window
        shares its chat with that one and says less about the spread, so it is skipped."""
        if not _measured(pressure):
            return
        if self.last is not None:
            if start < self.last[0]:
                return
            self._sample(math.log(pressure / self.last[1]) ** 2 / 2)
        self.last = (end, pressure)

    def judge_growth(self, pressure: float) -> None:
        """A window that shows the last growth's target read `pressure`: one sample of how far
        a window falls from what the controller expected of it (nothing after a cut or a hold)."""
        if self.aimed is not None and _measured(pressure):
            self._sample(math.log(pressure / self.aimed) ** 2)
            self.aimed = None

    def target_changed(self, aimed: float | None = None) -> None:
        """Windows at a new target pair only with each other; `aimed`: the pressure a growth
        sized the new target to reach (None for a cut or a cold start, which aim at no level)."""
        self.last, self.aimed = None, aimed

    def _sample(self, squared_log_deviation: float) -> None:
        clipped = min(squared_log_deviation, MISS_T**2 * self.variance)
        self.variance += SPREAD_WEIGHT * (clipped - self.variance)


def _measured(pressure: float) -> bool:
    """Whether a window measured chat at all (no chat: pressure 0, or nothing read)."""
    return pressure > 0 and math.isfinite(pressure)
