"""Prometheus metrics of a run: per-class latency histograms, batch progress and the night's state.

Served on one HTTP port while the night lasts (Prometheus scrapes it beside vLLM's own `/metrics`),
with the Gate's series relayed onto the same port (`relay`), so one scrape target holds the whole
night wherever Ray placed the Gate. With a Pushgateway the night is pushed when it starts and when
it ends: a night that dies unseen still reads as running (and its alerts fire), and the end leaves
`nightshift_last_success_timestamp_seconds` and `nightshift_night_failed` behind after the job
exits. Pushes add to one group (`job="nightshift"`), so the last night's values replace the one
before and a success clears a failure.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    pushadd_to_gateway,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from scheduler.records import RequestRecord

log = logging.getLogger("nightshift.metrics")
PUSH_JOB = "nightshift"

# Fine around chat SLOs both on this CPU (milliseconds) and on GPUs (tens of ms, ~1 s TTFT).
ITL_BUCKETS = (
    0.002,
    0.004,
    0.006,
    0.008,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.06,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    1.0,
    2.5,
    5.0,
)
TTFT_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)


NIGHT_GAUGES = {
    "running": ("nightshift_night_running", "1 while tonight's job runs, 0 once it ended."),
    "deadline": (
        "nightshift_night_deadline_timestamp_seconds",
        "When batch admission stops tonight (Unix time).",
    ),
    "failed": ("nightshift_night_failed", "1 when the last night ended in an error."),
    "partial": (
        "nightshift_night_partial",
        "1 when the last night stopped at its deadline with documents left to do.",
    ),
    "last_success": (
        "nightshift_last_success_timestamp_seconds",
        "When a night last finished every document it could (Unix time).",
    ),
}
NIGHT_OUTCOMES = ("success", "partial", "failed")


class NightState:
    """The night's gauges; one never set is not exported at all, since a 0 would read as a
    deadline in 1970 or a success that never happened."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def collect(self) -> Iterator[Metric]:
        for key, (name, help_text) in NIGHT_GAUGES.items():
            if key in self.values:
                yield GaugeMetricFamily(name, help_text, value=self.values[key])


class Relay:
    """Series fetched from elsewhere at every scrape (the Gate actor's exposition); nothing when
    the source fails, so a gone Gate leaves its series absent, not frozen."""

    def __init__(self) -> None:
        self.fetch: Callable[[], bytes] | None = None

    def collect(self) -> Iterator[Metric]:
        fetch = self.fetch
        if fetch is None:
            return
        try:
            text = fetch().decode()
        except Exception as exc:  # a scrape must answer even when the Gate does not
            log.debug("relayed metrics unavailable: %s", exc)
            return
        yield from text_string_to_metric_families(text)


class RunMetrics:
    """The run's collectors, on a registry of their own."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.registry = CollectorRegistry()
        self.ttft = Histogram(
            "nightshift_request_ttft_seconds",
            "Time to first token.",
            ["class"],
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.itl = Histogram(
            "nightshift_request_itl_seconds",
            "Gap between streamed tokens.",
            ["class"],
            buckets=ITL_BUCKETS,
            registry=self.registry,
        )
        self.docs = Counter(
            "nightshift_batch_documents",
            "Documents finished, by status.",
            ["status"],
            registry=self.registry,
        )
        self.tokens = Counter(
            "nightshift_batch_tokens", "Batch prompt plus output tokens.", registry=self.registry
        )
        self.remaining = Gauge(
            "nightshift_batch_documents_remaining", "Documents still to do.", registry=self.registry
        )
        self.night = NightState()
        self.registry.register(self.night)
        self.relayed = Relay()
        self.registry.register(self.relayed)
        self.port: int | None = None
        self._server = None

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Expose the metrics on `port` (0 picks a free one) of `addr` until `close`, loopback
        unless told otherwise: a Prometheus on this host scrapes it, and nothing off the host
        should see a run's figures by default. Returns the port."""
        self._server, _ = start_http_server(port, addr=addr, registry=self.registry)
        self.port = self._server.server_port
        return self.port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def relay(self, fetch: Callable[[], bytes] | None) -> None:
        """Serve the series `fetch` returns (text format) with the run's; None stops."""
        self.relayed.fetch = fetch

    def night_started(self, deadline_ts: float | None = None) -> None:
        self.night.values["running"] = 1
        if deadline_ts is not None:
            self.night.values["deadline"] = deadline_ts

    def night_ended(self, outcome: str, now: float) -> None:
        """`success`: every document done or refused for its content; `partial`: stopped at the
        deadline with documents left; `failed`: the job raised."""
        if outcome not in NIGHT_OUTCOMES:
            raise ValueError(f"night outcome {outcome!r}: use one of {', '.join(NIGHT_OUTCOMES)}")
        self.night.values.update(running=0, failed=float(outcome == "failed"))
        self.night.values["partial"] = float(outcome == "partial")
        if outcome == "success":
            self.night.values["last_success"] = now

    def observe_request(self, row: dict, gaps: list[float]) -> None:
        cls = row["class"]
        if row.get("ttft_s") is not None:
            self.ttft.labels(cls).observe(row["ttft_s"])
        for g in gaps:
            self.itl.labels(cls).observe(g)

    def observe_record(self, record: RequestRecord) -> None:
        self.observe_request(record.row(), [g.gap_s for g in record.gaps])

    def document_done(self, status: str, batch_tokens: int) -> None:
        self.docs.labels(status).inc()
        self.tokens.inc(batch_tokens)
        self.remaining.dec()

    def documents_stopped(self, count: int) -> None:
        """`count` documents the stopped night never started, counted as their outcomes would be."""
        self.docs.labels("stopped").inc(count)
        self.remaining.dec(count)

    def documents_refused(self, rows: list[dict]) -> None:
        """Documents judged unusable before any request (their rows carry `status`)."""
        for row in rows:
            self.docs.labels(row["status"]).inc()

    def push(self, gateway: str) -> None:
        """Add the run's series to the `nightshift` group of the Pushgateway at `gateway`."""
        pushadd_to_gateway(gateway, job=PUSH_JOB, registry=self.registry)


class NightOutcome:
    """How the night inside `serving_night` ended; the block sets `value` when it finishes, and
    anything else (an exception, a block that forgot) reads as `failed`."""

    def __init__(self) -> None:
        self.value = "failed"


class PushError(RuntimeError):
    """The Pushgateway did not take the night's metrics; the message names it."""


@contextlib.contextmanager
def serving_night(
    metrics: RunMetrics,
    port: int | None = None,
    pushgateway: str | None = None,
    deadline_ts: float | None = None,
    clock: Callable[[], float] = time.time,
) -> Iterator[NightOutcome]:
    """The night's metrics for the duration of the block: served on `port`, pushed at the start
    and the end, and the server stopped on any exit. A Pushgateway that refuses the first push
    fails the night before any work (a wrong address would otherwise hide every result); one that
    refuses the last is logged, since the night's work is done by then."""
    if port is not None:
        metrics.serve(port)
    outcome = NightOutcome()
    try:
        metrics.night_started(deadline_ts)
        if pushgateway:
            try:
                metrics.push(pushgateway)
            except OSError as exc:
                gateway, pushgateway = pushgateway, None  # no second try at the end
                raise PushError(
                    f"--pushgateway {gateway} did not take the night's metrics ({exc}); "
                    "check its address, or leave it out"
                ) from None
        yield outcome
    finally:
        metrics.relay(None)
        metrics.night_ended(outcome.value, clock())
        try:
            if pushgateway:
                metrics.push(pushgateway)
        except OSError as exc:
            log.warning("could not push the night's end to %s: %s", pushgateway, exc)
        finally:
            metrics.close()
