"""Controller v2: feedback on the batch step target, model correction, seats and KV room."""

from __future__ import annotations

import dataclasses
import random

import pytest

from scheduler.admission import BatchInFlight, Observation
from scheduler.budget_controller import (
    BREAK_MEMORY_WINDOWS,
    COLD_START_SHARE,
    ITL_QUANTILE,
    BudgetController,
    BudgetControllerConfig,
)
from scheduler.latency_model import LatencyModel
from scheduler.slo import SLO

SLO_ = SLO(chat_itl_p99_ms=50, chat_ttft_p99_ms=1000, window_s=60)
MODEL = LatencyModel(s_per_token=1e-5, s_weight_read=0.01, s_per_context_token=3e-8)
WINDOW = 60.0


def obs(t: float, itl_ms: float | None = 30, ttft_ms: float | None = 300, **kw) -> Observation:
    return Observation(
        t=t, replica="r0",
        chat_itl_p99_s=None if itl_ms is None else itl_ms / 1000,
        chat_ttft_p99_s=None if ttft_ms is None else ttft_ms / 1000,
        window_s=WINDOW, chat_decoding=8, chat_decode_context_tokens=8000, **kw,
    )  # fmt: skip


def controller(**cfg) -> BudgetController:
    return BudgetController(SLO_, MODEL, BudgetControllerConfig(**cfg), engine_slots=64)


def test_cold_start_is_half_the_itl_allowance():
    d = controller().decide(obs(0))
    assert d.reason == "cold-start" and not d.pause
    assert d.batch_step_target_ms == pytest.approx(COLD_START_SHARE * 50)


def test_a_violation_cuts_at_the_next_decision():
    c = controller()
    before = c.decide(obs(0)).batch_step_target_ms
    d = c.decide(obs(3, itl_ms=60))
    assert d.reason == "cut" and d.batch_step_target_ms == pytest.approx(before * 0.7)


def test_a_break_far_over_the_slo_is_cut_to_where_the_proportional_model_ends_it():
    """A cold start into an E2E SLO read 2.5x its SLO: cutting by `cut_factor` alone would take
    three windows of breaks to get under it; one cut goes as far as the break says."""
    c = BudgetController(SLO(chat_itl_p99_ms=50, chat_ttft_p99_ms=1000, chat_e2e_p99_ms=1500),
                         MODEL, engine_slots=64)  # fmt: skip
    before = c.decide(obs(0)).batch_step_target_ms
    d = c.decide(obs(3, itl_ms=20, ttft_ms=300, chat_e2e_p99_s=3.75))
    assert d.reason == "cut" and d.batch_step_target_ms == pytest.approx(before / 2.5)
    mild = controller()
    before = mild.decide(obs(0)).batch_step_target_ms
    assert mild.decide(obs(3, itl_ms=55)).batch_step_target_ms == pytest.approx(before * 0.7)


def test_after_a_cut_only_a_window_that_began_after_it_cuts_again():
    c = controller()
    c.decide(obs(0))
    first = c.decide(obs(3, itl_ms=60)).batch_step_target_ms
    # A chat burst that keeps worsening inside the same window is not answered by cut after cut.
    for t in range(6, 60, 3):
        assert c.decide(obs(t, itl_ms=60 + t)).batch_step_target_ms == first
    assert c.decide(obs(3 + WINDOW, itl_ms=70)).reason == "cut", "still violated after a window"


def test_a_violation_right_after_a_growth_cuts_at_once():
    c = controller()
    for t in range(0, int(WINDOW), 3):
        c.decide(obs(t, itl_ms=10, ttft_ms=100))
    grown = c.decide(obs(WINDOW, itl_ms=10, ttft_ms=100))
    assert grown.reason == "grow"
    d = c.decide(obs(WINDOW + 3, itl_ms=60))
    assert d.reason == "cut" and d.batch_step_target_ms < grown.batch_step_target_ms


def test_slack_grows_at_most_once_per_window_and_never_past_the_slo():
    c = controller()
    targets = [c.decide(obs(t, itl_ms=10, ttft_ms=100)).batch_step_target_ms
               for t in range(0, 3000, 3)]  # fmt: skip
    grows = sum(1 for a, b in zip(targets, targets[1:], strict=False) if b > a)
    assert grows <= 3000 / WINDOW + 1
    assert targets[-1] > targets[0]
    assert max(targets) <= 50 + 1e-9


def test_growth_is_the_itl_headroom_below_the_slack_mark():
    c = controller()
    cold = c.decide(obs(0)).batch_step_target_ms
    for t in range(3, int(WINDOW), 3):
        assert c.decide(obs(t, itl_ms=25, ttft_ms=100)).reason == "hold", "window not yet new"
    # Pressure 0.5 (ITL 25 of 50 ms): raised by (0.8 - 0.5) x 50 ms, so ITL lands at the mark.
    d = c.decide(obs(WINDOW, itl_ms=25, ttft_ms=100))
    assert d.reason == "grow" and d.batch_step_target_ms == pytest.approx(cold + 0.3 * 50)


def test_a_window_whose_gaps_ran_short_of_its_step_grows_only_to_the_slack_mark():
    """Cold start at 25 ms while no batch chunk fitted its steps: chat's ITL p99 reads 10 ms,
    pressure 0.2. The headroom that shows is the step's, not the target's: growing by it (0.6 x
    50 ms past 25) would reach the SLO itself. Growth counts the target's own 0.5 and stops at the
    slack mark, 40 ms."""
    c = controller()
    c.decide(obs(0))
    for t in range(3, int(WINDOW) + 1, 3):
        d = c.decide(obs(t, itl_ms=10, ttft_ms=100, target_bound_share=0.9))
    assert d.reason == "grow" and d.batch_step_target_ms == pytest.approx(0.8 * 50)


def test_growth_waits_for_a_window_in_which_the_target_bound():
    """Anti-windup: chat alone before the backlog arrives is slack, but no step ran at the target,
    so the window says nothing of a larger one; a violation still cuts, bound or not."""
    c = controller()
    cold = c.decide(obs(0)).batch_step_target_ms
    quiet = {"itl_ms": 25, "ttft_ms": 100}
    for t in range(3, 10 * int(WINDOW), 3):
        d = c.decide(obs(t, target_bound_share=0.0, **quiet))
        assert d.reason == "hold" and d.batch_step_target_ms == cold
    t = 10 * int(WINDOW)
    assert c.decide(obs(t, target_bound_share=1 - ITL_QUANTILE, **quiet)).reason == "hold"
    assert c.decide(obs(t + 3, target_bound_share=0.3, **quiet)).reason == "grow"
    assert c.decide(obs(t + 6, itl_ms=60, target_bound_share=0.0)).reason == "cut"
    # A sensor that cannot tell (no plug-in status) leaves growth to the latency feedback alone.
    unknown = controller()
    reasons = [unknown.decide(obs(t, **quiet)).reason for t in range(0, int(WINDOW) + 1, 3)]
    assert reasons[-1] == "grow"


def test_a_lucky_window_among_pressed_ones_is_no_room_to_grow():
    """Windows at one target vary; after a pressed one, slack must last a whole window."""
    c = controller()
    c.decide(obs(0))
    for t in range(3, int(WINDOW), 3):
        c.decide(obs(t, itl_ms=42, ttft_ms=100))  # 0.84 of the SLO: in the hold band
    assert c.decide(obs(WINDOW, itl_ms=42, ttft_ms=100)).reason == "hold"
    for t in range(int(WINDOW) + 3, int(2 * WINDOW), 3):  # slack, for less than a window
        assert c.decide(obs(t, itl_ms=30, ttft_ms=100)).reason == "hold"
    assert c.decide(obs(2 * WINDOW, itl_ms=30, ttft_ms=100)).reason == "grow"


def test_growth_is_divided_by_the_tail_of_chat_gaps_over_the_step():
    """The engine runs at half the model's price. Between changes the target sent does not rise;
    at the growth, ITL p99 30 ms on steps of `ran` ms (25) is a tail of 30/ran, so the headroom
    (0.8 - 0.6) x 50 ms buys that much less step, and ITL lands at the slack mark rather than the
    tail past it."""
    c = controller()
    cold = c.decide(obs(0, step_time_ratio=0.5)).batch_step_target_ms
    for t in range(3, int(WINDOW), 3):
        held = c.decide(obs(t, itl_ms=30, ttft_ms=100, step_time_ratio=0.5))
        assert held.reason == "hold" and held.batch_step_target_ms == pytest.approx(cold)
    ran_ms = held.predicted_step_ms
    d = c.decide(obs(WINDOW, itl_ms=30, ttft_ms=100, step_time_ratio=0.5))
    assert d.reason == "grow"
    assert d.predicted_step_ms == pytest.approx(ran_ms + 0.2 * 50 / (30 / ran_ms), rel=0.02)
    assert d.batch_step_target_ms == pytest.approx(d.predicted_step_ms / 0.5, rel=0.05)


def test_after_a_cut_growth_stops_short_of_the_step_that_broke_and_probes_past_it_later():
    """Cold start at 25 ms; a window breaks (pressure 1.2) and the step is cut to 17.5 ms. A
    window there at pressure 0.4 would, by its own headroom, grow by 0.4 x 50 ms to 37.5 ms, past
    the 25 ms that broke. The line through (17.5 ms, 0.4) and (25 ms, 1.2) reaches the slack mark
    0.8 at 21.25 ms, and growth stops there. Once the break is BREAK_MEMORY_WINDOWS old, a slack
    window grows by its headroom again, past the old break."""
    c = controller()
    c.decide(obs(0))
    cut = c.decide(obs(3, itl_ms=60, ttft_ms=100))
    assert cut.reason == "cut" and cut.batch_step_target_ms == pytest.approx(17.5)
    for t in range(6, int(WINDOW) + 6, 3):
        d = c.decide(obs(t, itl_ms=20, ttft_ms=100))
    assert d.reason == "grow"
    assert d.batch_step_target_ms == pytest.approx(17.5 + (0.8 - 0.4) * (25 - 17.5) / 0.8)
    lapsed = 3 + BREAK_MEMORY_WINDOWS * WINDOW
    remembered = [c.decide(obs(t, itl_ms=20, ttft_ms=100)).batch_step_target_ms
                  for t in range(int(WINDOW) + 9, int(lapsed) + 1, 3)]  # fmt: skip
    assert max(remembered) < 25, "each growth draws the line again, and stays below the break"
    after = [c.decide(obs(t, itl_ms=20, ttft_ms=100)).batch_step_target_ms
             for t in range(int(lapsed) + 3, int(lapsed + 2 * WINDOW), 3)]  # fmt: skip
    assert max(after) > 25, "a lapsed break no longer bounds growth"


def test_a_steady_signal_in_the_hold_band_never_oscillates():
    """Held, the windows show no spread, so the slack mark rises past them and the target creeps
    up; it never cuts, never falls, and never passes the ITL SLO."""
    c = controller()
    c.decide(obs(0))
    decisions = [c.decide(obs(t, itl_ms=45, ttft_ms=800)) for t in range(3, 1800, 3)]
    assert {d.reason for d in decisions} == {"hold", "grow"}
    targets = [d.batch_step_target_ms for d in decisions]
    assert targets == sorted(targets) and targets[-1] <= 50
    assert targets[len(targets) // 4] == targets[0], "held until the spread was measured"


def test_windows_that_swing_at_one_target_hold_it_where_steady_ones_grow():
    """Same mean pressure, 0.9 of the SLO, in the hold band of the configured slack mark: the
    steady replica's windows show the margin is more than it needs, and it grows; the swinging
    one's (0.82, 0.98, ...) show it needs more, and it holds."""
    steady, swinging = controller(), controller()
    steady.decide(obs(0))
    swinging.decide(obs(0))
    for t in range(3, int(10 * WINDOW), 3):
        d_steady = steady.decide(obs(t, itl_ms=45, ttft_ms=100))
        d_swing = swinging.decide(obs(t, itl_ms=49 if (t // WINDOW) % 2 else 41, ttft_ms=100))
        assert d_swing.reason == "hold"
    assert d_steady.batch_step_target_ms > d_swing.batch_step_target_ms
    assert swinging.states["r0"].spread.slack_mark() < 0.8


def test_ttft_and_e2e_violations_cut_too():
    c = controller()
    c.decide(obs(0))
    assert c.decide(obs(3, itl_ms=20, ttft_ms=1500)).reason == "cut"
    e2e = BudgetController(SLO(chat_itl_p99_ms=50, chat_ttft_p99_ms=1000, chat_e2e_p99_ms=4000),
                           MODEL, engine_slots=64)  # fmt: skip
    e2e.decide(obs(0))
    assert e2e.decide(obs(3, itl_ms=20, ttft_ms=300, chat_e2e_p99_s=5.0)).reason == "cut"


def test_stale_observations_pause_and_a_long_gap_restarts_cold():
    c = controller()
    c.decide(obs(0))
    c.decide(obs(3, itl_ms=10))
    assert c.decide(Observation(t=6, replica="r0", fresh=False)).pause
    assert c.decide(obs(100)).reason == "cold-start"


def test_a_model_that_is_twice_too_optimistic_gets_half_the_target_sent():
    c = controller()
    c.decide(obs(0))
    for t in range(3, 120, 3):
        d = c.decide(obs(t, itl_ms=45, ttft_ms=800, step_time_ratio=2.0))
    assert d.predicted_step_ms / d.batch_step_target_ms == pytest.approx(2.0, rel=0.01)


def test_the_first_measured_ratio_re_aims_the_cold_start_and_its_window_judges_nothing():
    """A host that runs the fit's steps twice as long: its first window broke the SLO (pressure
    1.4) at twice the step decided. The decision after the first batch steps sends half the
    cold-start target, not a smoothed step toward it and not a cut from the step that ran, and
    windows that began before it are not judged: they measured the fit's error, not the target."""
    c = controller()
    cold = c.decide(obs(0))
    d = c.decide(obs(1, itl_ms=70, ttft_ms=100, step_time_ratio=2.0))
    assert d.reason == "cold-start"
    assert d.batch_step_target_ms == pytest.approx(cold.batch_step_target_ms / 2)
    assert c.decide(obs(3, itl_ms=70, ttft_ms=100, step_time_ratio=2.0)).reason == "hold"
    later = c.decide(obs(2, itl_ms=20, ttft_ms=100, step_time_ratio=1.0))
    assert later.predicted_step_ms / later.batch_step_target_ms == pytest.approx(
        2.0 + 0.3 * (1.0 - 2.0)
    ), "later measurements are smoothed"


def test_the_engines_record_starts_the_run_at_its_ratio_and_a_stale_spell_keeps_it():
    """An engine that has timed batch steps before (last night's run, an earlier scenario) says
    at the first decision how far the fit is off here: the cold start is sent at it, so the
    first interval runs at the step decided; a window's ratio is then smoothed in. A stale spell
    restarts the target, not what was learnt about the host."""
    c = controller()
    fit = controller().decide(obs(0)).batch_step_target_ms
    d = c.decide(obs(0, engine_step_time_ratio=2.5))
    assert d.reason == "cold-start"
    assert d.batch_step_target_ms == pytest.approx(fit / 2.5)
    d = c.decide(obs(3, engine_step_time_ratio=2.4, step_time_ratio=2.0))
    assert d.reason != "cold-start"
    ratio = 2.5 + 0.3 * (2.0 - 2.5)
    assert d.predicted_step_ms / d.batch_step_target_ms == pytest.approx(ratio)
    assert c.decide(obs(30, fresh=False)).pause
    again = c.decide(obs(60))
    assert again.reason == "cold-start"
    assert again.batch_step_target_ms == pytest.approx(fit / ratio)


def test_seats_leave_chat_its_slots_and_batch_decodes_half_the_target():
    c = controller(max_seats=1000)
    c.decide(obs(0))
    few = [BatchInFlight(1000, 1000, 100)] * 3
    assert c.decide(obs(3, batch_in_flight=tuple(few))).batch_seats == 4
    many = [BatchInFlight(80_000, 80_000, 500)] * 20
    assert c.decide(obs(6, batch_in_flight=tuple(many))).batch_seats == 20, "no seat added"
    slots = [BatchInFlight(10, 10, 1)] * 40
    assert c.decide(obs(9, batch_in_flight=tuple(slots))).batch_seats == 32, "half of 64 slots"


def test_a_seat_in_prefill_is_not_priced_as_a_decode_but_decodes_still_bound_seats():
    c = controller(max_seats=1000)
    c.decide(obs(0))
    prefilling = [BatchInFlight(30_000, 1_000, 500)] * 20
    # Twenty documents in prefill decode one after another: the step carries one, and it fits.
    assert c.decide(obs(3, batch_in_flight=tuple(prefilling))).batch_seats == 21
    decoding = [BatchInFlight(30_000, 30_000, 500)] * 20
    mixed = tuple(decoding + prefilling[:1])
    assert c.decide(obs(6, batch_in_flight=mixed)).batch_seats == 21, "decodes fill the share"


def test_the_kv_room_never_lets_a_document_past_the_high_water_mark():
    rng = random.Random(7)
    c = controller(kv_high_water=0.9)
    for i in range(500):
        cap = rng.randint(100_000, 2_000_000)
        in_flight = tuple(
            BatchInFlight(p, rng.randint(0, p), rng.randint(0, 1000))
            for p in (rng.randint(1000, 80_000) for _ in range(rng.randint(0, 6)))
        )
        usage = rng.random() * 0.95
        chat_cache = rng.choice([None, rng.randint(0, cap // 2)])
        d = c.decide(obs(3 * i, kv_usage=usage, kv_capacity_tokens=cap, batch_in_flight=in_flight,
                         chat_cache_tokens=chat_cache))  # fmt: skip
        committed = usage * cap + sum(b.prefill_remaining + b.output_tokens for b in in_flight)
        committed += chat_cache or 0
        doc = rng.randint(1000, 90_000)
        if doc <= d.kv_room_tokens:
            assert committed + doc <= 0.9 * cap + 1


def test_a_document_waits_while_it_would_evict_chats_cached_histories():
    """Room beside what the engine holds is not room beside the histories chat comes back to."""
    c = controller(kv_high_water=0.9, chat_cache_horizon_s=45.0)
    cap, doc = 468_000, 82_000
    alone = c.decide(obs(0, kv_usage=0.4, kv_capacity_tokens=cap))
    assert alone.kv_room_tokens >= doc, "beside what the engine holds, it fits"
    beside = c.decide(obs(3, kv_usage=0.4, kv_capacity_tokens=cap, chat_cache_tokens=200_000))
    assert beside.kv_room_tokens < doc
    assert beside.chat_cache_horizon_s == 45.0, "the plug-in is told how far back to count"
    assert c.decide(obs(6, fresh=False)).chat_cache_horizon_s == 45.0, "and still while paused"


def test_the_idle_target_is_a_share_of_the_ttft_slo_and_moves_with_feedback():
    from scheduler.budget_controller import IDLE_TTFT_SHARE

    c = controller()
    cold = c.decide(obs(0))
    # At the cold start the target is half its ceiling, so is the idle target's share.
    assert cold.idle_step_target_ms == pytest.approx(IDLE_TTFT_SHARE * 1000 * COLD_START_SHARE)
    cut = c.decide(obs(3, itl_ms=60))
    assert cut.idle_step_target_ms == pytest.approx(cold.idle_step_target_ms * 0.7)
    assert cut.idle_step_target_ms >= cut.batch_step_target_ms


def test_a_break_right_after_a_growth_lowers_the_mark_it_grew_to():
    """The growth aimed at the slack mark; the window right after it broke the SLO. That is a
    growth off by more than the mark allowed for, and the mark comes down, so the next growth
    stops further below the SLO."""
    c = controller()
    for t in range(0, int(WINDOW), 3):
        c.decide(obs(t, itl_ms=10, ttft_ms=100))
    assert c.decide(obs(WINDOW, itl_ms=10, ttft_ms=100)).reason == "grow"
    before = c.states["r0"].spread.slack_mark()
    assert c.decide(obs(WINDOW + 3, itl_ms=60)).reason == "cut"
    assert c.states["r0"].spread.slack_mark() < before


def test_a_replica_starts_at_the_mark_an_earlier_run_left_and_grows_to_it():
    marks = {"r0": 0.6}
    c = BudgetController(SLO_, MODEL, BudgetControllerConfig(), engine_slots=64, slack_marks=marks)
    assert c.decide(obs(0)).slack_mark == pytest.approx(0.6)
    other = dataclasses.replace(obs(0), replica="r1")
    assert c.decide(other).slack_mark == pytest.approx(0.8), "a replica not named: the prior"
    for t in range(3, int(WINDOW), 3):
        c.decide(obs(t, itl_ms=10, ttft_ms=100))
    grown = c.decide(obs(WINDOW, itl_ms=10, ttft_ms=100))
    # The window ran at pressure 0.5 (the step's own share of the ITL SLO): growth aims at 0.6.
    assert grown.reason == "grow" and grown.batch_step_target_ms == pytest.approx(30, rel=0.01)
    with pytest.raises(ValueError, match=r"slack marks must be in \(0, 1\)"):
        BudgetController(SLO_, MODEL, slack_marks={"r0": 1.0})


E2E_SLO = SLO(chat_itl_p99_ms=50, chat_ttft_p99_ms=1000, chat_e2e_p99_ms=2000, window_s=60)


def test_an_e2e_slo_over_chats_p99_answer_sets_the_mean_batch_steps_keep_to():
    """2 s over 100-token answers: steps longer than 20 ms on average stream the p99 answer past
    the E2E SLO, whatever the ITL SLO allows each one. The target stays the ITL's (one step may
    run to it); the mean is the target in the share 20 ms bears to the ITL SLO, so feedback moves
    both, and growth takes the mean no further than 20 ms."""
    c = BudgetController(E2E_SLO, MODEL, engine_slots=64)
    d = c.decide(obs(0, chat_answer_tokens_p99=100.0))
    assert d.reason == "cold-start" and d.batch_step_target_ms == pytest.approx(
        COLD_START_SHARE * 50
    )
    assert d.mean_step_target_ms == pytest.approx(COLD_START_SHARE * 20)
    ds = [c.decide(obs(t, itl_ms=5, ttft_ms=100, chat_e2e_p99_s=0.2, chat_answer_tokens_p99=100.0))
          for t in range(3, 3000, 3)]  # fmt: skip
    assert all(d.mean_step_target_ms == pytest.approx(0.4 * d.batch_step_target_ms) for d in ds)
    assert (
        max(d.batch_step_target_ms for d in ds) <= 50
        and max(d.mean_step_target_ms for d in ds) <= 20
    )
    assert ds[-1].batch_step_target_ms > 25, "slack grows both"
    # Without an E2E SLO answer lengths bound nothing: every step is held to the target.
    plain = controller().decide(obs(0, chat_answer_tokens_p99=100.0))
    assert plain.batch_step_target_ms == pytest.approx(COLD_START_SHARE * 50)
    assert plain.mean_step_target_ms is None


def test_answers_counted_after_the_cold_start_set_the_mean_at_once():
    """The backlog can start before chat has finished an answer (or chat's answers lengthen): the
    first count sets the mean at the next decision, without waiting for a window to judge; a
    window that breaks the E2E SLO right after the cold start is cut for at once."""
    c = BudgetController(E2E_SLO, MODEL, engine_slots=64)
    d = c.decide(obs(0))
    assert d.batch_step_target_ms == pytest.approx(25) and d.mean_step_target_ms is None
    d = c.decide(obs(3, chat_answer_tokens_p99=200.0))
    assert d.reason == "hold" and d.mean_step_target_ms == pytest.approx(25 * 10 / 50)
    d = c.decide(obs(6, chat_e2e_p99_s=2.4, chat_answer_tokens_p99=200.0))
    assert d.reason == "cut" and d.mean_step_target_ms == pytest.approx(
        0.2 * d.batch_step_target_ms
    )
    assert d.batch_step_target_ms < 25
