"""The SLO-aware admission controller: how much batch work each replica may take right now.

One `decide(observation)` per replica every few seconds. Reading top to bottom:

1. Fail safe. An observation the sensor could not take (`fresh=False`) pauses batch: the controller
   never runs blind. A fresh observation after more than `stale_after_s` without one restarts the
   replica from the conservative cold-start caps, since whatever was learnt before is out of date.
2. Feedback. The measured window p99 ITL (or step-time p99) and TTFT p99 against the SLO: a violation
   cuts caps multiplicatively at once, slack grows them additively and only after a streak of slack
   windows and a cool-down since the last cut, anything in between holds (hysteresis).
3. KV guard. A preemption in the window cuts seats and pauses; otherwise seats are limited to what
   fits under the KV high-water mark counting prompts admitted but not yet prefilled.
4. Feed-forward. The chunk is the largest whose predicted step, at the deepest prefill position in
   flight and with the current decode load, fits `chat_itl_p99 × headroom`. Late in an 80k document
   attention dominates and the chunk comes out smaller than at its start.

State is kept per replica, keyed by `Observation.replica`, so one controller object serves a whole
fleet (the Gate holds one per run; the simulator one per scenario). The controller reads no clock:
all time is `Observation.t`, virtual or wall, and decisions cost tens of microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, model_validator

from scheduler import feedback, kv_guard
from scheduler.admission import Decision, Observation
from scheduler.feedback import Verdict
from scheduler.latency_model import largest_chunk_within
from scheduler.slo import SLO
from scheduler.step import PrefillChunk, StepBatch, StepTimeModel


class ControllerConfig(BaseModel):
    """Tuning of the SLO controller. Defaults suit a GPU replica with a 50 ms ITL SLO and a decision
    every few seconds; a CPU replica wants smaller chunk bounds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    headroom: float = Field(
        0.8, gt=0, le=1, description="Fraction of the ITL SLO a predicted step may use."
    )
    min_seats: int = Field(
        1, ge=0, description="Fewest batch seats feedback cuts to (guards may go lower)."
    )
    max_seats: int = Field(64, ge=1, description="Most batch sequences in flight per replica.")
    min_chunk_tokens: int = Field(64, ge=1, description="Smallest batch chunk worth admitting.")
    max_chunk_tokens: int = Field(8192, ge=1, description="Largest batch chunk ever granted.")
    chunk_granularity: int = Field(
        16, ge=1, description="Chunks are multiples of this (KV block size)."
    )
    cold_start_seats: int = Field(
        1, ge=0, description="Seats granted before any feedback is known."
    )
    cold_start_chunk_tokens: int = Field(
        512, ge=1, description="Chunk cap before any feedback is known."
    )
    cut_factor: float = Field(
        0.5, gt=0, lt=1, description="Multiplicative decrease on a violation."
    )
    seat_growth: int = Field(1, ge=1, description="Seats added per growth step.")
    chunk_growth_tokens: int = Field(256, ge=1, description="Chunk tokens added per growth step.")
    slack_fraction: float = Field(
        0.7, gt=0, lt=1, description="p99 below this × SLO counts as slack."
    )
    grow_after_slack: int = Field(2, ge=1, description="Consecutive slack windows needed to grow.")
    cooldown_s: float = Field(10.0, ge=0, description="No growth this long after a cut.")
    kv_high_water: float = Field(
        0.85, gt=0, le=1, description="KV usage admission must stay under."
    )
    expected_output_tokens: int = Field(
        512, ge=0, description="KV a batch request adds by decoding."
    )
    stale_after_s: float = Field(15.0, gt=0, description="Longest gap between fresh observations.")

    @model_validator(mode="after")
    def _bounds_are_ordered(self) -> ControllerConfig:
        if not self.min_seats <= self.cold_start_seats <= self.max_seats:
            raise ValueError(
                f"need min_seats <= cold_start_seats <= max_seats, got {self.min_seats}, "
                f"{self.cold_start_seats}, {self.max_seats}; adjust one of them"
            )
        if not self.min_chunk_tokens <= self.cold_start_chunk_tokens <= self.max_chunk_tokens:
            raise ValueError(
                f"need min_chunk_tokens <= cold_start_chunk_tokens <= max_chunk_tokens, got "
                f"{self.min_chunk_tokens}, {self.cold_start_chunk_tokens}, {self.max_chunk_tokens}"
            )
        return self


@dataclass
class ReplicaState:
    """What the controller remembers about one replica between decisions."""

    seats: int
    chunk_cap: int
    slack_streak: int = 0
    last_cut_t: float | None = None
    last_fresh_t: float | None = None
    last_chunk: int = 0


@dataclass(frozen=True, slots=True)
class _Load:
    """The decode load and the deepest prefill position a new chunk would share a step with."""

    decode_seqs: int
    decode_context_tokens: int
    prefix_tokens: int
    batch_in_flight: int


class SLOController:
    """Feed-forward from the latency model, corrected by measured p99s, bounded by the KV guard."""

    def __init__(
        self, slo: SLO, model: StepTimeModel, config: ControllerConfig | None = None
    ) -> None:
        self.slo = slo
        self.model = model
        self.config = config or ControllerConfig()
        self.states: dict[str, ReplicaState] = {}

    def decide(self, observation: Observation) -> Decision:
        """Caps for batch work on `observation.replica` until the next decision."""
        obs, cfg = observation, self.config
        state = self.states.get(obs.replica)
        if not obs.fresh:
            return self._stale_pause(state, obs)
        cold = state is None or self.is_stale(obs.replica, obs.t)
        if cold:
            state = self._cold_start(obs)
        reason = self._apply_feedback(state, obs, may_grow=not cold)
        if cold and reason == Verdict.HOLD:
            reason = "cold-start"  # a violation seen at once still cuts the cold-start caps
        state.last_fresh_t = obs.t
        load = _load_of(obs)
        seats, pause, reason = self._guard_kv(state, obs, load, reason)
        chunk = self._chunk(state, load)
        if chunk < cfg.min_chunk_tokens:
            pause, reason, chunk = True, "over-budget", cfg.min_chunk_tokens
        state.last_chunk = chunk
        step_ms = self._predict_ms(load, 0 if pause else chunk)
        return Decision(seats, chunk, pause=pause, reason=reason, predicted_step_ms=step_ms)

    def is_stale(self, replica: str, t: float) -> bool:
        """True when `replica` has had no fresh observation for `stale_after_s` before `t`; the Gate
        asks this between polls so a hung sensor cannot leave old caps in force."""
        state = self.states.get(replica)
        if state is None or state.last_fresh_t is None:
            return True
        return t - state.last_fresh_t > self.config.stale_after_s

    # -- 1. fail safe ---------------------------------------------------------------------------

    def _stale_pause(self, state: ReplicaState | None, obs: Observation) -> Decision:
        cfg = self.config
        seats = state.seats if state else cfg.cold_start_seats
        chunk = (state.last_chunk or state.chunk_cap) if state else cfg.cold_start_chunk_tokens
        return Decision(seats, chunk, pause=True, reason="stale-pause")

    def _cold_start(self, obs: Observation) -> ReplicaState:
        state = ReplicaState(self.config.cold_start_seats, self.config.cold_start_chunk_tokens)
        self.states[obs.replica] = state
        return state

    # -- 2. feedback ----------------------------------------------------------------------------

    def _apply_feedback(self, state: ReplicaState, obs: Observation, may_grow: bool) -> str:
        """Act on the window's verdict; returns the reason word for the decision."""
        cfg = self.config
        itl = feedback.observed_itl(obs.chat_itl_p99_s, obs.step_samples_s)
        v = feedback.verdict(
            itl,
            obs.chat_ttft_p99_s,
            self.slo.chat_itl_p99_ms / 1000,
            self.slo.chat_ttft_p99_ms / 1000,
            cfg.slack_fraction,
        )
        if v is Verdict.ITL_VIOLATION:
            self._cut(state, obs.t, chunk_too=True)
        elif v is Verdict.TTFT_VIOLATION:
            self._cut(state, obs.t, chunk_too=False)
        elif v is Verdict.SLACK and may_grow:
            return self._maybe_grow(state, obs)
        else:
            state.slack_streak = 0
            return Verdict.HOLD.value
        return v.value

    def _cut(self, state: ReplicaState, t: float, chunk_too: bool) -> None:
        """Back off at once. ITL suffers from big prefill steps, so the chunk is cut with the seats;
        TTFT suffers from chat queueing behind batch, which fewer seats relieve."""
        cfg = self.config
        state.seats = feedback.cut(state.seats, cfg.cut_factor, cfg.min_seats)
        if chunk_too:
            used = min(state.chunk_cap, state.last_chunk or state.chunk_cap)
            g = cfg.chunk_granularity
            state.chunk_cap = feedback.cut(used, cfg.cut_factor, cfg.min_chunk_tokens, g)
        state.slack_streak = 0
        state.last_cut_t = t

    def _maybe_grow(self, state: ReplicaState, obs: Observation) -> str:
        """Grow only after a streak of slack windows and the cool-down, and only caps that were in
        use: seats nobody filled and chunks nobody sent say nothing about their safety."""
        cfg = self.config
        state.slack_streak += 1
        cooling = state.last_cut_t is not None and obs.t - state.last_cut_t < cfg.cooldown_s
        in_flight = len(obs.batch_in_flight)
        if state.slack_streak < cfg.grow_after_slack or cooling or in_flight == 0:
            return Verdict.HOLD.value
        before = (state.seats, state.chunk_cap)
        if in_flight >= state.seats:
            state.seats = feedback.grow(state.seats, cfg.seat_growth, cfg.max_seats)
        base = max(state.last_chunk, cfg.min_chunk_tokens)
        state.chunk_cap = feedback.grow(
            min(state.chunk_cap, base), cfg.chunk_growth_tokens, cfg.max_chunk_tokens
        )
        state.slack_streak = 0
        return "grow" if (state.seats, state.chunk_cap) != before else Verdict.HOLD.value

    # -- 3. KV guard ----------------------------------------------------------------------------

    def _guard_kv(
        self, state: ReplicaState, obs: Observation, load: _Load, reason: str
    ) -> tuple[int, bool, str]:
        """Seats allowed by the KV guard, whether to pause, and the reason that binds."""
        cfg = self.config
        if obs.preemptions > 0:
            state.seats = feedback.cut(state.seats, cfg.cut_factor, cfg.min_seats)
            state.last_cut_t, state.slack_streak = obs.t, 0
            return state.seats, True, "preemption"
        if obs.kv_usage is None:
            return state.seats, False, reason
        committed = kv_guard.committed_kv(obs.kv_usage, obs.kv_capacity_tokens, obs.batch_in_flight)
        if committed >= cfg.kv_high_water:
            return min(state.seats, load.batch_in_flight), True, "kv-guard"
        if not obs.kv_capacity_tokens:
            return state.seats, False, reason
        seat_tokens = _seat_kv_tokens(obs, state, cfg.expected_output_tokens)
        room = kv_guard.seats_that_fit(
            committed, obs.kv_capacity_tokens, seat_tokens, cfg.kv_high_water
        )
        allowed = load.batch_in_flight + room
        if allowed < state.seats:
            return allowed, allowed <= load.batch_in_flight, "kv-guard"
        return state.seats, False, reason

    # -- 4. feed-forward ------------------------------------------------------------------------

    def _chunk(self, state: ReplicaState, load: _Load) -> int:
        """The feedback cap, further limited by what the latency model says fits the budget."""
        cfg = self.config
        fits = largest_chunk_within(
            self.model,
            self.slo.chat_itl_p99_ms / 1000 * cfg.headroom,
            load.prefix_tokens,
            load.decode_seqs,
            load.decode_context_tokens,
            min(state.chunk_cap, cfg.max_chunk_tokens),
            cfg.chunk_granularity,
        )
        return min(state.chunk_cap, fits)

    def _predict_ms(self, load: _Load, chunk: int) -> float:
        prefills = (PrefillChunk(chunk, load.prefix_tokens),) if chunk else ()
        batch = StepBatch(prefills, load.decode_seqs, load.decode_context_tokens)
        return self.model.step_seconds(batch) * 1000


def _load_of(obs: Observation) -> _Load:
    """Chat decodes plus batch requests past their prefill decode in every step; the deepest
    unfinished batch prefill is where the next chunk's attention is computed."""
    decoding = [b for b in obs.batch_in_flight if b.prefill_remaining == 0]
    prefilling = [b.prefilled_tokens for b in obs.batch_in_flight if b.prefill_remaining > 0]
    return _Load(
        decode_seqs=obs.chat_decoding + len(decoding),
        decode_context_tokens=obs.chat_decode_context_tokens
        + sum(b.prompt_tokens for b in decoding),
        prefix_tokens=max(prefilling, default=0),
        batch_in_flight=len(obs.batch_in_flight),
    )


def _seat_kv_tokens(obs: Observation, state: ReplicaState, output_tokens: int) -> int:
    """KV one more batch request will hold: the mean prompt in flight (the pipeline sends sections
    of similar size), else one chunk, plus its expected output."""
    if obs.batch_in_flight:
        prompt = sum(b.prompt_tokens for b in obs.batch_in_flight) // len(obs.batch_in_flight)
    else:
        prompt = state.last_chunk or state.chunk_cap
    return max(1, prompt + output_tokens)
