"""How a Gate is put together: which admission policy it runs and which sensor feeds it.

Kept apart from the actor so that the caller can check its arguments (and fail with a message that
says what to change) before a Ray actor is created, where an error would surface only later.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from pipelines.seat_leases import DEFAULT_LEASE_S
from scheduler.admission import AdmissionPolicy
from scheduler.budget_controller import BudgetControllerConfig
from scheduler.latency_model import LatencyModel
from scheduler.policy_factory import (
    PolicyChoice,
    PolicyName,
    check_policy_name,
    make_policy,
)
from scheduler.slo import SLO
from scheduler.step import StepTimeModel
from serving.engine_control import ControlTarget
from serving.plugin_sensor import PluginStatusSensor
from serving.prometheus_selectors import DEFAULT_SELECTOR, check_template, replica_selectors
from serving.replica_auth import ReplicaAuth
from serving.sensors import (
    MergedSensor,
    PrometheusSensor,
    Sensor,
    StreamedTimingsSensor,
    VllmMetricsSensor,
)

DEFAULT_DOWN_GRACE_S = 300.0
"""A replica restart's worth of waiting, model load and warm-up included (a 70B replica on GPUs
takes minutes; cpu-tiny here ~30 s)."""


def build_policy(
    policy: PolicyName,
    slo: SLO,
    controller: BudgetControllerConfig | None = None,
    latency_model: str | Path | StepTimeModel | None = None,
    static_caps: tuple[int, int] = (4, 2048),
    engine_flags: Mapping[str, Any] | None = None,
    budget: tuple[int, float] = (4, 40.0),
    slack_marks: Mapping[str, float] | None = None,
) -> AdmissionPolicy:
    """The admission policy a Gate runs, built by `scheduler.policy_factory` like the simulator's.

    `engine_flags` are the replicas' engine config `vllm:` flags: the controller leaves chat its
    share of their `max-num-seqs`. `budget` is (seats, batch step target ms) of policy `budget`;
    `slack_marks` the replicas' slack marks as earlier runs left them (`slo`)."""
    check_policy_name(policy)
    seats = budget[0] if policy == "budget" else static_caps[0]
    choice = PolicyChoice(policy, seats, static_caps[1], budget[1])
    model = load_latency_model(policy, latency_model) if policy == "slo" else None
    slots = (engine_flags or {}).get("max-num-seqs")
    return make_policy(choice, slo, model, controller, int(slots) if slots else None, slack_marks)


def load_latency_model(
    policy: str, latency_model: str | Path | StepTimeModel | None
) -> StepTimeModel:
    """The step-time model the plug-in prices chunks with under `policy`."""
    if latency_model is None:
        raise ValueError(
            f"policy {policy!r} needs latency_model: a LatencyModel JSON path (fit one with "
            "`nightshift calibrate`, or save scheduler.latency_model.roofline_model(...))"
        )
    if isinstance(latency_model, str | Path):
        return LatencyModel.from_json(latency_model)
    return latency_model


def build_sensor(
    spec: Mapping[str, Any] | Sensor,
    replicas: Mapping[str, str],
    streamed: StreamedTimingsSensor,
    plugin: PluginStatusSensor | None = None,
    headers: Mapping[str, str] | None = None,
) -> Sensor:
    """`engine_sensor(...)`, with chat latency and step ratios taken first from the replicas'
    engine plug-in (`plugin`) wherever it has measured them: chat's own numbers."""
    sensor = engine_sensor(spec, replicas, streamed, headers)
    return sensor if plugin is None else MergedSensor(sensor, plugin)


def plugin_sensor(
    targets: Mapping[str, ControlTarget] | None, spec: Mapping[str, Any] | Sensor | None
) -> PluginStatusSensor | None:
    """The plug-in status sensor for `targets`, windowed like the spec's sensor; None without."""
    return PluginStatusSensor(targets, window_s=sensor_window_s(spec)) if targets else None


def engine_sensor(
    spec: Mapping[str, Any] | Sensor,
    replicas: Mapping[str, str],
    streamed: StreamedTimingsSensor,
    headers: Mapping[str, str] | None = None,
) -> Sensor:
    """A sensor from a spec: `{"kind": "vllm", "report_ttft": bool}`, `{"kind": "prometheus",
    "url": ..., "selector": 'instance="{instance}"', "range": "1m"}` (the selector a template
    filled in per replica, `serving.prometheus_selectors`; the range by default `window_s`),
    `{"kind": "streamed"}`, or any Sensor object. Engine sensors are
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
            replicas,
            client=httpx.AsyncClient(headers=dict(headers)) if headers else None,
            report_ttft=spec.get("report_ttft", True),
            window_s=spec.get("window_s"),
        )
        return MergedSensor(state, streamed, itl_from_state=spec.get("itl") == "engine")
    state = PrometheusSensor(
        spec["url"],
        replica_selectors(spec.get("selector", DEFAULT_SELECTOR), replicas.items()),
        range_=spec.get("range") or prometheus_range(spec.get("window_s")),
    )
    return MergedSensor(state, streamed)


def prometheus_range(window_s: float | None) -> str:
    """The rate() range of the Prometheus sensor: the SLO's window, the span the SLO judges."""
    return "1m" if window_s is None else f"{window_s:g}s"


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
    if kind == "prometheus":
        check_template(spec.get("selector", DEFAULT_SELECTOR))
    if spec.get("itl", "streamed") not in ("streamed", "engine"):
        raise ValueError(f"sensor 'itl' {spec['itl']!r}: use 'streamed' or 'engine'")
    window = spec.get("window_s")
    if window is not None and not (isinstance(window, int | float) and window > 0):
        raise ValueError(f"sensor 'window_s' {window!r}: give a positive number of seconds")
    return kind


def check_interval(
    policy: str, controller: BudgetControllerConfig | None, interval_s: float
) -> None:
    """The controller treats a replica as stale after `stale_after_s` without a fresh observation,
    so polling less often than that would pause batch between every two polls."""
    if policy != "slo":
        return
    stale = (controller or BudgetControllerConfig()).stale_after_s
    if interval_s >= stale:
        raise ValueError(
            f"interval_s {interval_s} must be below the controller's stale_after_s "
            f"{stale}; poll more often or raise stale_after_s"
        )


@dataclass(frozen=True)
class GateConfig:
    """Every setting of a Gate in one frozen value, checked once by `check` in the caller, before
    a Ray actor exists (an error inside the actor would surface only at its first call).

    `static_caps` are (seats, chunk tokens) of policy `static`, `budget` (seats, batch step
    target ms) of policy `budget`; `engine_flags` are the replicas' `vllm:` flags, of whose
    `max-num-seqs` the controller leaves chat its share; `sensor` is a spec (`engine_sensor`) or
    a Sensor, the vLLM `/metrics` sensor when None; `control_targets` are where the control
    documents of steering policies go, by replica."""

    slo: SLO = field(default_factory=SLO)
    policy: PolicyName = "slo"
    controller: BudgetControllerConfig | None = None
    latency_model: str | Path | StepTimeModel | None = None
    static_caps: tuple[int, int] = (4, 2048)
    budget: tuple[int, float] = (4, 40.0)
    sensor: Mapping[str, Any] | Sensor | None = None
    interval_s: float = 5.0
    metrics_port: int | None = None
    engine_flags: Mapping[str, Any] | None = None
    control_targets: Mapping[str, ControlTarget] | None = None
    auth: ReplicaAuth | None = None
    """API key and headers for the replicas' routes; never logged (`serving/replica_auth.py`)."""
    journal: str | Path | None = None
    """File the Gate appends every grant and release to, before it takes effect
    (`pipelines/request_journal.py`); the run folder's, so the Gate runs on the driver's node."""
    lease_s: float = DEFAULT_LEASE_S
    """How long a worker's seats outlive its last word (`pipelines/seat_leases.py`)."""
    down_grace_s: float = DEFAULT_DOWN_GRACE_S
    """How long requests wait for a replica to answer again once every replica is marked down,
    before they fail: a replica restarted under its URL within it resumes the night."""
    slack_marks: Mapping[str, float] | None = None
    """Each replica's slack mark as earlier runs left it (`pipelines/slack_marks.py`); the
    controller starts a replica not named at its `slack_fraction`."""

    def __post_init__(self) -> None:
        if self.slo is None:  # callers pass slo=None for "the default SLO"
            object.__setattr__(self, "slo", SLO())

    def build_policy(self) -> AdmissionPolicy:
        return build_policy(
            self.policy, self.slo, self.controller, self.latency_model, self.static_caps,
            self.engine_flags, self.budget, self.slack_marks,
        )  # fmt: skip

    def check(self) -> None:
        """Raise ValueError naming the setting and the fix for anything the Gate would refuse."""
        self.build_policy()
        if not self.lease_s > 0:
            raise ValueError(f"lease_s {self.lease_s} must be positive seconds; the default is "
                             f"{DEFAULT_LEASE_S}")  # fmt: skip
        if not self.down_grace_s >= 0:
            raise ValueError(f"down_grace_s {self.down_grace_s} must be seconds, 0 or more; the "
                             f"default is {DEFAULT_DOWN_GRACE_S}")  # fmt: skip
        check_interval(self.policy, self.controller, self.interval_s)
        check_sensor_spec(self.sensor or {})
