"""A chat trace whose rate swings over the hour, in the Azure trace format (issue 4, Targets).

Static caps are chosen for one load; chat load is not one load. This trace has the day's shape in
an hour: the rate follows a raised cosine from `low_rps` up to `high_rps` and back over `period_s`
(a 3.3× swing by default), so a controller that follows the load can be compared with caps chosen
for its average. Arrivals are a non-homogeneous Poisson process (thinning); every request shares a
system prompt and brings its own context, with log-normal sizes around production's medians.

The trace is generated, not stored: it is a pure function of its parameters and seed, so a run
that passes the same `TraceShape` replays the same requests, and a benchmark with a shorter
duration gets the whole swing compressed into it instead of the first part of an hour-long file.

    .venv/bin/python -m bench.varying_trace --out results/traces/diurnal.csv [--minutes 60]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from simulator.trace import COLUMNS, TraceRow

EPOCH = datetime(2024, 5, 14, 0, 0, 0)
"""Wall-clock time of the trace's first instant; only differences matter on replay."""


@dataclass(frozen=True)
class TraceShape:
    """Rate curve and request sizes of the generated trace."""

    duration_s: float = 3600.0
    """Length of the trace."""
    low_rps: float = 1.5
    """Rate at the start and the end of each period (the quiet hours)."""
    high_rps: float = 5.0
    """Rate at the middle of each period (the peak)."""
    period_s: float | None = None
    """One low-high-low swing; None for one swing over the whole duration."""
    shared_prefix_tokens: int = 6000
    """System prompt every request starts with; replay with the same `trace_shared_prefix_tokens`."""
    context_median_tokens: int = 400
    """Median of a request's own context (retrieved text, history) beyond the system prompt."""
    output_median_tokens: int = 220
    """Median answer length."""
    sigma: float = 0.6
    """Log-normal spread of both sizes."""
    seed: int = 0
    """Seed of every draw."""

    def __post_init__(self) -> None:
        if not 0 < self.low_rps <= self.high_rps:
            raise ValueError(
                f"need 0 < low_rps <= high_rps, got {self.low_rps} and {self.high_rps}"
            )
        if self.duration_s <= 0 or (self.period_s is not None and self.period_s <= 0):
            raise ValueError("duration_s and period_s must be positive")

    def rate(self, t: float) -> float:
        """Requests per second at `t`: a raised cosine, low at 0 and at each period's end."""
        period = self.period_s or self.duration_s
        rise = (1 - math.cos(2 * math.pi * t / period)) / 2
        return self.low_rps + (self.high_rps - self.low_rps) * rise

    @property
    def swing(self) -> float:
        """Peak rate over quiet rate."""
        return self.high_rps / self.low_rps


def generate(shape: TraceShape) -> list[TraceRow]:
    """The trace's requests, in arrival order (thinning of a Poisson process at the peak rate)."""
    rng = random.Random(shape.seed)
    rows, t = [], 0.0
    while True:
        t += rng.expovariate(shape.high_rps)
        if t >= shape.duration_s:
            return rows
        if rng.random() * shape.high_rps <= shape.rate(t):
            context = _lognormal(rng, shape.context_median_tokens, shape.sigma, 16, 8000)
            output = _lognormal(rng, shape.output_median_tokens, shape.sigma, 8, 1500)
            rows.append(TraceRow(t, shape.shared_prefix_tokens + context, output))


def _lognormal(rng: random.Random, median: int, sigma: float, lo: int, hi: int) -> int:
    return min(hi, max(lo, round(median * math.exp(rng.gauss(0.0, sigma)))))


def write_csv(rows: list[TraceRow], path: Path) -> None:
    """`rows` as a `TIMESTAMP,ContextTokens,GeneratedTokens` CSV with Azure-style timestamps."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [",".join(COLUMNS)]
    for row in rows:
        stamp = (EPOCH + timedelta(seconds=row.t_s)).strftime("%Y-%m-%d %H:%M:%S.%f")
        lines.append(f"{stamp},{row.context_tokens},{row.generated_tokens}")
    path.write_text("\n".join(lines) + "\n")


def windowed_rates(rows: list[TraceRow], window_s: float, duration_s: float) -> list[float]:
    """Arrivals per second in consecutive windows: what the trace actually delivers."""
    counts = [0] * max(1, math.ceil(duration_s / window_s))
    for row in rows:
        counts[min(len(counts) - 1, int(row.t_s // window_s))] += 1
    return [c / window_s for c in counts]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="CSV file to write.")
    p.add_argument("--minutes", type=float, default=60.0, help="Trace length.")
    p.add_argument("--low-rps", type=float, default=TraceShape.low_rps, help="Quiet rate.")
    p.add_argument("--high-rps", type=float, default=TraceShape.high_rps, help="Peak rate.")
    p.add_argument("--seed", type=int, default=0, help="Random seed.")
    args = p.parse_args(argv)
    try:
        shape = TraceShape(args.minutes * 60, args.low_rps, args.high_rps, seed=args.seed)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = generate(shape)
    write_csv(rows, args.out)
    rates = windowed_rates(rows, 300.0, shape.duration_s)
    print(
        f"wrote {len(rows):,} requests to {args.out}; requests/s per 5 min: "
        + " ".join(f"{r:.1f}" for r in rates)
        + f"; replay with --set chat.trace_shared_prefix_tokens={shape.shared_prefix_tokens}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
