"""Reading vLLM's Prometheus `/metrics`: counters, gauges, histograms and window quantiles.

vLLM exposes latency as cumulative histograms. The controller wants "p99 over the last window", which
is a quantile of the *difference* between two scrapes. Parsing uses prometheus_client's own text
parser so exposition-format corner cases (escaping, +Inf, exemplars) are handled once, correctly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

Labels = frozenset[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class Histogram:
    """A cumulative histogram: `cumulative[i]` observations were <= `bounds[i]` (last bound +Inf)."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    count: float
    sum: float


@dataclass(frozen=True)
class MetricsSnapshot:
    """One scrape: every sample keyed by (sample name, label set)."""

    samples: dict[tuple[str, Labels], float]

    def _matching(self, name: str, labels: dict[str, str]) -> list[tuple[Labels, float]]:
        wanted = set(labels.items())
        return [(ls, v) for (n, ls), v in self.samples.items() if n == name and wanted <= ls]

    def counter(self, name: str, **labels: str) -> float:
        """Sum of counter `name` over every label set that carries `labels` (0 when absent).

        Accepts the family name (`vllm:num_preemptions`) or the sample name with `_total`."""
        sample = name if name.endswith("_total") else f"{name}_total"
        return sum(v for _, v in self._matching(sample, labels))

    def gauge(self, name: str, **labels: str) -> float | None:
        """Sum of gauge `name` over matching label sets, or None when the replica does not export it."""
        found = self._matching(name, labels)
        return sum(v for _, v in found) if found else None

    def histogram(self, name: str, **labels: str) -> Histogram | None:
        """Histogram `name` summed over matching label sets (e.g. over engines), or None if absent."""
        per_bound: dict[float, float] = {}
        for ls, v in self._matching(f"{name}_bucket", labels):
            le = float(dict(ls)["le"])
            per_bound[le] = per_bound.get(le, 0.0) + v
        if not per_bound:
            return None
        bounds = tuple(sorted(per_bound))
        return Histogram(
            bounds=bounds,
            cumulative=tuple(per_bound[b] for b in bounds),
            count=sum(v for _, v in self._matching(f"{name}_count", labels)),
            sum=sum(v for _, v in self._matching(f"{name}_sum", labels)),
        )


def select_families(text: str, names: Iterable[str]) -> str:
    """The lines of a `/metrics` page that belong to the named metric families (their samples and
    their `# HELP`/`# TYPE` lines). Parsing a whole vLLM page costs tens of milliseconds of Python
    under the GIL; a scraper that wants one histogram every second on a busy host should not stall
    the threads beside it (a load generator's event loop) for the rest."""
    prefixes = tuple(names)
    keep = [
        line
        for line in text.splitlines()
        if (line[7:] if line.startswith(("# HELP ", "# TYPE ")) else line).startswith(prefixes)
    ]
    return "\n".join(keep) + "\n"


def parse_metrics(text: str) -> MetricsSnapshot:
    """Parse Prometheus text exposition into a snapshot."""
    samples: dict[tuple[str, Labels], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return MetricsSnapshot(samples)


def histogram_delta(after: Histogram, before: Histogram | None) -> Histogram:
    """Observations made between two scrapes. A counter reset (engine restart) yields `after`."""
    if before is None or before.bounds != after.bounds or after.count < before.count:
        return after
    return Histogram(
        bounds=after.bounds,
        cumulative=tuple(a - b for a, b in zip(after.cumulative, before.cumulative, strict=True)),
        count=after.count - before.count,
        sum=after.sum - before.sum,
    )


def histogram_quantile(h: Histogram, q: float) -> float | None:
    """Quantile `q` (0..1) of a histogram, interpolating linearly inside the bucket, as PromQL does.

    Resolution limit: the answer is only known to lie inside one bucket. With vLLM's ITL buckets
    (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, …) a p99 of 60 ms is
    reported somewhere in (50, 75] ms, so SLO checks near a bucket bound can be off by up to a bucket
    width; exact percentiles need the streamed per-token timings. A quantile that falls in the +Inf
    bucket returns the highest finite bound, a lower limit of the truth. None when the window is empty.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be within 0..1, got {q}")
    total = h.cumulative[-1] if h.cumulative else 0.0
    if total <= 0:
        return None
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, cum in zip(h.bounds, h.cumulative, strict=True):
        if cum >= rank:
            if math.isinf(bound):
                return prev_bound
            if cum == prev_count:
                return bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (cum - prev_count)
        prev_bound, prev_count = bound, cum
    return prev_bound


async def scrape(
    client: httpx.AsyncClient, base_url: str, timeout_s: float = 5.0
) -> MetricsSnapshot:
    """Fetch and parse `base_url/metrics`; raises httpx errors so callers can mark the replica stale."""
    response = await client.get(f"{base_url.rstrip('/')}/metrics", timeout=timeout_s)
    response.raise_for_status()
    return parse_metrics(response.text)
