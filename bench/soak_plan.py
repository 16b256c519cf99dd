"""The soak's night on paper: when it ends, when each fault lands, how big its corpus and chat are.

Pure: times and options in, a plan out; `bench.soak` does the running. Fault times are fractions
of the night, so a short smoke run (`--minutes 8`) sees every fault, in the same order and with the
same spacing relative to its length as a two-hour one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

FAULT_FRACTIONS: dict[str, float] = {
    "worker-killed": 0.15,
    "gate-killed": 0.30,
    "prometheus-stopped": 0.45,
    "replica-restarted": 0.60,
    "run-killed": 0.75,
}
"""Each fault and when it lands, as a fraction of the night. Spread so that the night has
recovered from one (a replica restart takes a minute or more here) before the next, and the last
leaves a quarter of the night to show that it went on afterwards."""
RUN_FAULTS = frozenset({"worker-killed", "gate-killed", "run-killed"})
"""Faults whose target lives in a run attempt: held back while none runs (an earlier fault may
have ended one), so that the night starts the next attempt first and the fault lands in it."""
PROMETHEUS_STOP_S = 30.0
"""How long Prometheus stays stopped: past the controller's `stale_after_s` (15 s), so the
controller has to pause batch and cold-start after it."""
DOCS_PER_MINUTE = 320
"""Default corpus size per minute of night: half as much again as one cpu-small replica finished
beside the soak's chat with the faults (about 210 documents of 600-2400 tokens a minute), so the
corpus outlasts the night: every minute of it carries batch work, the run is still there for the
last fault and for the end-of-night memory sample."""
END_SAMPLE_LEAD_S = 30.0
"""The end-of-night memory sample is taken this long before the deadline (at most 5% of the
night), while chat load and the run are both still at work: at the deadline itself chat load may
have played its last arrival and exited."""
MEMORY_EVERY_S = 600.0
"""Between the two judged samples, memory is sampled this often too, for the report's series: a
role that grows only after a fault replaced it, or levels off at a cap, shows as such."""
RESUME_MARGIN_S = 30.0
"""No run attempt starts closer than this to the deadline: `--deadline HH:MM` is the first such
time after the attempt's flow starts (a few seconds after its process), so an attempt whose flow
started past it would run until the next day's."""
CHAT_TAIL_S = 30.0
"""Chat load plays on this long past the deadline: it is still at work when the end-of-night
memory sample is taken, and chat meets the run's drain as it would in production."""
MIN_MINUTES = 3.0
"""Shortest night: the deadline is whole minutes, and each fault needs a running night."""


@dataclass(frozen=True)
class PlannedFault:
    """One fault of the schedule: its name and seconds after the night's start."""

    name: str
    at_s: float


def fault_schedule(
    duration_s: float, fractions: dict[str, float] | None = None
) -> list[PlannedFault]:
    """The faults in time order, each at its fraction of `duration_s`; fractions must lie in
    (0, 1), so that every fault lands inside the night."""
    fractions = FAULT_FRACTIONS if fractions is None else fractions
    if duration_s <= 0:
        raise ValueError(f"the night must last some seconds, got {duration_s}")
    bad = {n: f for n, f in fractions.items() if not 0 < f < 1}
    if bad:
        raise ValueError(f"fault fractions must lie strictly between 0 and 1: {bad}")
    return sorted(
        (PlannedFault(n, f * duration_s) for n, f in fractions.items()), key=lambda p: p.at_s
    )


def fault_ready(name: str, run_running: bool) -> bool:
    """Whether fault `name`, now due, may be injected (see `RUN_FAULTS`)."""
    return run_running or name not in RUN_FAULTS


def night_deadline(start_ts: float, minutes: float) -> float:
    """The whole UTC minute nearest `start + minutes`: `nightshift run --deadline` takes HH:MM.
    Never less than `MIN_MINUTES - 1` minutes after the start."""
    if minutes < MIN_MINUTES:
        raise ValueError(f"--minutes must be at least {MIN_MINUTES:g}, got {minutes:g}")
    rounded = round((start_ts + minutes * 60) / 60) * 60
    floor = math.ceil((start_ts + (MIN_MINUTES - 1) * 60) / 60) * 60
    return float(max(rounded, floor))


def deadline_hhmm(deadline_ts: float) -> str:
    """`--deadline` for `nightshift run --timezone UTC`."""
    return datetime.fromtimestamp(deadline_ts, UTC).strftime("%H:%M")


def may_start_attempt(now: float, deadline_ts: float, margin_s: float = RESUME_MARGIN_S) -> bool:
    """Whether a run attempt may start now (see `RESUME_MARGIN_S`)."""
    return now <= deadline_ts - margin_s


def end_sample_at(deadline_ts: float, duration_s: float) -> float:
    """When the end-of-night memory sample is taken (see `END_SAMPLE_LEAD_S`)."""
    return deadline_ts - min(END_SAMPLE_LEAD_S, 0.05 * duration_s)


def default_docs(minutes: float, per_minute: int = DOCS_PER_MINUTE) -> int:
    """Corpus size for a night of `minutes`."""
    return max(16, math.ceil(minutes * per_minute))


def engine_config_for(no_native_bf16: bool, configs: Path = Path("engine_configs")) -> Path:
    """cpu-small, or its float32 twin on a CPU without native bf16 (serving/cpu_features.py:
    bf16 matmuls there take a path several times slower, which its fit does not describe)."""
    return configs / ("cpu-small-fp32.yaml" if no_native_bf16 else "cpu-small.yaml")


def chat_period_s(duration_s: float, swings: int = 2) -> float:
    """One low-high-low swing of the chat rate: two per night, so the controller meets a rising
    and a falling load twice, at every length of night."""
    return duration_s / swings
