"""Prometheus exporter for the Gate: what the controller decided and what it saw, per replica.

A dedicated CollectorRegistry keeps these series apart from anything else in the process (Ray's own
metrics, a second Gate in tests), and lets the exporter run without touching the global registry.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from scheduler.admission import Decision, Observation


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
        self.kv_usage = Gauge(
            "nightshift_kv_usage", "Observed KV cache usage (0..1).", ["replica"], registry=r
        )
        self.decisions = Counter(
            "nightshift_decisions", "Controller decisions by reason.", ["reason"], registry=r
        )
        self._server = None

    def record(self, obs: Observation, decision: Decision, in_flight: int) -> None:
        """Export one decision and the observation it was made on."""
        name = obs.replica
        self.batch_seats.labels(name).set(decision.batch_seats)
        self.paused.labels(name).set(1 if decision.pause else 0)
        self.in_flight.labels(name).set(in_flight)
        self.decisions.labels(decision.reason or "none").inc()
        self.last_decision.set(obs.t)
        target = decision.batch_step_target_ms
        for gauge, value in (
            (self.step_target, None if target is None else target / 1000),
            (self.kv_room, decision.kv_room_tokens),
            (self.chat_itl_p99, obs.chat_itl_p99_s),
            (self.chat_ttft_p99, obs.chat_ttft_p99_s),
            (self.kv_usage, obs.kv_usage),
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
