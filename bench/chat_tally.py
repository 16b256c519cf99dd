"""A chat load run's summary, kept as the run goes: a few numbers per request, none of its objects.

A run that replays a night's trace sends thousands of requests with tens of tokens each. Holding
every record and token gap until the end made the load generator grow through the night (one
object per gap), which a soak then reads as a leak. The tally keeps only what the summary is taken
over, as packed floats (`array('d')`, 8 bytes a value): TTFT, TPOT and E2E of each ok request,
every token gap, and each prompt's size over its plan. Counts and sums are plain integers. The
percentiles stay exact; memory grows by about 8 bytes per streamed token.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from bench.serving_metrics import latency_stats_ms, meets, tpot_s
from scheduler.records import RequestRecord, percentile


@dataclass
class ChatTally:
    """What `summary` reports, added to one finished request at a time (`add`)."""

    goodput_slos: Mapping[str, float]
    """Per-request SLOs (ms) a request is judged against when it is added (vLLM's `--goodput`)."""
    statuses: Counter = field(default_factory=Counter)
    sessions: set[int] = field(default_factory=set)
    ttft_s: array = field(default_factory=lambda: array("d"))
    tpot_s: array = field(default_factory=lambda: array("d"))
    e2e_s: array = field(default_factory=lambda: array("d"))
    gap_s: array = field(default_factory=lambda: array("d"))
    over_planned: array = field(default_factory=lambda: array("d"))
    good: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    first_error: str | None = None

    @property
    def sent(self) -> int:
        return sum(self.statuses.values())

    def add(self, record: RequestRecord, session: int, planned_prompt_tokens: int) -> None:
        """Count one finished request of `session`, built to `planned_prompt_tokens`."""
        self.statuses[record.status] += 1
        self.sessions.add(session)
        self.gap_s.extend(g.gap_s for g in record.gaps)
        self.good += meets(record, self.goodput_slos)
        if record.error and self.first_error is None:
            self.first_error = record.error
        if record.status != "ok":
            return
        for values, value in (
            (self.ttft_s, record.ttft_s),
            (self.tpot_s, tpot_s(record)),
            (self.e2e_s, record.e2e_s),
        ):
            if value is not None:
                values.append(value)
        self.prompt_tokens += record.prompt_tokens
        self.cached_tokens += record.cached_tokens
        self.output_tokens += record.output_tokens
        if record.prompt_tokens and planned_prompt_tokens:
            self.over_planned.append(record.prompt_tokens / planned_prompt_tokens)

    def summary(self, *, window_s: float, not_sent: int = 0, planned: int | None = None) -> dict:
        """Counts, latency statistics (TTFT, TPOT, ITL over every token gap, E2E), vLLM-style
        goodput, achieved rate and prefix-cache hit share, as `bench.chat_results` documents."""
        sent, ok = self.sent, self.statuses["ok"]
        latency = {
            "ttft_ms": self.ttft_s,
            "tpot_ms": self.tpot_s,
            "itl_ms": self.gap_s,
            "e2e_ms": self.e2e_s,
        }
        ratios = sorted(self.over_planned)
        return {
            "requests": {
                "planned": planned if planned is not None else sent + not_sent,
                "sent": sent,
                "ok": ok,
                "failed": self.statuses["error"] + self.statuses["timeout"],
                "cancelled": self.statuses["cancelled"],
                "not_sent": not_sent,
            },
            "sessions": len(self.sessions),
            "window_s": round(window_s, 3),
            "achieved_rate": sent / window_s if window_s > 0 else 0.0,
            **{
                key: {**latency_stats_ms(values), "n": len(values)}
                for key, values in latency.items()
            },
            "goodput": self.good / window_s if window_s > 0 else 0.0,
            "goodput_slos_ms": dict(self.goodput_slos),
            "goodput_share": self.good / sent if sent else None,
            "prompt_tokens_mean": self.prompt_tokens / ok if ok else 0.0,
            "output_tokens": self.output_tokens,
            "prefix_cache_hit_share": (
                self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
            ),
            "prompt_tokens_over_planned_p50": percentile(ratios, 50) if ratios else None,
        }
