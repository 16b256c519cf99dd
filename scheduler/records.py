"""Request and token-gap records: the one row shape every producer writes (docs/design.md §4.5).

The streaming client, the chat-load generator and the simulator all emit these, so the same SQL
reports work on real and simulated runs. They live in `scheduler` because it is the bottom of the
dependency graph: everything that produces or consumes records may import it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Literal

RequestClass = Literal["chat", "batch"]
Stage = Literal["chat", "map", "reduce", "whole"]
Status = Literal["ok", "error", "timeout", "cancelled"]


@dataclass(slots=True)
class TokenGap:
    """Time between two consecutive streamed tokens of one request (idx 0 is the first gap)."""

    request_id: str
    idx: int
    gap_s: float
    t: float  # arrival time of the later token, on the producer's clock


@dataclass(slots=True)
class RequestRecord:
    """One request, as docs/design.md §4.5 names its columns. Times are seconds on the producer's clock."""

    run_id: str
    request_id: str
    cls: RequestClass
    stage: Stage
    replica: str
    doc_id: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    t_submit: float = 0.0
    t_first_token: float | None = None
    t_end: float | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_p50_s: float | None = None
    itl_p99_s: float | None = None
    itl_max_s: float | None = None
    status: Status = "ok"
    error: str | None = None
    gaps: list[TokenGap] = field(default_factory=list, repr=False)

    def finish(self, token_times: list[float], t_end: float) -> None:
        """Fill the latency columns and gap rows from the arrival time of every output token."""
        self.t_end = t_end
        self.e2e_s = t_end - self.t_submit
        if token_times:
            self.t_first_token = token_times[0]
            self.ttft_s = token_times[0] - self.t_submit
        self.gaps = [
            TokenGap(self.request_id, i, b - a, b)
            for i, (a, b) in enumerate(zip(token_times, token_times[1:], strict=False))
        ]
        gap_s = sorted(g.gap_s for g in self.gaps)
        if gap_s:
            self.itl_p50_s = percentile(gap_s, 50)
            self.itl_p99_s = percentile(gap_s, 99)
            self.itl_max_s = gap_s[-1]

    def row(self) -> dict:
        """The record as a flat dict with docs/design.md §4.5 column names (`class`, not `cls`), gaps left out."""
        d = asdict(self)
        d.pop("gaps")
        d["class"] = d.pop("cls")
        return d


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default) of an already sorted, non-empty list."""
    if not sorted_values:
        raise ValueError("percentile of an empty list")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)
