"""Chat ITL and TTFT as the engine measured them: per-second scrapes of each replica's histograms.

Where the replica runs the engine plug-in, the histogram is the plug-in's chat-only one (its status
document's `chat_itl_seconds`): vLLM's own counts batch sequences' gaps too, so a window with
little chat beside a long batch decode is judged by batch's gaps. Each replica keeps the source
its first scrape found for the whole run (two sources' counters cannot be subtracted).

Why not the client's token gaps: on a small shared host the API server process is starved while the
engine computes, and the client then receives several steps' tokens in one burst, so streamed gaps
mix engine step time with host scheduling noise (on this 2-core machine a chat-only p99 of ~180 ms
over 8 ms steps). vLLM stamps each token in the engine core process, so the histogram it exports is
the step cadence every decoding sequence sees, which is the quantity admission control acts on and
the same one the Gate's `VllmMetricsSensor` reads.

Chat TTFT comes from the plug-in's chat-only TTFT histogram (`chat_ttft_seconds`), never from
vLLM's, where a batch prompt's TTFT, long by nature, would swamp chat's. In production the night
never sees a chat request, so this is the only chat TTFT a night's windows can be judged by; where
chat requests are among the run's own records (a benchmark, the demo) the windows keep theirs
(sql/slo_windows.sql).

`HistogramSeries` is pure (snapshots in, window quantiles out); `EngineItlRecorder` is the thread
that scrapes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx

from serving.engine_control import ControlTarget, read_status
from serving.metrics import (
    Histogram,
    histogram_delta,
    histogram_quantile,
    parse_metrics,
    select_families,
)
from serving.plugin_sensor import status_histogram
from serving.sensors import ITL_HISTOGRAMS


@dataclass
class HistogramSeries:
    """Timestamped cumulative histograms of one metric per replica, and quantiles over any span."""

    samples: dict[str, list[tuple[float, Histogram]]] = field(default_factory=dict)

    def add(self, replica: str, t: float, histogram: Histogram) -> None:
        self.samples.setdefault(replica, []).append((t, histogram))

    def window(self, t0: float, t1: float) -> Histogram | None:
        """Observations between the last scrape at or before t0 (or the first after it) and the
        last scrape at or before t1, summed over replicas; None when no replica has both ends."""
        total: Histogram | None = None
        for series in self.samples.values():
            before, after = _at_or_before(series, t0), _at_or_before(series, t1)
            if after is None:
                continue
            if before is None:
                before = series[0][1]
            delta = histogram_delta(after, before)
            total = delta if total is None else _add(total, delta)
        return total

    def quantile_ms(self, t0: float, t1: float, q: float) -> float | None:
        h = self.window(t0, t1)
        v = histogram_quantile(h, q) if h is not None else None
        return None if v is None else v * 1000

    def quantiles_ms(self, t0: float, t1: float) -> dict[str, float | None]:
        return {f"p{q}": self.quantile_ms(t0, t1, q / 100) for q in (50, 95, 99)}

    def rows(self, run_id: str) -> list[dict]:
        """The series as `engine_itl` (or `engine_ttft`) rows for the warehouse: per replica and
        scrape interval, the observations that fell in each bucket (empty buckets left out), so
        SQL can judge any window."""
        out = []
        for replica, series in self.samples.items():
            for (t0, before), (t1, after) in zip(series, series[1:], strict=False):
                delta = histogram_delta(after, before)
                low, below = 0.0, 0.0
                for le, cum in zip(delta.bounds, delta.cumulative, strict=True):
                    if cum > below:
                        out.append(
                            {
                                "run_id": run_id,
                                "replica": replica,
                                "t0": t0,
                                "t1": t1,
                                "le_low": low,
                                "le": le,
                                "count": round(cum - below),
                            }
                        )
                    low, below = le, cum
        return out


def _at_or_before(series: list[tuple[float, Histogram]], t: float) -> Histogram | None:
    found = None
    for ts, h in series:
        if ts > t:
            break
        found = h
    return found


def _add(a: Histogram, b: Histogram) -> Histogram:
    if a.bounds != b.bounds:
        raise ValueError("replicas export different ITL buckets; give them the same engine config")
    return Histogram(
        a.bounds,
        tuple(x + y for x, y in zip(a.cumulative, b.cumulative, strict=True)),
        a.count + b.count,
        a.sum + b.sum,
    )


def itl_histogram(text: str) -> Histogram | None:
    """The ITL histogram of one `/metrics` page, under whichever name this vLLM exports it."""
    snap = parse_metrics(select_families(text, ITL_HISTOGRAMS))
    for name in ITL_HISTOGRAMS:
        h = snap.histogram(name)
        if h is not None:
            return h
    return None


class EngineItlRecorder:
    """Scrapes every replica's ITL histogram (`series`), and where the plug-in runs its chat TTFT
    histogram (`ttft`), every `interval_s` on a daemon thread.

    A failed scrape is skipped (the next one covers the span); use as a context manager so the
    thread ends, with a final scrape, when the scenario does.
    """

    def __init__(
        self,
        replicas: list[tuple[str, str]],
        interval_s: float = 1.0,
        plugin_status: Mapping[str, ControlTarget] | None = None,
    ) -> None:
        self.replicas = replicas
        self.interval_s = interval_s
        self.plugin_status = dict(plugin_status or {})
        """Where each replica's plug-in status document is read, for its chat-only gaps."""
        self.sources: dict[str, str] = {}
        """Per replica, `plugin` or `vllm`: what its first scrape found, kept for the run."""
        self.series = HistogramSeries()
        self.ttft = HistogramSeries()
        """Chat-only TTFT, from replicas whose plug-in status has it."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="engine-itl", daemon=True)

    def __enter__(self) -> EngineItlRecorder:
        self._scrape_all()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._scrape_all()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._scrape_all()

    def _scrape_all(self) -> None:
        with httpx.Client(timeout=2.0) as client:
            for name, url in self.replicas:
                scraped = self._scrape(client, name, url)
                if scraped is not None:
                    self.series.add(name, *scraped)

    def _scrape(self, client: httpx.Client, name: str, url: str) -> tuple[float, Histogram] | None:
        """The replica's chat gap histogram and when it was taken: a plug-in status document's
        own `written_at` (it is written about once a second, and once more as the engine
        drains, so a window's baseline is the last document before its start), else now."""
        source, target = self.sources.get(name), self.plugin_status.get(name)
        if source in (None, "plugin") and target is not None:
            doc = read_status(target)
            if doc is not None and "chat_itl_seconds" in doc:
                self.sources[name] = "plugin"
                at = doc.get("written_at", time.time())
                if "chat_ttft_seconds" in doc:
                    self.ttft.add(name, at, status_histogram(doc, "chat_ttft_seconds"))
                return at, status_histogram(doc, "chat_itl_seconds")
            if source == "plugin":
                return None
        try:
            response = client.get(f"{url.rstrip('/')}/metrics")
            response.raise_for_status()
        except httpx.HTTPError:
            return None
        h = itl_histogram(response.text)
        if h is None:
            return None
        self.sources[name] = "vllm"
        return time.time(), h
