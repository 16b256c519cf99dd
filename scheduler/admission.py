"""The admission interface: what a policy observes about a replica and what it decides (docs/design.md §4.7).

A policy is pure and clock-agnostic: `decide(observation) -> decision`. The simulator feeds it
observations stamped with virtual time, the Gate with wall time; neither the policy nor these types
know the difference. Two trivial policies live here as baselines for benchmarks; the SLO-aware
controller implements the same protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Protocol


@dataclass(frozen=True, slots=True)
class BatchInFlight:
    """One admitted batch request on the replica: how far its prompt has been prefilled."""

    prompt_tokens: int
    prefilled_tokens: int = 0
    output_tokens: int = 0
    """Output tokens it may still add to KV (its `max_tokens`): part of what its KV will need."""

    @property
    def prefill_remaining(self) -> int:
        return max(0, self.prompt_tokens - self.prefilled_tokens)


@dataclass(frozen=True, slots=True)
class Observation:
    """What the sensors saw on one replica over the last window.

    Latency fields are None when the window held no chat traffic of that kind; `fresh` is False when
    the sensor could not read the replica this time (the controller must then fail safe).
    """

    t: float
    replica: str
    fresh: bool = True
    chat_itl_p99_s: float | None = None
    chat_ttft_p99_s: float | None = None
    kv_usage: float | None = None
    preemptions: int = 0
    running: int = 0
    waiting: int = 0
    chat_decoding: int = 0
    chat_decode_context_tokens: int = 0
    batch_in_flight: tuple[BatchInFlight, ...] = ()
    step_samples_s: tuple[float, ...] = field(default=(), repr=False)
    # KV the replica holds, in tokens: lets the KV guard count admitted prompts not yet prefilled
    kv_capacity_tokens: int | None = None
    window_s: float | None = None
    """How far back from `t` the latency p99s reach; None: since the previous observation."""
    chat_e2e_p99_s: float | None = None
    step_time_ratio: float | None = None
    """Measured over predicted engine-step time in the window (the engine plug-in's status)."""
    engine_step_time_ratio: float | None = None
    """The same ratio over every batch step the engine has timed since it started: the replica's
    own record of how far the model is off on its host, runs before this one included."""
    target_bound_share: float | None = None
    """Share of the window's engine steps in which the batch step target held a batch prefill
    back, so ran at the target (None: the sensor cannot tell)."""
    chat_cache_tokens: int | None = None
    """Chat's prefix-cache working set: KV tokens chat left cached within the decision's
    `chat_cache_horizon_s` and not held again since (`scheduler/chat_cache.py`; None: not counted)."""
    chat_answer_tokens_p99: float | None = None
    """The p99 length, in tokens, of the chat answers the engine has finished since it started
    (None: none yet, or not counted)."""


@dataclass(frozen=True, slots=True)
class Decision:
    """Caps for batch work on one replica until the next decision.

    `batch_seats`: batch sequences that may be in flight at once. `chunk_tokens`: the largest batch
    prompt section (and prefill chunk) to admit. `pause`: admit nothing new. `reason`: a short
    machine-friendly word for the decisions table (`cold-start`, `cut`, `grow`, `hold`, ...).
    `prefill_budget_tokens`: the most batch prompt tokens that may await prefill on the replica
    at once (None: no such bound). Seats are decided every few seconds, but a prompt prefills in
    a fraction of a second: whoever admits checks this bound at every grant (`within_prefill_budget`), so
    batch prefill flows as fast as it drains instead of in one burst per decision.
    """

    batch_seats: int
    chunk_tokens: int
    pause: bool = False
    reason: str = ""
    predicted_step_ms: float | None = None
    prefill_budget_tokens: int | None = None
    batch_step_target_ms: float | None = None
    """What the engine plug-in sizes batch prefill chunks to (None: the policy sets none)."""
    kv_room_tokens: int | None = None
    """KV tokens new batch requests may claim until the next decision (None: not bounded)."""
    idle_step_target_ms: float | None = None
    """What the plug-in sizes batch chunks to while no chat is in the engine (None: the batch
    step target always)."""
    mean_step_target_ms: float | None = None
    """The mean step time the plug-in keeps batch to while chat is in the engine, one step
    running past it on what earlier steps left unused (None: each step held to the target)."""
    chat_cache_horizon_s: float | None = None
    """How far back the plug-in counts chat's prefix-cache working set (None: it does not)."""
    slack_mark: float | None = None
    """Chat pressure the target grows to and holds above (None: the policy has no such mark)."""
    tail_scale: bool = True
    """Whether the plug-in scales its model by the tail of its own error (a fixed target); False
    where the policy corrects the model itself from the plug-in's measured steps."""


def within_prefill_budget(
    prefilling_tokens: int, prompt_tokens: int, budget_tokens: int | None
) -> bool:
    """Whether a batch prompt fits a decision's `prefill_budget_tokens` beside the batch prompt
    tokens still awaiting prefill; one prompt may always start when none are (a prompt longer
    than the budget would otherwise never start)."""
    return (
        budget_tokens is None
        or prefilling_tokens <= 0
        or prefilling_tokens + prompt_tokens <= budget_tokens
    )


class AdmissionPolicy(Protocol):
    """Anything that turns an observation of a replica into caps for batch work on it.

    The Gate and the simulator know a policy only through this protocol: `steers_engine` says its
    decisions carry a batch step target for the engine plug-in (so a control document is sent),
    `guards_kv` that its `kv_room_tokens` is to be checked at every grant."""

    steers_engine: ClassVar[bool]
    guards_kv: ClassVar[bool]

    def decide(self, observation: Observation) -> Decision: ...


@dataclass
class NoAdmissionControl:
    """Admit everything: the `uncontrolled` baseline. Caps are only what the engine itself allows."""

    steers_engine: ClassVar[bool] = False
    guards_kv: ClassVar[bool] = False

    max_seats: int = 1_000_000
    max_chunk_tokens: int = 1_000_000

    def decide(self, observation: Observation) -> Decision:
        return Decision(self.max_seats, self.max_chunk_tokens, reason="uncontrolled")


@dataclass
class FixedBudget:
    """The engine plug-in at a fixed batch step target and fixed seats, blind to load: the
    `static-budget` baseline a sweep picks in hindsight."""

    steers_engine: ClassVar[bool] = True
    guards_kv: ClassVar[bool] = False

    batch_seats: int
    batch_step_target_ms: float

    def __post_init__(self) -> None:
        if self.batch_seats < 0 or not self.batch_step_target_ms >= 0:
            raise ValueError(
                f"a fixed budget needs batch_seats >= 0 and a target >= 0 ms, got "
                f"{self.batch_seats} and {self.batch_step_target_ms}"
            )

    def decide(self, observation: Observation) -> Decision:
        return Decision(
            self.batch_seats, 1 << 30, reason="static-budget",
            batch_step_target_ms=self.batch_step_target_ms,
        )  # fmt: skip


@dataclass
class StaticCaps:
    """Fixed seats and chunk size, blind to load: the `static` baseline a sweep picks in hindsight."""

    steers_engine: ClassVar[bool] = False
    guards_kv: ClassVar[bool] = False

    batch_seats: int
    chunk_tokens: int

    def __post_init__(self) -> None:
        if self.batch_seats < 0 or self.chunk_tokens < 1:
            raise ValueError(
                f"static caps need batch_seats >= 0 and chunk_tokens >= 1, "
                f"got {self.batch_seats} and {self.chunk_tokens}"
            )

    def decide(self, observation: Observation) -> Decision:
        return Decision(self.batch_seats, self.chunk_tokens, reason="static")
