"""What `nightshift bench` is asked, shared by the real and the simulated bench, and its defaults.

The CPU defaults below apply to a real run and to `--sim` on a CPU profile; a GPU profile under
`--sim` has its own (bench/sim_scenarios.py `GpuDefaults`). None in an option means "the default
for this kind of replica", settled where the bench is built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

RATE = 1.5
"""Chat requests per second (Poisson)."""
DOCS_PER_S = 2.5
"""Corpus documents per second of scenario: about twice what an uncontrolled `cpu-small`
replica finishes of the default 2k-12k token documents (1.1 a second), so no scenario runs out.
The bench says so when one does (`bench.verdicts.corpus_bound`)."""
MIN_DOCS = 200


def default_docs(duration_s: float) -> int:
    """Documents in the corpus when `--docs` is not given: more than any scenario finishes."""
    return max(MIN_DOCS, math.ceil(DOCS_PER_S * duration_s))


WINDOW_S = 15.0
"""SLO window, seconds."""


@dataclass(frozen=True)
class BenchOptions:
    """The options both kinds of bench read."""

    engine_config: Path
    scenarios: tuple[str, ...]
    duration: float
    results: Path
    seed: int = 0
    rate: float | None = None
    latency_model: Path | None = None
    docs: int | None = None
    min_tokens: int = 2000
    max_tokens: int = 12000
    slo_factor: float = 3.0
    itl_slo_ms: float | None = None
    ttft_slo_ms: float | None = None
    e2e_slo_ms: float | None = None
    section_tokens: int | None = None
    window_s: float | None = None
    scale: float | None = None
    static_sweep: tuple[tuple[int, int], ...] | None = None
    budget_sweep: tuple[tuple[int, float], ...] | None = None
