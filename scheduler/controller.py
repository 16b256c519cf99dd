"""The SLO-aware admission controller: how much batch work each replica may take right now.

One `decide(observation)` per replica every few seconds. Reading top to bottom:

1. Fail safe. An observation the sensor could not take (`fresh=False`) pauses batch: the controller
   never runs blind. A fresh observation after more than `stale_after_s` without one restarts the
   replica from the conservative cold-start caps, since whatever was learnt before is out of date.
2. Feedback. The measured window p99 ITL (or step-time p99) and TTFT p99 against the SLO: a p99 past
   `cut_fraction × SLO` cuts caps multiplicatively at once, slack grows them additively and only
   after a streak of slack windows and a cool-down since the last cut, anything in between holds
   (hysteresis). One exception to holding: once the engine's step budget bounds every step chat
   waits for (the model says a step filled to that budget fits the ITL budget), ITL p99 sits near
   that full step whatever the seat count, and a seat adds full steps, not longer ones. Seats then
   grow by a share of themselves, from slack and from the hold band alike, until a p99 says stop.
3. KV guard. A preemption in the window cuts seats and pauses; otherwise seats are limited to what
   fits under the KV high-water mark counting prompts admitted but not yet prefilled.
4. Feed-forward (scheduler/feed_forward.py). The chunk is the largest whose predicted steps, at the
   deepest prefill position in flight and with the current decode load, fit `chat_itl_p99 ×
   headroom`: late in an 80k document attention dominates and the chunk comes out smaller than at
   its start. When the engine's step size is known, batch prompt tokens in flight are also held to
   what the engine prefills in `ttft_block_fraction` of the TTFT SLO, since a chat arriving behind
   them waits for all of them; this sizes map-reduce sections. While chat TTFT shows slack the
   decision hands that on as a prefill budget the admitter checks at every grant, so batch prefill
   flows as fast as the engine drains it. Where chat TTFT has lately come near its SLO, batch is
   paced instead: seats admit what fits at the decision, and no new batch prompt starts while chat
   requests wait for their first token (`yield_to_queued_chat`): batch then takes only the prefill
   room chat leaves.

State is kept per replica, keyed by `Observation.replica`, so one controller object serves a whole
fleet (the Gate holds one per run; the simulator one per scenario). The controller reads no clock:
all time is `Observation.t`, virtual or wall, and decisions cost tens of microseconds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from scheduler import feed_forward, feedback, kv_guard
from scheduler.admission import Decision, Observation
from scheduler.feed_forward import Load
from scheduler.feedback import Verdict
from scheduler.slo import SLO
from scheduler.step import StepTimeModel


class ControllerConfig(BaseModel):
    """Tuning of the SLO controller. Defaults suit a GPU replica with a 50 ms ITL SLO and a decision
    every few seconds; a CPU replica wants smaller chunk bounds. Set `engine_step_tokens` from the
    engine config (`engine_step_tokens(flags)`) so batch prompts are priced as the engine runs them.
    """

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
    cut_fraction: float = Field(
        0.9, gt=0, le=1, description="A window p99 above this × SLO is acted on as a violation."
    )
    seat_growth: int = Field(1, ge=1, description="Seats added per growth step.")
    bound_seat_growth: float = Field(
        0.5,
        ge=0,
        description="While the engine's step budget bounds every step, seats grow by this share "
        "of themselves (at least `seat_growth`), from the hold band too where chat TTFT has not "
        "come near its SLO within `ttft_memory_s`; 0 turns that off.",
    )
    chunk_growth_tokens: int = Field(256, ge=1, description="Chunk tokens added per growth step.")
    itl_slack_fraction: float = Field(
        0.72, gt=0, lt=1, description="ITL p99 below this × SLO counts as slack."
    )
    ttft_slack_fraction: float = Field(
        0.7, gt=0, lt=1, description="TTFT p99 below this × SLO counts as slack."
    )
    grow_after_slack: int = Field(2, ge=1, description="Consecutive slack windows needed to grow.")
    settle_margin: float = Field(
        0.05,
        ge=0,
        description="A sliding-window p99 at most this share above the one that caused a cut is "
        "the same slow spell seen again (`settling`), not a reason to cut again.",
    )
    cooldown_s: float = Field(10.0, ge=0, description="No growth this long after a cut.")
    kv_high_water: float = Field(
        0.85, gt=0, le=1, description="KV usage admission must stay under."
    )
    expected_output_tokens: int = Field(
        512, ge=0, description="KV a batch request adds by decoding."
    )
    stale_after_s: float = Field(15.0, gt=0, description="Longest gap between fresh observations.")
    engine_step_tokens: int | None = Field(
        None,
        ge=1,
        description="Most prompt tokens the engine prefills for one request in one step; None "
        "prices a whole batch prompt as one step and leaves the TTFT allowance off.",
    )
    ttft_block_fraction: float = Field(
        0.25,
        gt=0,
        le=1,
        description="Share of the TTFT SLO a chat may wait behind batch prefills in flight.",
    )
    yield_to_queued_chat: bool = Field(
        True,
        description="Admit no new batch prompt while chat requests await a first token, once chat "
        "TTFT p99 has left its slack band within `ttft_memory_s`.",
    )
    ttft_memory_s: float = Field(
        900.0,
        ge=0,
        description="How long a TTFT p99 past its slack band keeps batch paced and yielding to "
        "queued chat: chat load near capacity lasts tens of minutes, and its bursts come minutes "
        "apart.",
    )
    chat_slot_share: float = Field(
        0.25,
        ge=0,
        lt=1,
        description="Share of the engine's sequence slots (`max-num-seqs`) batch leaves to chat "
        "when `controller_config` sets `max_seats` from the engine flags.",
    )

    @model_validator(mode="after")
    def _bounds_are_ordered(self) -> ControllerConfig:
        slack = max(self.itl_slack_fraction, self.ttft_slack_fraction)
        if slack >= self.cut_fraction:
            raise ValueError(
                f"need itl_slack_fraction and ttft_slack_fraction below cut_fraction "
                f"({self.cut_fraction}), got {slack}: the hold band between them keeps caps steady"
            )
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


def engine_step_tokens(flags: Mapping[str, Any]) -> int | None:
    """`ControllerConfig.engine_step_tokens` from an engine config's `vllm:` flags (dash form): the
    long-prefill threshold when set below the step budget, else the budget; None when chunked
    prefill is off (a prompt then goes in one step) or the budget is not set."""
    budget = flags.get("max-num-batched-tokens")
    if budget is None or flags.get("enable-chunked-prefill") is False:
        return None
    threshold = flags.get("long-prefill-token-threshold") or 0
    return int(min(budget, threshold) if 0 < threshold else budget)


def batch_seat_limit(flags: Mapping[str, Any], chat_share: float) -> int | None:
    """Most batch seats an engine with these `vllm:` flags can give without taking the sequence
    slots chat needs: `max-num-seqs` less `chat_share` of it (at least one slot kept for chat).
    A chat arriving at a full engine waits for a batch request to finish, whatever its priority.
    None when the flag is unset."""
    slots = flags.get("max-num-seqs")
    if slots is None:
        return None
    return max(1, int(slots) - max(1, math.ceil(int(slots) * chat_share)))


def controller_config(
    controller: ControllerConfig | None, engine_flags: Mapping[str, Any] | None
) -> ControllerConfig:
    """`controller` (or the defaults) with `engine_step_tokens` and `max_seats` read from
    `engine_flags`, each unless the caller set it on purpose (None included: that switches the
    step pricing off)."""
    config = controller or ControllerConfig()
    if engine_flags is None:
        return config
    update: dict[str, Any] = {}
    if "engine_step_tokens" not in config.model_fields_set:
        update["engine_step_tokens"] = engine_step_tokens(engine_flags)
    limit = batch_seat_limit(engine_flags, config.chat_slot_share)
    if "max_seats" not in config.model_fields_set and limit is not None:
        update["max_seats"] = min(config.max_seats, limit)
        update["cold_start_seats"] = min(config.cold_start_seats, update["max_seats"])
        update["min_seats"] = min(config.min_seats, update["cold_start_seats"])
    if not update:
        return config
    return ControllerConfig.model_validate({**config.model_dump(), **update})


@dataclass
class ReplicaState:
    """What the controller remembers about one replica between decisions."""

    seats: int
    chunk_cap: int
    slack_streak: int = 0
    last_cut_t: float | None = None
    last_fresh_t: float | None = None
    last_chunk: int = 0
    ttft_tight_t: float | None = None
    """When chat TTFT p99 was last past its slack band (or the cold start, when it was unknown)."""
    ttft_unseen: bool = False
    """Chat TTFT has not been measured since the cold start: tight until a reading shows slack."""
    cut_reading: tuple[float, Verdict, float | None] | None = None
    """(t, verdict, the violated p99) of the observation that last made feedback cut."""


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
        load = feed_forward.load_of(obs)
        reason = self._apply_feedback(state, obs, load, may_grow=not cold)
        if cold and reason == Verdict.HOLD:
            reason = "cold-start"  # a violation seen at once still cuts the cold-start caps
        state.last_fresh_t = obs.t
        self._note_ttft(state, obs)
        seats, pause, reason = self._guard_kv(state, obs, load, reason)
        chunk = self._chunk(state, load)
        budget = None
        if chunk < cfg.min_chunk_tokens:
            pause, reason, chunk = True, "over-budget", cfg.min_chunk_tokens
        elif not pause:
            tight = self._ttft_tight(state, obs.t)
            seats, pause, reason, budget = self._guard_prefill_queue(
                seats, load, chunk, reason, tight
            )
        state.last_chunk = chunk
        step_s = feed_forward.step_seconds(
            self.model, load, 0 if pause else chunk, cfg.engine_step_tokens
        )
        return Decision(
            seats,
            chunk,
            pause=pause,
            reason=reason,
            predicted_step_ms=1000 * step_s,
            prefill_budget_tokens=budget,
        )

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
        state.ttft_tight_t = obs.t  # unknown chat is treated as tight until it has shown slack
        state.ttft_unseen = True
        self.states[obs.replica] = state
        return state

    # -- 2. feedback ----------------------------------------------------------------------------

    def _apply_feedback(
        self, state: ReplicaState, obs: Observation, load: Load, may_grow: bool
    ) -> str:
        """Act on the window's verdict; returns the reason word for the decision.

        Step-bound growth from the hold band also needs chat TTFT not to be `_ttft_tight`: the
        step bound says nothing about TTFT, and near capacity the seats it banks come due when the
        next burst arrives (simulated hour, steady 5 req/s, eight seeds: 476 of 480 windows held
        this way against 467, at 30% less batch; under the varying trace 4,755 batch tok/s
        against 4,812, every window held)."""
        cfg = self.config
        itl = feedback.observed_itl(obs.chat_itl_p99_s, obs.step_samples_s)
        v = feedback.verdict(
            itl,
            obs.chat_ttft_p99_s,
            self.slo.chat_itl_p99_ms / 1000,
            self.slo.chat_ttft_p99_ms / 1000,
            feedback.Bands(cfg.itl_slack_fraction, cfg.ttft_slack_fraction, cfg.cut_fraction),
        )
        if v in (Verdict.ITL_VIOLATION, Verdict.TTFT_VIOLATION):
            signal = itl if v is Verdict.ITL_VIOLATION else obs.chat_ttft_p99_s
            if _seen_before(state, obs, v, signal, cfg.settle_margin):
                state.slack_streak = 0
                return "settling"
            self._cut(state, obs.t, chunk_too=v is Verdict.ITL_VIOLATION)
            state.cut_reading = (obs.t, v, signal)
            return v.value
        if may_grow and v is Verdict.SLACK:
            return self._maybe_grow(state, obs, self._step_bound_growth(state, load))
        if (
            may_grow
            and self._ttft_slack(obs)
            and not self._ttft_tight(state, obs.t)
            and (more := self._step_bound_growth(state, load))
        ):
            return self._maybe_grow(state, obs, more, from_hold=True)
        state.slack_streak = 0
        return Verdict.HOLD.value

    def _cut(self, state: ReplicaState, t: float, chunk_too: bool) -> None:
        """Back off at once. ITL suffers from big prefill steps, so the chunk is cut with the seats;
        TTFT suffers from chat queueing behind batch, which fewer seats relieve."""
        cfg = self.config
        state.seats = feedback.cut(state.seats, cfg.cut_factor, cfg.min_seats)
        used = min(state.chunk_cap, state.last_chunk or state.chunk_cap)
        if chunk_too:
            g = cfg.chunk_granularity
            state.chunk_cap = feedback.cut(used, cfg.cut_factor, _chunk_floor(cfg, used), g)
        state.slack_streak = 0
        state.last_cut_t = t

    def _maybe_grow(
        self, state: ReplicaState, obs: Observation, bound_seats: int, from_hold: bool = False
    ) -> str:
        """Grow only after a streak of windows that allow it and the cool-down, and only caps that
        bind: seats nobody filled and chunks nobody sent say nothing about their safety. Zero
        seats always bind (nothing can be in flight to fill them), so a replica cut to zero grows
        again on slack alone instead of staying shut for good.

        `bound_seats` (from `_step_bound_growth`) is how many seats the engine's step budget lets
        in at once, 0 when it does not bound the step; `from_hold` is growth in the hold band,
        which only that bound justifies, and which leaves the chunk alone: a longer chunk makes
        steps longer where the step budget does not already cap them."""
        cfg = self.config
        state.slack_streak += 1
        cooling = state.last_cut_t is not None and obs.t - state.last_cut_t < cfg.cooldown_s
        in_flight = len(obs.batch_in_flight)
        seats_bind, chunk_used = in_flight >= state.seats, in_flight > 0 and not from_hold
        if state.slack_streak < cfg.grow_after_slack or cooling or not (seats_bind or chunk_used):
            return Verdict.HOLD.value
        before = (state.seats, state.chunk_cap)
        if seats_bind:
            step = max(cfg.seat_growth, bound_seats)
            state.seats = feedback.grow(state.seats, step, cfg.max_seats)
        if chunk_used:
            base = max(state.last_chunk, cfg.min_chunk_tokens)
            state.chunk_cap = feedback.grow(
                min(state.chunk_cap, base), cfg.chunk_growth_tokens, cfg.max_chunk_tokens
            )
        state.slack_streak = 0
        if (state.seats, state.chunk_cap) == before:
            return Verdict.HOLD.value
        return "grow-step-bound" if from_hold or bound_seats > cfg.seat_growth else "grow"

    def _step_bound_growth(self, state: ReplicaState, load: Load) -> int:
        """Seats to add at once while the engine's step budget bounds every step, else 0.

        The engine prefills at most `engine_step_tokens` per step however many batch prompts wait,
        so when a step filled to that budget, beside the chat decodes and the new seats' own
        decodes, still fits `headroom × ITL SLO`, more seats make more such steps and none longer.
        Past the point where chat's p99 token already lands on a full step, that leaves the p99
        where it is; before it, the p99 can rise only as far as the full step the model priced.
        Either way the p99 that feedback watches is the check, as for any growth."""
        cfg = self.config
        if cfg.engine_step_tokens is None or cfg.bound_seat_growth == 0:
            return 0
        more = max(cfg.seat_growth, int(state.seats * cfg.bound_seat_growth))
        budget_s = self.slo.chat_itl_p99_ms / 1000 * cfg.headroom
        prompt = state.last_chunk or state.chunk_cap
        bounded = feed_forward.full_step_fits(
            self.model, load, budget_s, cfg.engine_step_tokens, more, more * prompt, prompt
        )
        return more if bounded else 0

    def _ttft_slack(self, obs: Observation) -> bool:
        """Chat TTFT p99 inside its slack band (or unmeasured): more seats queue more prefill
        ahead of a chat's first token, which the step budget does nothing to bound."""
        p99 = obs.chat_ttft_p99_s
        return (
            p99 is None or p99 < self.config.ttft_slack_fraction * self.slo.chat_ttft_p99_ms / 1000
        )

    # -- 3. KV guard ----------------------------------------------------------------------------

    def _guard_kv(
        self, state: ReplicaState, obs: Observation, load: Load, reason: str
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

    def _chunk(self, state: ReplicaState, load: Load) -> int:
        """The feedback cap, further limited by what fits the ITL budget and the TTFT allowance."""
        cfg = self.config
        fits = feed_forward.largest_prompt_within(
            self.model,
            self.slo.chat_itl_p99_ms / 1000 * cfg.headroom,
            load,
            min(state.chunk_cap, cfg.max_chunk_tokens),
            cfg.chunk_granularity,
            cfg.engine_step_tokens,
        )
        allowance = self._prefill_allowance(load)
        if allowance is None:
            return fits
        g = cfg.chunk_granularity
        return min(fits, max(g, allowance // g * g))

    def _prefill_allowance(self, load: Load) -> int | None:
        wait_s = self.slo.chat_ttft_p99_ms / 1000 * self.config.ttft_block_fraction
        return feed_forward.prefill_allowance(
            self.model, load, wait_s, self.config.engine_step_tokens
        )

    def _note_ttft(self, state: ReplicaState, obs: Observation) -> None:
        """Remember when chat TTFT p99 was last past its slack band; the first measured reading in
        it after a cold start clears the tightness the cold start assumed. Waiting out the whole
        memory after a cold start instead bought nothing measurable: over a simulated hour of
        steady 5 req/s chat, eight seeds, 466 of 480 windows held against 467 this way, at 11%
        less batch."""
        if not self._ttft_slack(obs):
            state.ttft_tight_t, state.ttft_unseen = obs.t, False
        elif state.ttft_unseen and obs.chat_ttft_p99_s is not None:
            state.ttft_tight_t, state.ttft_unseen = None, False

    def _ttft_tight(self, state: ReplicaState, t: float) -> bool:
        """Whether chat TTFT p99 has left its slack band within `ttft_memory_s`: chat that came
        near its SLO once in a while is chat whose bursts can break it, and such load lasts longer
        than one window. While chat stays slack, one TTFT allowance of batch prefill ahead of a
        queued chat still leaves it inside the SLO, and batch need not yield."""
        last = state.ttft_tight_t
        return last is not None and t - last <= self.config.ttft_memory_s

    def _guard_prefill_queue(
        self, seats: int, load: Load, chunk: int, reason: str, tight: bool
    ) -> tuple[int, bool, str, int | None]:
        """Seats, whether to pause, the reason, and the prefill budget: the TTFT allowance, which
        whoever admits checks grant by grant (`admission.prefill_fits`), so a section starts as
        soon as the one ahead has drained. Checked only here, every few seconds, the allowance
        would hold batch to one allowance per decision while the engine drains one in a fraction
        of a second (on `cpu-small-fp32`, 1–3 seats and 1,040 batch tok/s where grant-by-grant
        checking reached 19 seats and 2,235 at the same chat TTFT).

        That pace is right where chat TTFT is `tight` (it came near its SLO lately): chat then
        queues behind chat already, every step batch takes delays the whole queue, and refilling
        the allowance as fast as it drains breaks minutes that pacing holds (in the simulator's
        steady 5 req/s, 54 of 60 windows against 60). There seats are limited to the prompts the
        allowance admits now, and chat already queued for its first token leaves no room at all
        (`yield_to_queued_chat`): the engine lets a waiting batch prompt into its running set in
        the first step with budget to spare between chat prefills, and from then on every chat of
        the same burst arrives behind all of it. Those prompts go in at once, on the chat queue
        this decision saw, and no budget is handed on: a prompt held for a later drain would start
        at a moment nobody checked for queued chat (in the simulator that cost 2 of 60 windows)."""
        cfg = self.config
        paused = min(seats, load.batch_in_flight)
        if tight and cfg.yield_to_queued_chat and load.chat_queued:
            return paused, True, "chat-queue", None
        allowance = self._prefill_allowance(load)
        if allowance is None:
            return seats, False, reason, None
        if not tight:
            held = load.prefill_pending + chunk > allowance  # the next prompt waits for a drain
            return seats, False, "ttft-guard" if held else reason, allowance
        room = max(0, allowance - load.prefill_pending) // chunk
        if room == 0:
            return paused, True, "ttft-guard", None
        allowed = load.batch_in_flight + room
        if allowed < seats:
            return allowed, False, "ttft-guard", None
        return seats, False, reason, None


def _chunk_floor(cfg: ControllerConfig, used: int) -> int:
    """Shortest chunk an ITL cut takes `used` to. A prompt longer than one engine step is prefilled
    in steps of that size, so cutting it no further than one step is all that relieves: its last
    steps attend over every token before them, and on `cpu-small` chat's p99 under two or more
    seats rose from ~20 ms with 1024-token sections to ~34 ms with 2048. Below one step the chunk
    sets the step's own size, and the cut goes down to `min_chunk_tokens`."""
    step = cfg.engine_step_tokens
    if step is None or used <= step:
        return cfg.min_chunk_tokens
    return max(cfg.min_chunk_tokens, step)


def _seen_before(
    state: ReplicaState, obs: Observation, verdict: Verdict, p99_s: float | None, margin: float
) -> bool:
    """Whether a violation in `obs` is the one feedback already cut for, seen again: a sensor with
    a sliding window (`obs.window_s`) keeps reporting the slow samples that caused a cut until they
    slide out, and cutting once per reading would take caps to their floor for one slow spell.
    The reading is new evidence once its window starts after the cut, when it breaks the other
    SLO, or when its p99 is worse than the one that caused the cut by more than `margin` (what the
    cut let through is slower still). The margin is there because a p99 read off a histogram is
    interpolated inside its bucket and drifts by a few percent as each scrape adds samples: at
    3 × 1024 on `cpu-small`, 21.3 ms read again as 21.3+ cut four seats to one in two readings."""
    if state.cut_reading is None or obs.window_s is None:
        return False
    t_cut, verdict_cut, p99_cut = state.cut_reading
    if obs.t - obs.window_s >= t_cut or verdict is not verdict_cut:
        return False
    return p99_s is not None and p99_cut is not None and p99_s <= p99_cut * (1 + margin)


def _seat_kv_tokens(obs: Observation, state: ReplicaState, output_tokens: int) -> int:
    """KV one more batch request will hold: the mean prompt in flight (the pipeline sends sections
    of similar size), else one chunk, plus its expected output."""
    if obs.batch_in_flight:
        prompt = sum(b.prompt_tokens for b in obs.batch_in_flight) // len(obs.batch_in_flight)
    else:
        prompt = state.last_chunk or state.chunk_cap
    return max(1, prompt + output_tokens)
