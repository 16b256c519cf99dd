"""Prometheus exporter for the Gate: what the controller decided and what it saw, per replica.

A dedicated CollectorRegistry keeps these series apart from anything else in the process (Ray's own
metrics, a second Gate in tests), and lets the exporter run without touching the global registry.
A run serves them on its own metrics port (`exposition()`, relayed by `pipelines.run_metrics`), so
one scrape target holds the whole night; `serve` remains for a Gate used on its own.

Chat's own latency histograms are the engine plug-in's (its status document, cumulative since the
engine started like any Prometheus counter), exported as they are read: chat judged by chat's
numbers on dashboards too, where vLLM's histograms mix in batch tokens.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, start_http_server
from prometheus_client.core import HistogramMetricFamily, Metric

from scheduler.admission import Decision, Observation
from scheduler.slo import SLO

CHAT_HISTOGRAMS = {
    "chat_itl_seconds": ("nightshift_chat_itl_seconds", "Chat inter-token gaps, in the engine."),
    "chat_ttft_seconds": (
        "nightshift_chat_ttft_seconds",
        "Chat time to first token from arrival, in the engine.",
    ),
    "chat_e2e_seconds": (
        "nightshift_chat_e2e_seconds",
        "Chat time from arrival to last token, in the engine.",
    ),
    "chat_answer_tokens": ("nightshift_chat_answer_tokens", "Chat answer lengths, in tokens."),
}
"""Status document key -> exported histogram name and help."""


class PluginHistograms:
    """A collector of the chat histograms in each replica's latest plug-in status document."""

    def __init__(self) -> None:
        self.latest: dict[str, dict] = {}

    def collect(self) -> Iterator[Metric]:
        for key, (name, help_text) in CHAT_HISTOGRAMS.items():
            family = HistogramMetricFamily(name, help_text, labels=["replica"])
            for replica, doc in sorted(self.latest.items()):
                h = doc.get(key)
                if not h:
                    continue
                buckets = [
                    (repr(float(b)), c) for b, c in zip(h["bounds"], h["cumulative"], strict=False)
                ]
                buckets.append(("+Inf", h["count"]))
                family.add_metric([replica], buckets, h["sum"])
            yield family


class GateMetrics:
    """Gauges of the current caps and observations, and a counter of decisions by reason."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.batch_seats = Gauge(
            "nightshift_batch_seats", "Batch sequences a replica may run.", ["replica"], registry=r
        )
        self.step_target = Gauge(
            "nightshift_batch_step_target_seconds",
            "Step time the engine plug-in sizes batch prefill chunks to (NaN: stock engine).",
            ["replica"],
            registry=r,
        )
        self.tokens_per_step = Gauge(
            "nightshift_batch_tokens_per_step",
            "Batch prefill tokens per engine step that carried batch, as the plug-in counted.",
            ["replica"],
            registry=r,
        )
        self.kv_room = Gauge(
            "nightshift_kv_room_tokens",
            "KV tokens new batch requests may claim (NaN: not bounded).",
            ["replica"],
            registry=r,
        )
        self.last_decision = Gauge(
            "nightshift_controller_last_decision_timestamp_seconds",
            "When the controller last decided (Unix time).",
            registry=r,
        )
        self.paused = Gauge(
            "nightshift_batch_paused", "1 while new batch work is paused.", ["replica"], registry=r
        )
        self.in_flight = Gauge(
            "nightshift_batch_in_flight", "Batch permits held.", ["replica"], registry=r
        )
        self.chat_itl_p99 = Gauge(
            "nightshift_chat_itl_p99_seconds",
            "Observed window chat ITL p99.",
            ["replica"],
            registry=r,
        )
        self.chat_ttft_p99 = Gauge(
            "nightshift_chat_ttft_p99_seconds",
            "Observed window chat TTFT p99.",
            ["replica"],
            registry=r,
        )
        self.chat_e2e_p99 = Gauge(
            "nightshift_chat_e2e_p99_seconds",
            "Observed window chat end-to-end p99.",
            ["replica"],
            registry=r,
        )
        self.kv_usage = Gauge(
            "nightshift_kv_usage", "Observed KV cache usage (0..1).", ["replica"], registry=r
        )
        self.chat_cache = Gauge(
            "nightshift_chat_cache_tokens",
            "Chat's prefix-cache working set the KV guard keeps room for (tokens).",
            ["replica"],
            registry=r,
        )
        self.step_mean = Gauge(
            "nightshift_batch_step_mean_seconds",
            "Mean step time batch keeps to beside chat under an E2E SLO (NaN: none).",
            ["replica"],
            registry=r,
        )
        self.slack_mark = Gauge(
            "nightshift_slack_mark",
            "Chat pressure (p99 over SLO) the controller grows the target to (NaN: no such mark).",
            ["replica"],
            registry=r,
        )
        self.decisions = Counter(
            "nightshift_decisions", "Controller decisions by reason.", ["reason"], registry=r
        )
        self.slo_itl = Gauge(
            "nightshift_slo_chat_itl_p99_seconds", "The run's chat ITL p99 SLO.", registry=r
        )
        self.slo_ttft = Gauge(
            "nightshift_slo_chat_ttft_p99_seconds", "The run's chat TTFT p99 SLO.", registry=r
        )
        self.slo_e2e = Gauge(
            "nightshift_slo_chat_e2e_p99_seconds",
            "The run's chat end-to-end p99 SLO (NaN: none).",
            registry=r,
        )
        self.chat = PluginHistograms()
        r.register(self.chat)
        self._server = None

    def set_slo(self, slo: SLO) -> None:
        self.slo_itl.set(slo.chat_itl_p99_ms / 1000)
        self.slo_ttft.set(slo.chat_ttft_p99_ms / 1000)
        e2e = slo.chat_e2e_p99_ms
        self.slo_e2e.set(float("nan") if e2e is None else e2e / 1000)

    def record_status(self, replica: str, doc: dict) -> None:
        """The replica's latest plug-in status document, for the chat histograms."""
        self.chat.latest[replica] = doc

    def exposition(self) -> bytes:
        """Every series in the text format, for a scrape served elsewhere."""
        return generate_latest(self.registry)

    def record(self, obs: Observation, decision: Decision, in_flight: int) -> None:
        """Export one decision and the observation it was made on."""
        name = obs.replica
        self.batch_seats.labels(name).set(decision.batch_seats)
        self.paused.labels(name).set(1 if decision.pause else 0)
        self.in_flight.labels(name).set(in_flight)
        self.decisions.labels(decision.reason or "none").inc()
        self.last_decision.set(obs.t)
        target, mean = decision.batch_step_target_ms, decision.mean_step_target_ms
        for gauge, value in (
            (self.step_target, None if target is None else target / 1000),
            (self.step_mean, None if mean is None else mean / 1000),
            (self.kv_room, decision.kv_room_tokens),
            (self.chat_itl_p99, obs.chat_itl_p99_s),
            (self.chat_ttft_p99, obs.chat_ttft_p99_s),
            (self.chat_e2e_p99, obs.chat_e2e_p99_s),
            (self.kv_usage, obs.kv_usage),
            (self.chat_cache, obs.chat_cache_tokens),
            (self.slack_mark, decision.slack_mark),
        ):
            # NaN, not a stale number, when the window measured nothing (or nothing bounds it)
            gauge.labels(name).set(float("nan") if value is None else value)

    def record_steps(self, row: dict) -> None:
        """Export the plug-in's latest status read (an `engine_steps` row)."""
        self.tokens_per_step.labels(row["replica"]).set(row["batch_tokens_per_step"])

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Start the HTTP exporter on `addr`, loopback unless told otherwise (as the run's own
        metrics); returns the bound port (pass 0 to let the OS pick one)."""
        self._server, _ = start_http_server(port, addr=addr, registry=self.registry)
        return self._server.server_port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
