"""Prometheus metrics of a run: per-class latency histograms and batch progress.

Served on an HTTP port while the run lasts (Prometheus scrapes it beside vLLM's own `/metrics`),
and pushed to a Pushgateway at the end when one is configured, so a nightly job that exits still
leaves its totals behind.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    push_to_gateway,
    start_http_server,
)

from scheduler.records import RequestRecord

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
        self.port: int | None = None

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Expose the metrics on `port` (0 picks a free one) of `addr`, loopback unless told
        otherwise: a Prometheus on this host scrapes it, and nothing off the host should see a
        run's figures by default. Returns the port."""
        server, _ = start_http_server(port, addr=addr, registry=self.registry)
        self.port = server.server_port
        return self.port

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

    def push(self, gateway: str) -> None:
        push_to_gateway(
            gateway, job="nightshift", registry=self.registry, grouping_key={"run_id": self.run_id}
        )
