"""How a Gate is put together: which admission policy it runs and which sensor feeds it.

Kept apart from the actor so that the caller can check its arguments (and fail with a message that
says what to change) before a Ray actor is created, where an error would surface only later.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from scheduler.admission import AdmissionPolicy, NoAdmissionControl, StaticCaps
from scheduler.controller import ControllerConfig, SLOController, controller_config
from scheduler.slo import SLO
from scheduler.step import StepTimeModel
from serving.sensors import (
    MergedSensor,
    PrometheusSensor,
    Sensor,
    StreamedTimingsSensor,
    VllmMetricsSensor,
)

PolicyName = Literal["slo", "static", "none"]


def build_policy(
    policy: PolicyName,
    slo: SLO,
    controller: ControllerConfig | None = None,
    latency_model: str | Path | StepTimeModel | None = None,
    static_caps: tuple[int, int] = (4, 2048),
    engine_flags: Mapping[str, Any] | None = None,
) -> AdmissionPolicy:
    """The admission policy a Gate runs: the SLO controller, or a baseline for comparison.

    `engine_flags` are the replicas' engine config `vllm:` flags: from them the controller learns
    the engine's step size, which prices batch prompts as the engine runs them and turns on the
    TTFT guard (see `controller_config`)."""
    if policy == "none":
        return NoAdmissionControl()
    if policy == "static":
        return StaticCaps(*static_caps)
    if policy != "slo":
        raise ValueError(f"unknown policy {policy!r}; use one of 'slo', 'static', 'none'")
    if latency_model is None:
        raise ValueError(
            "policy 'slo' needs latency_model: a LatencyModel JSON path (fit one with "
            "`nightshift calibrate`, or save scheduler.latency_model.roofline_model(...))"
        )
    if isinstance(latency_model, str | Path):
        from scheduler.latency_model import LatencyModel

        latency_model = LatencyModel.from_json(latency_model)
    return SLOController(slo, latency_model, controller_config(controller, engine_flags))


def build_sensor(
    spec: Mapping[str, Any] | Sensor, replicas: Mapping[str, str], streamed: StreamedTimingsSensor
) -> Sensor:
    """A sensor from a spec: `{"kind": "vllm", "report_ttft": bool}`, `{"kind": "prometheus",
    "url": ..., "range": "1m"}`, `{"kind": "streamed"}`, or any Sensor object. Engine sensors are
    merged with the streamed timings that `release` and `report` feed, for exact chat latency.

    Two more keys apply to `vllm`: `window_s` makes its p99s (and the streamed ones) span that many
    seconds, sliding (see `VllmMetricsSensor`); `"itl": "engine"` takes ITL from the engine's
    histogram even where chat gaps were streamed (default `"streamed"`). The streamed sensor gets
    its window where the Gate creates it, from `sensor_window_s(spec)`."""
    if not isinstance(spec, Mapping):
        return MergedSensor(spec, streamed)
    kind = check_sensor_spec(spec)
    if kind == "streamed":
        return streamed
    if kind == "vllm":
        state = VllmMetricsSensor(
            replicas, report_ttft=spec.get("report_ttft", True), window_s=spec.get("window_s")
        )
        return MergedSensor(state, streamed, itl_from_state=spec.get("itl") == "engine")
    state = PrometheusSensor(spec["url"], replicas, range_=spec.get("range", "1m"))
    return MergedSensor(state, streamed)


def sensor_window_s(spec: Mapping[str, Any] | Sensor | None) -> float | None:
    """The sliding window a sensor spec asks for, or None (each observation covers the time since
    the previous one)."""
    return spec.get("window_s") if isinstance(spec, Mapping) else None


def check_sensor_spec(spec: Mapping[str, Any] | Sensor) -> str:
    """The sensor kind a spec names, or an error saying what a valid spec looks like."""
    if not isinstance(spec, Mapping):
        return "object"
    kind = spec.get("kind", "vllm")
    if kind not in ("vllm", "prometheus", "streamed"):
        raise ValueError(f"unknown sensor kind {kind!r}; use 'vllm', 'prometheus' or 'streamed'")
    if kind == "prometheus" and "url" not in spec:
        raise ValueError("sensor kind 'prometheus' needs 'url', the Prometheus server's base URL")
    if spec.get("itl", "streamed") not in ("streamed", "engine"):
        raise ValueError(f"sensor 'itl' {spec['itl']!r}: use 'streamed' or 'engine'")
    window = spec.get("window_s")
    if window is not None and not (isinstance(window, int | float) and window > 0):
        raise ValueError(f"sensor 'window_s' {window!r}: give a positive number of seconds")
    return kind


def check_interval(policy: AdmissionPolicy, interval_s: float) -> None:
    """The controller treats a replica as stale after `stale_after_s` without a fresh observation,
    so polling less often than that would pause batch between every two polls."""
    if isinstance(policy, SLOController) and interval_s >= policy.config.stale_after_s:
        raise ValueError(
            f"interval_s {interval_s} must be below the controller's stale_after_s "
            f"{policy.config.stale_after_s}; poll more often or raise stale_after_s"
        )
