"""Sensors: where the controller's observations come from, each behind one small interface.

A sensor answers `await sensor.observe()` with one `Observation` per replica it knows, stamped with
its own clock. A replica it could not read comes back with `fresh=False` (never silently missing), so
the controller pauses batch there instead of running blind. Sensors hold whatever they need between
calls (the previous scrape, fed samples) and are polled by one caller, the Gate, every interval.

- `VllmMetricsSensor`: each replica's own `/metrics`; window p99s from histogram deltas.
- `StreamedTimingsSensor`: the timings our own clients streamed (exact, per class).
- `PrometheusSensor`: a Prometheus server's HTTP API, for fleets that already scrape replicas.
- `MergedSensor`: engine state from one sensor, latency from another where it has any.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol
from urllib.parse import urlparse

import httpx

from scheduler.admission import Observation
from scheduler.records import RequestRecord, percentile
from serving.metrics import MetricsSnapshot, histogram_delta, histogram_quantile, scrape

Clock = Callable[[], float]

ITL_HISTOGRAMS = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
TTFT_HISTOGRAM = "vllm:time_to_first_token_seconds"
KV_GAUGES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
CACHE_INFO = "vllm:cache_config_info"


class Sensor(Protocol):
    """Anything that can tell the controller what each replica looks like right now."""

    async def observe(self) -> dict[str, Observation]:
        """One observation per replica; `fresh=False` for a replica that could not be read."""
        ...


# -- vLLM /metrics ----------------------------------------------------------------------------


class VllmMetricsSensor:
    """Scrapes every replica's `/metrics` and reports the window since the previous scrape.

    Limit: vLLM's latency histograms mix chat and batch requests. For ITL this matters little, since
    every decoding sequence of a step waits the same step time, so batch tokens measure what chat
    feels (only the weighting differs). TTFT is different: a long batch prompt has a long TTFT by
    nature and inflates the mixed p99. Pass `report_ttft=False` and take TTFT from the streamed
    timings (see `MergedSensor`) when batch prompts are long; the first scrape of a replica has no
    window yet and reports gauges only.

    `window_s`: the p99s span the last `window_s` seconds (sliding, from the newest scrape at least
    that old) instead of the time since the previous scrape. Set it to the SLO's window: a p99 over
    a few seconds of light chat is its slowest gap or two, far stricter than the p99 the SLO judges,
    and a controller acting on it cuts on noise. Preemptions always count since the previous scrape.
    """

    def __init__(
        self,
        replicas: Mapping[str, str],
        client: httpx.AsyncClient | None = None,
        timeout_s: float = 2.0,
        report_ttft: bool = True,
        clock: Clock = time.time,
        window_s: float | None = None,
    ) -> None:
        self.replicas = dict(replicas)
        self.client = client or httpx.AsyncClient()
        self.timeout_s = timeout_s
        self.report_ttft = report_ttft
        self.clock = clock
        self.window_s = _check_window(window_s)
        self._history: dict[str, deque[tuple[float, MetricsSnapshot]]] = {}

    async def observe(self) -> dict[str, Observation]:
        names = list(self.replicas)
        snaps = await asyncio.gather(
            *(scrape(self.client, self.replicas[n], self.timeout_s) for n in names),
            return_exceptions=True,
        )
        t = self.clock()
        return {n: self._observation(n, s, t) for n, s in zip(names, snaps, strict=True)}

    def _observation(
        self, name: str, snap: MetricsSnapshot | BaseException, t: float
    ) -> Observation:
        if isinstance(snap, BaseException):
            return Observation(t=t, replica=name, fresh=False)
        history = self._history.setdefault(name, deque())
        previous = history[-1][1] if history else None
        start = _window_start(history, t, self.window_s)
        history.append((t, snap))
        obs = Observation(
            t=t,
            replica=name,
            kv_usage=_mean_gauge(snap, KV_GAUGES),
            kv_capacity_tokens=kv_capacity_tokens(snap),
            running=int(snap.gauge("vllm:num_requests_running") or 0),
            waiting=int(snap.gauge("vllm:num_requests_waiting") or 0),
        )
        if start is None or previous is None:
            return obs
        t_start, before = start
        ttft = _window_p99(snap, before, (TTFT_HISTOGRAM,)) if self.report_ttft else None
        return replace(
            obs,
            chat_itl_p99_s=_window_p99(snap, before, ITL_HISTOGRAMS),
            chat_ttft_p99_s=ttft,
            preemptions=_counter_delta(snap, previous, "vllm:num_preemptions"),
            window_s=t - t_start if self.window_s is not None else None,
        )

    async def aclose(self) -> None:
        await self.client.aclose()


def _check_window(window_s: float | None) -> float | None:
    if window_s is not None and not (window_s > 0 and math.isfinite(window_s)):
        raise ValueError(f"sensor window_s must be a positive number of seconds, got {window_s}")
    return window_s


def _window_start(
    history: deque[tuple[float, MetricsSnapshot]], t: float, window_s: float | None
) -> tuple[float, MetricsSnapshot] | None:
    """The scrape a window ending at `t` starts from: the previous one without `window_s`, else
    the newest at least `window_s` old (the oldest kept while the history is shorter). Scrapes no
    window will start from again are dropped."""
    if not history:
        return None
    if window_s is None:
        start = history[-1]
        history.clear()
        return start
    while len(history) > 1 and history[1][0] <= t - window_s:
        history.popleft()
    return history[0]


def _window_p99(
    after: MetricsSnapshot, before: MetricsSnapshot, names: Iterable[str]
) -> float | None:
    """p99 of the observations made between two scrapes, trying metric names newest first."""
    for name in names:
        h = after.histogram(name)
        if h is not None:
            return histogram_quantile(histogram_delta(h, before.histogram(name)), 0.99)
    return None


def _counter_delta(after: MetricsSnapshot, before: MetricsSnapshot, name: str) -> int:
    """Increase of a counter; after an engine restart (counter went down) the new total."""
    a, b = after.counter(name), before.counter(name)
    return int(a - b if a >= b else a)


def _mean_gauge(snap: MetricsSnapshot, names: Iterable[str]) -> float | None:
    """A usage fraction averaged over engines (data-parallel engines each report their own)."""
    for name in names:
        values = [v for (n, _), v in snap.samples.items() if n == name]
        if values:
            return sum(values) / len(values)
    return None


def kv_capacity_tokens(snap: MetricsSnapshot) -> int | None:
    """KV tokens the replica holds: `num_gpu_blocks × block_size` from `vllm:cache_config_info`,
    summed over engines. None when the engine does not say."""
    total = 0
    for (name, labels), _ in snap.samples.items():
        if name != CACHE_INFO:
            continue
        info = dict(labels)
        try:
            total += int(info["num_gpu_blocks"]) * int(info["block_size"])
        except (KeyError, ValueError):
            continue
    return total or None


# -- streamed timings ---------------------------------------------------------------------------


@dataclass
class _Window:
    """Samples fed for one replica since the last observation, as (t, seconds) pairs."""

    chat_gaps: deque[tuple[float, float]]
    step_gaps: deque[tuple[float, float]]
    chat_ttfts: deque[tuple[float, float]]


class StreamedTimingsSensor:
    """Latency from the token timings our own clients streamed: exact, and split by class.

    Fed with finished records (`feed`), gaps of requests still streaming (`feed_gaps`) or TTFTs
    (`feed_ttft`). Each observation covers the samples fed since the previous one that are not older
    than `max_age_s` (a long request's early gaps are old news by the time it finishes). Chat ITL p99
    is token-weighted over all chat gaps, TTFT p99 request-weighted. Every gap of any class is also a
    step-time sample: all decoding sequences of a step wait that step's time. Sample times must be on
    this sensor's clock (epoch seconds, as the records carry). No KV or queue state: merge with an
    engine sensor for those. Always fresh, since nothing can fail to be read.

    With `window_s`, each observation covers the samples of the last `window_s` seconds instead
    (sliding, as `VllmMetricsSensor` does), so its p99s are the ones an SLO window judges.
    """

    def __init__(
        self,
        replicas: Iterable[str] = (),
        max_age_s: float = 30.0,
        max_step_samples: int = 1024,
        clock: Clock = time.time,
        window_s: float | None = None,
    ) -> None:
        self.window_s = _check_window(window_s)
        self.max_age_s = max_age_s
        self.max_step_samples = max_step_samples
        self.clock = clock
        self._windows: dict[str, _Window] = {}
        for name in replicas:
            self._window(name)

    def _window(self, replica: str) -> _Window:
        if replica not in self._windows:
            self._windows[replica] = _Window(deque(), deque(maxlen=self.max_step_samples), deque())
        return self._windows[replica]

    def feed(self, record: RequestRecord) -> None:
        """A finished (or failed) request with its gaps filled by `RequestRecord.finish`."""
        self.feed_gaps(record.replica, record.cls, ((g.t, g.gap_s) for g in record.gaps))
        if record.ttft_s is not None and record.t_first_token is not None:
            self.feed_ttft(record.replica, record.cls, record.t_first_token, record.ttft_s)

    def feed_gaps(self, replica: str, cls: str, gaps: Iterable[tuple[float, float]]) -> None:
        """Token gaps as (arrival time, gap seconds) pairs, e.g. while a request is still streaming."""
        w = self._window(replica)
        for t, gap_s in gaps:
            w.step_gaps.append((t, gap_s))
            if cls == "chat":
                w.chat_gaps.append((t, gap_s))

    def feed_ttft(self, replica: str, cls: str, t: float, ttft_s: float) -> None:
        """One request's time to first token; only chat TTFT is what the SLO is about."""
        if cls == "chat":
            self._window(replica).chat_ttfts.append((t, ttft_s))

    async def observe(self) -> dict[str, Observation]:
        t = self.clock()
        return {name: self._drain(name, w, t) for name, w in self._windows.items()}

    def _drain(self, name: str, w: _Window, t: float) -> Observation:
        sliding = self.window_s is not None
        oldest = t - (self.window_s if sliding else self.max_age_s)
        chat = _recent(w.chat_gaps, oldest, keep=sliding)
        ttfts = _recent(w.chat_ttfts, oldest, keep=sliding)
        steps = _recent(w.step_gaps, oldest, keep=sliding)
        return Observation(
            t=t,
            replica=name,
            chat_itl_p99_s=percentile(sorted(chat), 99) if chat else None,
            chat_ttft_p99_s=percentile(sorted(ttfts), 99) if ttfts else None,
            step_samples_s=tuple(steps),
            window_s=self.window_s,
        )


def _recent(samples: deque[tuple[float, float]], oldest: float, keep: bool) -> list[float]:
    """The values of samples no older than `oldest`; those samples stay queued when `keep` (a
    sliding window reads them again), else the queue is emptied."""
    recent = [(t, v) for t, v in samples if t >= oldest]
    samples.clear()
    if keep:
        samples.extend(recent)
    return [v for _, v in recent]


# -- Prometheus server ------------------------------------------------------------------------


class PrometheusSensor:
    """Reads replicas through a Prometheus server's `/api/v1/query`, over a `range` of rate().

    `replicas` maps a replica name to the label matchers that select its series, e.g.
    `instance="10.0.0.5:8000"`; a base URL is accepted too and becomes its `instance` matcher (the
    default target label of a static scrape config). A replica whose `up` is not 1, or any failed
    query, is reported stale. Prometheus's rate() window is longer than our interval, so its p99
    reacts more slowly than the other sensors: the price of not scraping replicas ourselves.
    """

    def __init__(
        self,
        base_url: str,
        replicas: Mapping[str, str],
        range_: str = "1m",
        client: httpx.AsyncClient | None = None,
        timeout_s: float = 2.0,
        clock: Clock = time.time,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.selectors = {name: _selector(v) for name, v in replicas.items()}
        self.range = range_
        self.client = client or httpx.AsyncClient()
        self.timeout_s = timeout_s
        self.clock = clock

    def queries(self, selector: str) -> dict[str, str]:
        """The PromQL behind each observation field, for one replica's label matchers."""
        r, s = self.range, selector

        def p99(metric: str) -> str:
            return f"histogram_quantile(0.99, sum by (le) (rate({metric}_bucket{{{s}}}[{r}])))"

        return {
            "up": f"min(up{{{s}}})",
            "itl": p99(ITL_HISTOGRAMS[0]),
            "ttft": p99(TTFT_HISTOGRAM),
            "kv": f"avg({KV_GAUGES[0]}{{{s}}})",
            "preemptions": f"sum(increase(vllm:num_preemptions_total{{{s}}}[{r}]))",
            "running": f"sum(vllm:num_requests_running{{{s}}})",
            "waiting": f"sum(vllm:num_requests_waiting{{{s}}})",
        }

    async def observe(self) -> dict[str, Observation]:
        names = list(self.selectors)
        results = await asyncio.gather(*(self._replica(n) for n in names), return_exceptions=True)
        t = self.clock()
        out = {}
        for name, res in zip(names, results, strict=True):
            fresh = not isinstance(res, BaseException) and res.get("up") == 1.0
            out[name] = _from_prometheus(t, name, res) if fresh else Observation(t, name, False)
        return out

    async def _replica(self, name: str) -> dict[str, float | None]:
        qs = self.queries(self.selectors[name])
        values = await asyncio.gather(*(self._scalar(q) for q in qs.values()))
        return dict(zip(qs, values, strict=True))

    async def _scalar(self, query: str) -> float | None:
        """The single value of an instant query; None for an empty result or NaN (no data)."""
        response = await self.client.get(
            f"{self.base_url}/api/v1/query", params={"query": query}, timeout=self.timeout_s
        )
        response.raise_for_status()
        body = response.json()
        if body.get("status") != "success":
            raise RuntimeError(f"Prometheus query failed: {body.get('error')} ({query})")
        result = body["data"]["result"]
        if not result:
            return None
        value = float(result[0]["value"][1])
        return None if math.isnan(value) else value

    async def aclose(self) -> None:
        await self.client.aclose()


def _selector(value: str) -> str:
    """Label matchers for a replica: kept as given, or `instance="host:port"` for a base URL."""
    if "://" in value:
        return f'instance="{urlparse(value).netloc}"'
    return value


def _from_prometheus(t: float, name: str, v: dict[str, float | None]) -> Observation:
    return Observation(
        t=t,
        replica=name,
        chat_itl_p99_s=v["itl"],
        chat_ttft_p99_s=v["ttft"],
        kv_usage=v["kv"],
        preemptions=round(v["preemptions"] or 0),
        running=int(v["running"] or 0),
        waiting=int(v["waiting"] or 0),
    )


# -- merging ------------------------------------------------------------------------------------


class MergedSensor:
    """Engine state (freshness, KV, queues, preemptions) from `state`, latency from `latency`
    wherever it measured something, else from `state`. The usual pairing is vLLM `/metrics` for
    state with our streamed timings for exact per-class latency."""

    def __init__(self, state: Sensor, latency: Sensor, itl_from_state: bool = False) -> None:
        self.state = state
        self.latency = latency
        self.itl_from_state = itl_from_state
        """Keep `state`'s ITL even where `latency` has one: on a host where the client shares a
        core with the engine's API server, streamed gaps arrive in bursts that the engine's own
        token timestamps (its ITL histogram) do not have."""

    async def observe(self) -> dict[str, Observation]:
        base, timed = await asyncio.gather(self.state.observe(), self.latency.observe())
        return {
            name: _merge(obs, timed.get(name), self.itl_from_state) for name, obs in base.items()
        }

    async def aclose(self) -> None:
        for sensor in (self.state, self.latency):
            close = getattr(sensor, "aclose", None)
            if close is not None:
                await close()


def _merge(obs: Observation, timed: Observation | None, itl_from_state: bool) -> Observation:
    if timed is None or not obs.fresh:
        return obs
    if itl_from_state:
        itl, steps = obs.chat_itl_p99_s, obs.step_samples_s
    else:
        itl = _first(timed.chat_itl_p99_s, obs.chat_itl_p99_s)
        steps = timed.step_samples_s or obs.step_samples_s
    return replace(
        obs,
        chat_itl_p99_s=itl,
        chat_ttft_p99_s=_first(timed.chat_ttft_p99_s, obs.chat_ttft_p99_s),
        chat_e2e_p99_s=_first(timed.chat_e2e_p99_s, obs.chat_e2e_p99_s),
        step_time_ratio=_first(timed.step_time_ratio, obs.step_time_ratio),
        engine_step_time_ratio=_first(timed.engine_step_time_ratio, obs.engine_step_time_ratio),
        target_bound_share=_first(timed.target_bound_share, obs.target_bound_share),
        chat_cache_tokens=_first(timed.chat_cache_tokens, obs.chat_cache_tokens),
        chat_answer_tokens_p99=_first(timed.chat_answer_tokens_p99, obs.chat_answer_tokens_p99),
        step_samples_s=steps,
        window_s=_widest(obs.window_s, timed.window_s),
    )


def _widest(a: float | None, b: float | None) -> float | None:
    """The longer of two reaches back in time; None (since the previous observation) is shortest."""
    return max((w for w in (a, b) if w is not None), default=None)


def _first(a: float | None, b: float | None) -> float | None:
    return a if a is not None else b
