"""The SLO controller: feedback on the one number the engine enforces, the batch step target.

The engine plug-in sizes every batch chunk, every step, to the batch step target beside that
step's chat load (`scheduler/step_budget.py`); this controller closes the loop around it, one
`decide(observation)` per replica every few seconds. Invariants (docs/design.md §7 says why):

1. **Fail safe.** No fresh observation for `stale_after_s`: batch pauses; it never steers blind.
2. **Feedback on chat's pressure**, the worst of window ITL, TTFT and E2E p99 over their SLOs:
   above 1 a cut (by `cut_factor`, or as far as the break needs); below the slack mark (one
   window in a hundred over the SLO, by this replica's spread: `scheduler/pressure_spread.py`)
   a growth toward it, short of a recent break; in between a hold. Only windows that began after
   a change judge it (a break right after a growth is cut at once), and growth needs a whole
   slack window in which the target bound. The target never passes the ITL SLO and starts cold
   at half of it. An E2E SLO bounds the sum of an answer's gaps, not each one: the plug-in then
   keeps batch's steps to a mean, the target in the share the E2E SLO over chat's p99 answer
   length bears to the ITL SLO, and one step may run to the target on what others left unused.
3. **Model correction.** The target sent is the real one over the smoothed measured/modelled
   time of the plug-in's batch steps, and between changes only falls. The first measurement (the
   engine's whole record, where it has one) re-aims the cold start, unjudged.
4. **Seats and KV.** Batch decodes fit `DECODE_SHARE` of the (mean) step, chat keeps
   `chat_slot_share` of the engine's slots, and a whole document is admitted only while it fits
   under `kv_high_water` beside everything committed, chat's cached histories included
   (`scheduler/chat_cache.py`): never preempted, never evicting what chat comes back to.
5. **Idle steps.** With no chat in the engine the plug-in sizes to an idle target feedback moves.

State is per replica (one object serves a fleet); no clock is read: time is `Observation.t`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from scheduler.admission import Decision, Observation
from scheduler.pressure_spread import PressureSpread
from scheduler.slo import SLO
from scheduler.step import StepBatch, StepTimeModel

COLD_START_SHARE = 0.5
"""Real step target before any feedback, as a share of the ceiling: room on both sides."""
DECODE_SHARE = 0.5
"""Share of the step target batch decodes may fill: the rest stays for batch prefill chunks."""
IDLE_TTFT_SHARE = 0.25
"""TTFT SLO share a step may last with no chat in the engine: what a chat arriving then waits."""
ITL_QUANTILE = 0.99  # the quantile of chat's token gaps the ITL SLO is stated at
BREAK_MEMORY_WINDOWS = 4
"""Windows after a cut in which the step that broke bounds growth (chat's load holds minutes)."""
RATIO_SMOOTHING = 0.3  # weight of a new measured/predicted step ratio in the running estimate
RATIO_BOUNDS = (0.25, 4.0)
"""Past 4x off either way the model describes another machine: steer on feedback alone."""
CHANGES = ("cold-start", "ceiling", "cut", "grow")  # the reasons that set a new target
NO_SECTION_CAP = 1 << 30  # `Decision.chunk_tokens`: the engine caps each step, not the admitter


class BudgetControllerConfig(BaseModel):
    """What an operator may tune; every field has a default that suits GPU and CPU replicas."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cut_factor: float = Field(0.7, gt=0, lt=1, description="Most of the target a cut keeps.")
    slack_fraction: float = Field(0.8, gt=0, lt=1, description="Chat pressure below this is "
        "slack, and the target grows, until the replica's windows have shown their spread.")  # fmt: skip
    max_seats: int = Field(64, ge=1, description="Most batch requests in flight per replica.")
    chat_slot_share: float = Field(0.5, ge=0, lt=1, description="max-num-seqs share kept for chat.")
    kv_high_water: float = Field(
        0.9, gt=0, le=1, description="KV share batch admission stays under."
    )
    stale_after_s: float = Field(15.0, gt=0, description="Longest gap between fresh observations.")
    chat_cache_horizon_s: float = Field(60.0, ge=0, description="Chat histories cached this "
        "recently keep their KV from batch (99% of next turns come within it; 0: none kept).")  # fmt: skip


@dataclass
class _Replica:
    """What the controller remembers about one replica; the spread and ratio outlive restarts."""

    spread: PressureSpread
    target_s: float = 0.0  # the real step time decided at the last change
    sent_s: float = 0.0  # what the engine enforces: target_s / ratio at the change, lowered since
    changed_t: float = 0.0
    grew_last: bool = True  # a violation then cuts at once (a cold start counts as a growth)
    ratio: float = 1.0  # the plug-in's measured/predicted step time, smoothed
    ratio_measured: bool = False  # until a batch step is measured, 1.0 is the fit's word only
    last_fresh_t: float = -math.inf
    pressed_t: float | None = None  # the last window since the change at or above the mark
    broke: tuple[float, float, float] | None = None  # (t, real step, pressure) of the last cut

    def changed(self, t: float, grew: bool, aimed: float | None = None) -> None:
        self.changed_t, self.grew_last, self.pressed_t = t, grew, None
        self.spread.target_changed(aimed)

    def restart(self, t: float, target_s: float) -> None:
        self.target_s, self.sent_s, self.broke = target_s, target_s, None
        self.changed(t, grew=True)


class BudgetController:
    """Per-replica feedback on the batch step target; see the module docstring."""

    steers_engine: ClassVar[bool] = True
    guards_kv: ClassVar[bool] = True

    def __init__(
        self,
        slo: SLO,
        model: StepTimeModel,
        config: BudgetControllerConfig | None = None,
        engine_slots: int | None = None,
        slack_marks: Mapping[str, float] | None = None,
    ) -> None:
        self.slo, self.model, self.engine_slots = slo, model, engine_slots
        self.config = config or BudgetControllerConfig()
        self.states: dict[str, _Replica] = {}
        self.slack_marks = dict(slack_marks or {})  # where each replica's last run left its mark
        if not all(0 < m < 1 for m in self.slack_marks.values()):
            raise ValueError(f"slack marks must be in (0, 1), got {self.slack_marks}")

    def decide(self, obs: Observation) -> Decision:
        """The batch step target, seats and KV room for `obs.replica` until the next decision."""
        state = self.states.get(obs.replica)
        if not obs.fresh:
            return Decision(0, NO_SECTION_CAP, pause=True, reason="stale", batch_step_target_ms=0.0,
                            chat_cache_horizon_s=self.config.chat_cache_horizon_s)  # fmt: skip
        ceiling = self.slo.chat_itl_p99_ms / 1000  # each step at the target is a gap that long
        cold = state is None or obs.t - state.last_fresh_t > self.config.stale_after_s
        if cold:
            if state is None:
                mark = self.slack_marks.get(obs.replica, self.config.slack_fraction)
                state = self.states[obs.replica] = _Replica(PressureSpread.from_slack(mark))
            state.restart(obs.t, COLD_START_SHARE * ceiling)
        first_measure = self._correct_model(state, obs)
        if first_measure and not cold:  # the steps so far ran at the fit's word: re-aim, unjudged
            state.changed(obs.t, grew=False)
        if cold or first_measure:
            reason = "cold-start"
        elif state.target_s > ceiling:  # a cut from a step the corrected model says ran long
            state.target_s, reason = ceiling, "ceiling"
            state.changed(obs.t, grew=False)
        else:
            reason = self._feedback(state, obs, ceiling)
        state.last_fresh_t = obs.t
        sent = state.target_s / state.ratio  # between changes the target sent only falls
        state.sent_s = sent if reason in CHANGES else min(state.sent_s, sent)
        mean = self._mean_share(obs)
        return Decision(
            batch_seats=self._seats(state, obs, mean),
            chunk_tokens=NO_SECTION_CAP,
            reason=reason,
            predicted_step_ms=1000 * state.sent_s * state.ratio,
            batch_step_target_ms=1000 * state.sent_s,
            kv_room_tokens=self._kv_room(obs),
            idle_step_target_ms=self._idle_target_ms(state),
            mean_step_target_ms=1000 * state.sent_s * mean if mean < 1 else None,
            chat_cache_horizon_s=self.config.chat_cache_horizon_s,
            slack_mark=state.spread.slack_mark(),
            tail_scale=False,
        )

    def _mean_share(self, obs: Observation) -> float:
        """The share of the target batch's steps keep to on average: with an E2E SLO, the step at
        which chat's p99 answer, a token a step, takes all of it, over the ITL SLO (at most 1).
        Feedback moves both together, so whichever SLO binds sets the level."""
        e2e_ms, answer = self.slo.chat_e2e_p99_ms, obs.chat_answer_tokens_p99
        if e2e_ms is None or answer is None:
            return 1.0
        return min(1.0, e2e_ms / max(1.0, answer) / self.slo.chat_itl_p99_ms)

    def _feedback(self, state: _Replica, obs: Observation, ceiling: float) -> str:
        slo, o = self.slo, obs  # pressure: the worst window p99 over its SLO (0: no chat)
        measured = ((o.chat_itl_p99_s, slo.chat_itl_p99_ms), (o.chat_ttft_p99_s, slo.chat_ttft_p99_ms),
                    (o.chat_e2e_p99_s, slo.chat_e2e_p99_ms))  # fmt: skip
        pressure = max((1000 * v / ms for v, ms in measured if v is not None and ms), default=0.0)
        after_change = obs.window_s is None or obs.t - obs.window_s >= state.changed_t
        bound = obs.target_bound_share
        binding = bound is None or bound > 1 - ITL_QUANTILE  # else chat ran without the target
        if binding and (after_change or pressure > 1.0):  # a break right after a growth judges it
            state.spread.judge_growth(pressure)
        if binding and after_change:
            state.spread.observe(obs.t, obs.t - (obs.window_s or 0.0), pressure)
        slack = state.spread.slack_mark()
        ran_s = state.sent_s * state.ratio  # the real step the window ran at
        if pressure > 1.0 and (after_change or state.grew_last):
            state.broke = (obs.t, ran_s, pressure)
            state.target_s = ran_s * min(self.config.cut_factor, 1 / pressure)
            state.changed(obs.t, grew=False)
            return "cut"
        if not after_change:
            return "hold"
        if pressure >= slack:
            state.pressed_t = obs.t
            return "hold"
        pressed = state.pressed_t is not None and obs.t - state.pressed_t < (obs.window_s or 0.0)
        if pressed or not binding:  # not a whole slack window since, or chat ran without the target
            return "hold"
        # Gaps shorter than the step that ran show headroom the target already allows. The
        # pressure that binds is priced in proportion to the step, so one growth brings it to the
        # slack mark, never past the ceiling (§7.2) or a recent break (§7.3); a TTFT or E2E
        # pressure by its own headroom, not by ITL's.
        pressure = max(pressure, 1000 * ran_s / self.slo.chat_itl_p99_ms)
        grown = min(ceiling, ran_s * slack / pressure,
                    self._toward_break(state, obs, ran_s, pressure, slack))  # fmt: skip
        if grown > ran_s:
            state.target_s = grown
            state.changed(obs.t, grew=True, aimed=pressure * grown / ran_s)
            return "grow"
        return "hold"

    def _toward_break(
        self, state: _Replica, obs: Observation, ran_s: float, pressure: float, slack: float
    ) -> float:
        """Where the line through (`ran_s`, `pressure`) and the last break, if recent and above
        on both axes, meets the slack mark: pressure is convex in the step, so growth settles on
        the mark from below (§7.3); infinity otherwise."""
        t, broke_s, broke_p = state.broke or (-math.inf, 0.0, 0.0)
        lapsed = obs.t - t > BREAK_MEMORY_WINDOWS * (obs.window_s or 0.0)
        if lapsed or broke_s <= ran_s or broke_p <= pressure:
            return math.inf
        slope = (broke_p - pressure) / (broke_s - ran_s)
        return ran_s + (slack - pressure) / slope

    def _idle_target_ms(self, state: _Replica) -> float:
        """The target with no chat in the engine: `IDLE_TTFT_SHARE` of the TTFT SLO at a target
        of the ITL SLO, in proportion below, so feedback moves both."""
        idle_share = IDLE_TTFT_SHARE * self.slo.chat_ttft_p99_ms / self.slo.chat_itl_p99_ms
        return 1000 * state.sent_s * max(1.0, idle_share)

    def _correct_model(self, state: _Replica, obs: Observation) -> bool:
        """Fold in the plug-in's measured/modelled batch step time; True for the first one, which
        is the engine's whole record where it has one (earlier runs' steps, not one window's)."""
        first, r = not state.ratio_measured, obs.step_time_ratio
        if first and obs.engine_step_time_ratio is not None:
            r = obs.engine_step_time_ratio
        if r is None or not math.isfinite(r) or r <= 0:
            return False
        r = min(max(r, RATIO_BOUNDS[0]), RATIO_BOUNDS[1])
        state.ratio += (1.0 if first else RATIO_SMOOTHING) * (r - state.ratio)
        state.ratio_measured = True
        return first

    def _seats(self, state: _Replica, obs: Observation, mean: float) -> int:
        """One seat more than in flight while the decodes that can share a step fit
        `DECODE_SHARE` of its mean target: chat's, batch's decoding now and the next prefill to
        end (the plug-in grants prefill chunks in the engine's order, so prefills end in turn)."""
        cfg, in_flight, cap = self.config, obs.batch_in_flight, self.config.max_seats
        if self.engine_slots is not None:
            cap = min(cap, max(1, int(self.engine_slots * (1 - cfg.chat_slot_share))))
        if not in_flight:
            return min(cap, 1 if obs.chat_decoding else cap)
        mean_context = sum(b.prompt_tokens + b.output_tokens for b in in_flight) / len(in_flight)
        joining = sum(1 for b in in_flight if not b.prefill_remaining) + 1
        decodes = StepBatch((), obs.chat_decoding + joining,
                            obs.chat_decode_context_tokens + int(joining * mean_context))  # fmt: skip
        fits = self.model.step_seconds(decodes) <= DECODE_SHARE * state.sent_s * mean
        return min(cap, len(in_flight) + 1 if fits else len(in_flight))

    def _kv_room(self, obs: Observation) -> int | None:
        """KV tokens new batch requests may claim under the high-water mark, beside what the
        engine holds, chat's cached working set and what admitted batch will still add."""
        cap = obs.kv_capacity_tokens
        if not cap or obs.kv_usage is None:
            return None
        to_come = sum(b.prefill_remaining + max(0, b.output_tokens) for b in obs.batch_in_flight)
        committed = obs.kv_usage * cap + (obs.chat_cache_tokens or 0) + to_come
        return max(0, int(self.config.kv_high_water * cap - committed))
