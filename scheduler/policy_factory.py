"""The one place an admission policy is built from its name (docs/design.md §4.8).

The Gate, the simulator and the benchmarks all choose a policy by the same four names and build it
here, so a policy called `budget` is the same object whichever of them runs it:

- `none`: stock engine, batch at full concurrency (the `uncontrolled` bench scenario);
- `static`: stock engine, fixed seats and chunk size (`static-engine`);
- `budget`: the engine plug-in at a fixed batch step target and fixed seats (`static-budget`);
- `slo`: the plug-in steered by the SLO controller (`controlled`).

Pure: no file is read here; a caller with a latency fit on disk loads it first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from scheduler.admission import AdmissionPolicy, FixedBudget, NoAdmissionControl, StaticCaps
from scheduler.budget_controller import BudgetController, BudgetControllerConfig
from scheduler.slo import SLO
from scheduler.step import StepTimeModel

PolicyName = Literal["none", "static", "budget", "slo"]
POLICIES: tuple[PolicyName, ...] = ("none", "static", "budget", "slo")
STEERING: tuple[PolicyName, ...] = ("budget", "slo")
"""Policies that send the engine plug-in a batch step target, and so need a latency model."""


class PolicyError(ValueError):
    """A policy that cannot be built; the message names the setting and the fix."""


@dataclass(frozen=True)
class PolicyChoice:
    """A policy by name with the fixed settings of the baselines.

    `seats` are the batch seats of `static` and `budget`; `chunk_tokens` the chunk of `static`;
    `target_ms` the batch step target of `budget`. `slo` ignores all three: it sets its own."""

    name: PolicyName = "slo"
    seats: int = 4
    chunk_tokens: int = 2048
    target_ms: float = 40.0

    def __post_init__(self) -> None:
        check_policy_name(self.name)

    @property
    def steers_engine(self) -> bool:
        return self.name in STEERING


def check_policy_name(name: str, option: str = "policy") -> PolicyName:
    """`name` when it is one of `POLICIES`, else an error that lists them."""
    if name not in POLICIES:
        raise PolicyError(f"unknown {option} {name!r}; use one of {', '.join(POLICIES)}")
    return name  # type: ignore[return-value]


def make_policy(
    choice: PolicyChoice,
    slo: SLO,
    model: StepTimeModel | None = None,
    controller: BudgetControllerConfig | None = None,
    engine_slots: int | None = None,
    slack_marks: Mapping[str, float] | None = None,
) -> AdmissionPolicy:
    """The admission policy `choice` names. One object serves every replica: the controller keeps
    its state per replica. `engine_slots` is the replicas' `max-num-seqs`, of which the controller
    leaves chat its share; `model` prices steps and is needed by `slo` only; `slack_marks` are
    the replicas' slack marks as earlier runs left them (`slo` only)."""
    if choice.name == "none":
        return NoAdmissionControl()
    if choice.name == "static":
        return StaticCaps(choice.seats, choice.chunk_tokens)
    if choice.name == "budget":
        return FixedBudget(choice.seats, choice.target_ms)
    if model is None:
        raise PolicyError(
            "policy 'slo' needs latency_model: a LatencyModel JSON path (fit one with "
            "`nightshift calibrate`, or save scheduler.latency_model.roofline_model(...))"
        )
    return BudgetController(slo, model, controller, engine_slots, slack_marks)
