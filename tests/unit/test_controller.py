"""SLOController: cold start, feedback (cut fast, grow slowly, hold), KV guard, fail-safe, feed-forward."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pydantic import ValidationError

from scheduler import feed_forward
from scheduler.admission import BatchInFlight, Observation, prefill_fits
from scheduler.controller import (
    ControllerConfig,
    SLOController,
    batch_seat_limit,
    controller_config,
    engine_step_tokens,
)
from scheduler.latency_model import LatencyModel, largest_chunk_within, roofline_model
from scheduler.slo import SLO

SLO_50 = SLO(chat_itl_p99_ms=50, chat_ttft_p99_ms=1000)
# A small linear model: 40 ms of budget fits a chunk of about 1.9k tokens at prefix 0.
MODEL = LatencyModel(
    s_per_token=2e-5,
    s_weight_read=0.01,
    s_per_attention_unit=2e-10,
    s_per_context_token=2e-8,
    overhead_s=0.001,
)
INTERVAL = 5.0


def batch(n: int, prompt: int = 512, prefilled: int | None = None) -> tuple[BatchInFlight, ...]:
    """n admitted batch requests; by default fully prefilled (decoding their summary)."""
    return tuple(
        BatchInFlight(prompt, prompt if prefilled is None else prefilled) for _ in range(n)
    )


def obs(t: float, in_flight: int = 0, replica: str = "r0", **kw) -> Observation:
    return Observation(t=t, replica=replica, batch_in_flight=batch(in_flight), **kw)


def drive(c: SLOController, start: float, steps: int, replica: str = "r0", **kw) -> list:
    """Feed `steps` observations one interval apart with the pipeline filling every seat."""
    decisions, seats = [], c.states[replica].seats if replica in c.states else 1
    for i in range(steps):
        d = c.decide(obs(start + i * INTERVAL, in_flight=seats, replica=replica, **kw))
        decisions.append(d)
        seats = d.batch_seats
    return decisions


def after(c: SLOController, k: int = 1, replica: str = "r0") -> float:
    """The time `k` intervals after the last fresh observation of `replica`."""
    return c.states[replica].last_fresh_t + k * INTERVAL


def grown(steps: int = 20, **cfg) -> SLOController:
    """A controller that has grown for a while under slack."""
    c = SLOController(SLO_50, MODEL, ControllerConfig(**cfg))
    drive(c, 0.0, steps, chat_itl_p99_s=0.010, chat_ttft_p99_s=0.2)
    return c


def test_cold_start_is_conservative():
    cfg = ControllerConfig()
    d = SLOController(SLO_50, MODEL, cfg).decide(obs(0.0, chat_itl_p99_s=0.01))
    assert d.reason == "cold-start"
    assert (d.batch_seats, d.chunk_tokens) == (cfg.cold_start_seats, cfg.cold_start_chunk_tokens)
    assert not d.pause
    assert d.predicted_step_ms is not None and d.predicted_step_ms <= 50 * cfg.headroom


def test_a_violation_seen_at_cold_start_cuts_the_cold_start_caps():
    cfg = ControllerConfig(cold_start_seats=4)
    d = SLOController(SLO_50, MODEL, cfg).decide(obs(0.0, in_flight=0, chat_itl_p99_s=0.09))
    assert d.reason == "itl-violation"
    assert d.batch_seats < 4 and d.chunk_tokens < cfg.cold_start_chunk_tokens


def test_slack_grows_seats_and_chunk_slowly():
    c = SLOController(SLO_50, MODEL)
    ds = drive(c, 0.0, 12, chat_itl_p99_s=0.010, chat_ttft_p99_s=0.2)
    seats = [d.batch_seats for d in ds]
    chunks = [d.chunk_tokens for d in ds]
    assert seats[-1] > seats[0] and chunks[-1] > chunks[0]
    assert all(b - a <= 1 for a, b in zip(seats, seats[1:], strict=False))  # additive, one seat
    assert "grow" in {d.reason for d in ds} and "hold" in {d.reason for d in ds}  # not every window


def test_itl_violation_cuts_seats_and_chunk_within_one_interval():
    c = grown()
    before = c.states["r0"].seats, c.states["r0"].last_chunk
    d = c.decide(obs(after(c), in_flight=before[0], chat_itl_p99_s=0.080))
    assert d.reason == "itl-violation"
    assert d.batch_seats < before[0] and d.chunk_tokens < before[1]


def test_ttft_violation_cuts_seats_only():
    c = grown()
    before = c.states["r0"].seats, c.states["r0"].last_chunk
    d = c.decide(obs(after(c), in_flight=before[0], chat_itl_p99_s=0.02, chat_ttft_p99_s=3.0))
    assert d.reason == "ttft-violation"
    assert d.batch_seats < before[0] and d.chunk_tokens == before[1]


def test_a_sliding_window_reporting_the_same_slow_spell_cuts_once():
    c = grown()
    t, seats = after(c), c.states["r0"].seats
    first = c.decide(obs(t, in_flight=seats, chat_itl_p99_s=0.080, window_s=15.0))
    assert first.reason == "itl-violation"
    # the next readings still hold the slow spell (their windows began before the cut)
    again = [
        c.decide(
            obs(
                t + k * INTERVAL / 2, in_flight=first.batch_seats, chat_itl_p99_s=p99, window_s=15.0
            )
        )
        for k, p99 in ((1, 0.080), (2, 0.070))
    ]
    assert [d.reason for d in again] == ["settling", "settling"]
    assert all(d.batch_seats == first.batch_seats for d in again)
    worse = c.decide(
        obs(t + 1.5 * INTERVAL, in_flight=first.batch_seats, chat_itl_p99_s=0.090, window_s=15.0)
    )
    assert worse.reason == "itl-violation" and worse.batch_seats < first.batch_seats
    # a window that starts after the last cut is new evidence, however it compares
    fresh = c.decide(
        obs(
            t + 1.5 * INTERVAL + 16.0,
            in_flight=worse.batch_seats,
            chat_itl_p99_s=0.060,
            window_s=15.0,
        )
    )
    assert fresh.reason == "itl-violation" and fresh.batch_seats <= worse.batch_seats


def test_a_ttft_spell_is_judged_by_ttft_alone_and_an_itl_break_is_new():
    c = grown()
    t, seats = after(c), c.states["r0"].seats
    kw = {"window_s": 15.0}
    first = c.decide(obs(t, in_flight=seats, chat_itl_p99_s=0.010, chat_ttft_p99_s=3.0, **kw))
    assert first.reason == "ttft-violation"
    # ITL moved a little, TTFT did not get worse: the same slow spell
    same = c.decide(
        obs(t + 2, in_flight=first.batch_seats, chat_itl_p99_s=0.012, chat_ttft_p99_s=2.8, **kw)
    )
    assert same.reason == "settling" and same.batch_seats == first.batch_seats
    itl = c.decide(
        obs(t + 4, in_flight=first.batch_seats, chat_itl_p99_s=0.080, chat_ttft_p99_s=2.8, **kw)
    )
    assert itl.reason == "itl-violation" and itl.batch_seats < first.batch_seats


def test_a_p99_drifting_up_within_the_settle_margin_is_the_same_spell():
    c = grown()
    t, seats = after(c), c.states["r0"].seats
    first = c.decide(obs(t, in_flight=seats, chat_itl_p99_s=0.0500, window_s=15.0))
    assert first.reason == "itl-violation"
    drift = c.decide(obs(t + 3, in_flight=first.batch_seats, chat_itl_p99_s=0.0515, window_s=15.0))
    assert drift.reason == "settling" and drift.batch_seats == first.batch_seats
    strict = SLOController(SLO_50, MODEL, ControllerConfig(settle_margin=0.0))
    strict.states = {"r0": c.states["r0"]}  # the same memory, read without a margin
    again = strict.decide(
        obs(t + 6, in_flight=first.batch_seats, chat_itl_p99_s=0.0515, window_s=15.0)
    )
    assert again.reason == "itl-violation" and again.batch_seats < first.batch_seats


def test_without_a_window_every_violation_cuts():
    c = grown()
    t, seats = after(c), c.states["r0"].seats
    ds = [c.decide(obs(t + k, in_flight=seats, chat_itl_p99_s=0.080)) for k in range(3)]
    assert [d.reason for d in ds] == ["itl-violation"] * 3
    assert ds[2].batch_seats < ds[0].batch_seats


def test_no_growth_during_cooldown_after_a_cut():
    c = grown(cooldown_s=30.0)
    cut = c.decide(obs(after(c), in_flight=10, chat_itl_p99_s=0.080))
    during = [
        c.decide(obs(after(c), in_flight=cut.batch_seats, chat_itl_p99_s=0.01)) for _ in range(5)
    ]
    assert all(d.batch_seats == cut.batch_seats for d in during)
    later = drive(c, after(c), 4, chat_itl_p99_s=0.01)
    assert later[-1].batch_seats > cut.batch_seats


def test_hold_band_keeps_caps():
    c = grown()
    seats, chunk = c.states["r0"].seats, c.states["r0"].last_chunk
    ds = drive(c, after(c), 10, chat_itl_p99_s=0.042)  # between 0.7 × SLO and the SLO
    assert {d.reason for d in ds} == {"hold"}
    assert {(d.batch_seats, d.chunk_tokens) for d in ds} == {(seats, chunk)}


def test_unused_seats_do_not_grow():
    c = SLOController(SLO_50, MODEL)
    for k in range(20):
        d = c.decide(obs(k * INTERVAL, in_flight=0, chat_itl_p99_s=0.01))
    assert d.batch_seats == ControllerConfig().cold_start_seats


def test_missing_itl_falls_back_to_step_samples():
    c = grown()
    seats = c.states["r0"].seats
    slow_steps = tuple([0.020] * 90 + [0.090] * 10)
    d = c.decide(obs(after(c), in_flight=seats, step_samples_s=slow_steps))
    assert d.reason == "itl-violation" and d.batch_seats < seats


def test_kv_above_high_water_pauses():
    c = grown()
    d = c.decide(obs(after(c), in_flight=3, chat_itl_p99_s=0.01, kv_usage=0.9))
    assert d.pause and d.reason == "kv-guard"


def test_kv_guard_counts_prompts_not_yet_prefilled():
    c = grown()
    seats = c.states["r0"].seats
    assert seats >= 4
    admitted = tuple(BatchInFlight(20_000, 0) for _ in range(3))  # 60k tokens still to prefill
    o = Observation(
        t=after(c),
        replica="r0",
        chat_itl_p99_s=0.01,
        kv_usage=0.5,
        kv_capacity_tokens=100_000,
        batch_in_flight=admitted,
    )
    d = c.decide(o)  # 0.5 + 0.6 committed is far over 0.85: nothing more may start
    assert d.pause and d.reason == "kv-guard" and d.batch_seats <= 3


def test_kv_guard_limits_seats_to_what_fits():
    c = grown()
    assert c.states["r0"].seats >= 4
    o = Observation(
        t=after(c),
        replica="r0",
        chat_itl_p99_s=0.01,
        kv_usage=0.70,
        kv_capacity_tokens=100_000,
        batch_in_flight=batch(2, prompt=4000),
    )
    d = c.decide(o)  # room 15k tokens, 4.5k per seat (4000 prompt + 512 output): 3 more seats
    assert d.reason == "kv-guard" and d.batch_seats == 2 + 3 and not d.pause


def test_preemption_pauses_and_cuts_seats():
    c = grown()
    seats = c.states["r0"].seats
    d = c.decide(obs(after(c), in_flight=seats, chat_itl_p99_s=0.01, kv_usage=0.5, preemptions=2))
    assert d.pause and d.reason == "preemption" and d.batch_seats < seats


def test_unreadable_replica_pauses_batch():
    c = grown()
    d = c.decide(Observation(t=after(c), replica="r0", fresh=False))
    assert d.pause and d.reason == "stale-pause"
    first = SLOController(SLO_50, MODEL).decide(Observation(t=0.0, replica="new", fresh=False))
    assert first.pause and first.reason == "stale-pause"


def test_long_silence_restarts_from_cold_start_caps():
    c = grown(stale_after_s=15.0)
    assert c.is_stale("r0", c.states["r0"].last_fresh_t + 16.0)
    assert not c.is_stale("r0", c.states["r0"].last_fresh_t + 5.0)
    d = c.decide(obs(c.states["r0"].last_fresh_t + 60.0, in_flight=5, chat_itl_p99_s=0.01))
    assert d.reason == "cold-start" and d.batch_seats == c.config.cold_start_seats


def test_replicas_are_independent():
    c = grown()
    drive(c, 0.0, 20, replica="r1", chat_itl_p99_s=0.01)
    seats_r1 = c.states["r1"].seats
    c.decide(obs(after(c), in_flight=5, chat_itl_p99_s=0.2))  # r0 violates
    assert c.states["r1"].seats == seats_r1


def test_chunk_late_in_a_long_document_is_smaller_than_at_its_start():
    model = roofline_model("llama-3.1-70b", "h100-sxm", 2, "fp8", "fp8", efficiency=0.6)
    cfg = ControllerConfig(
        min_chunk_tokens=16, max_chunk_tokens=16384, cold_start_chunk_tokens=16384
    )
    chunks = {}
    for p in (0, 40_000, 78_000):
        o = Observation(
            t=0.0,
            replica=f"at-{p}",
            chat_decoding=40,
            chat_decode_context_tokens=40 * 3000,
            batch_in_flight=(BatchInFlight(80_000, p),),
        )
        d = SLOController(SLO_50, model, cfg).decide(o)
        assert not d.pause and d.predicted_step_ms <= 50 * cfg.headroom
        chunks[p] = d.chunk_tokens
    assert chunks[78_000] < chunks[40_000] < chunks[0]
    assert chunks[0] >= 2 * chunks[78_000]


def test_chunk_is_the_largest_that_fits_the_budget():
    cfg = ControllerConfig(max_chunk_tokens=8192, cold_start_chunk_tokens=8192)
    o = Observation(t=0.0, replica="r0", chat_decoding=30, chat_decode_context_tokens=90_000)
    d = SLOController(SLO_50, MODEL, cfg).decide(o)
    assert d.chunk_tokens == largest_chunk_within(MODEL, 0.040, 0, 30, 90_000, 8192, 16)
    assert d.chunk_tokens % cfg.chunk_granularity == 0


def test_chat_load_alone_over_budget_pauses_batch():
    o = Observation(t=0.0, replica="r0", chat_decoding=200, chat_decode_context_tokens=2_000_000)
    d = SLOController(SLO_50, MODEL).decide(o)  # 40 ms of decode attention alone
    assert d.pause and d.reason == "over-budget"


def test_config_errors_name_the_fields():
    with pytest.raises(ValidationError, match="cold_start_seats"):
        ControllerConfig(min_seats=4, cold_start_seats=2)
    with pytest.raises(ValidationError, match="max_chunk_tokens"):
        ControllerConfig(max_chunk_tokens=128, cold_start_chunk_tokens=512)
    with pytest.raises(ValidationError, match="headroom"):
        ControllerConfig(headroom=1.5)


# -- engine step, TTFT allowance and the refined bands ------------------------------------------

ENGINE_STEP = 256
STEPPED = ControllerConfig(
    engine_step_tokens=ENGINE_STEP, min_chunk_tokens=1024, cold_start_chunk_tokens=4096
)


def test_engine_step_tokens_reads_the_engine_flags():
    assert engine_step_tokens({"max-num-batched-tokens": 272}) == 272
    flags = {"max-num-batched-tokens": 512, "long-prefill-token-threshold": 128}
    assert engine_step_tokens(flags) == 128
    assert engine_step_tokens({**flags, "long-prefill-token-threshold": 0}) == 512
    assert engine_step_tokens({**flags, "enable-chunked-prefill": False}) is None
    assert engine_step_tokens({}) is None


def test_a_prompt_longer_than_one_engine_step_is_priced_one_step_at_a_time():
    o = Observation(t=0.0, replica="r0", chat_decoding=30, chat_decode_context_tokens=90_000)
    whole = SLOController(SLO_50, MODEL, ControllerConfig(cold_start_chunk_tokens=4096)).decide(o)
    stepped = SLOController(SLO_50, MODEL, STEPPED).decide(o)
    assert whole.chunk_tokens < 4096  # one 4096-token step would not fit 40 ms
    assert stepped.chunk_tokens > whole.chunk_tokens and not stepped.pause
    assert stepped.predicted_step_ms <= 50 * STEPPED.headroom


SHORT_MEMORY = STEPPED.model_copy(update={"ttft_memory_s": 5.0})


def slack_since_cold_start(c: SLOController) -> float:
    """Decide a cold start with slack chat TTFT; returns a time past its memory of caution."""
    c.decide(Observation(t=0.0, replica="r0", chat_itl_p99_s=0.02, chat_ttft_p99_s=0.2))
    return 10.0


def test_while_chat_ttft_shows_slack_the_admitter_holds_prompts_until_the_prefill_drains():
    c = SLOController(SLO_50, MODEL, SHORT_MEMORY)
    t = slack_since_cold_start(c)
    queued = (BatchInFlight(4096, 0), BatchInFlight(4096, 0), BatchInFlight(4096, 4096))
    o = Observation(
        t=t, replica="r0", chat_itl_p99_s=0.02, chat_ttft_p99_s=0.2, batch_in_flight=queued
    )
    d = c.decide(o)  # 8k prompt tokens queued: a chat arriving now would wait ~2 s behind them
    assert d.reason == "ttft-guard" and not d.pause  # held grant by grant, not for a decision
    budget = d.prefill_budget_tokens
    assert not prefill_fits(8192, d.chunk_tokens, d.chunk_tokens, ENGINE_STEP, budget)
    assert prefill_fits(0, d.chunk_tokens, d.chunk_tokens, ENGINE_STEP, budget)


def test_where_chat_ttft_is_tight_batch_prefill_beyond_the_allowance_pauses():
    c = SLOController(SLO_50, MODEL, STEPPED)
    queued = (BatchInFlight(4096, 0), BatchInFlight(4096, 0), BatchInFlight(4096, 4096))
    for ttft in (None, 0.8):  # unknown since the cold start, or out of its slack band
        o = Observation(
            t=0.0, replica="r0", chat_itl_p99_s=0.02, chat_ttft_p99_s=ttft, batch_in_flight=queued
        )
        d = c.decide(o)
        assert d.pause and d.reason == "ttft-guard" and d.batch_seats <= 3


def test_the_prefill_budget_is_the_ttft_allowance_and_a_chunk_fits_it():
    c = SLOController(SLO_50, MODEL, SHORT_MEMORY.model_copy(update={"cold_start_seats": 8}))
    o = Observation(
        t=slack_since_cold_start(c),
        replica="r0",
        chat_itl_p99_s=0.02,
        chat_ttft_p99_s=0.2,
        batch_in_flight=batch(2),
    )
    d = c.decide(o)
    allowance = feed_forward.prefill_allowance(MODEL, feed_forward.load_of(o), 0.25, ENGINE_STEP)
    assert d.prefill_budget_tokens == allowance and d.chunk_tokens <= allowance
    assert d.batch_seats == 8 and not d.pause and d.reason != "ttft-guard"
    fits = [
        prefill_fits(n * d.chunk_tokens, d.chunk_tokens, d.chunk_tokens, ENGINE_STEP, allowance)
        for n in range(8)
    ]
    assert sum(fits) == allowance // d.chunk_tokens < 8  # what fits at once, not a train of eight
    assert fits == sorted(fits, reverse=True)


def test_where_chat_ttft_is_tight_seats_admit_only_the_prompts_that_fit_now():
    c = SLOController(SLO_50, MODEL, STEPPED.model_copy(update={"cold_start_seats": 8}))
    o = Observation(t=0.0, replica="r0", chat_itl_p99_s=0.02, batch_in_flight=batch(2))
    d = c.decide(o)  # no TTFT reading yet: the cold start counts chat as tight
    assert not d.pause and d.reason == "ttft-guard"
    allowance = feed_forward.prefill_allowance(MODEL, feed_forward.load_of(o), 0.25, ENGINE_STEP)
    new = d.batch_seats - 2
    assert 0 < new < 6  # some new prompts, not a train of six at once
    assert new * d.chunk_tokens <= allowance < (new + 1) * d.chunk_tokens


def test_the_first_ttft_reading_in_its_slack_band_ends_the_cold_starts_caution():
    c = SLOController(SLO_50, MODEL, STEPPED.model_copy(update={"cold_start_seats": 8}))
    cautious = c.decide(Observation(t=0.0, replica="r0", batch_in_flight=batch(2)))
    slack = c.decide(
        Observation(t=3.0, replica="r0", chat_ttft_p99_s=0.2, batch_in_flight=batch(2))
    )
    assert cautious.batch_seats < 8 and slack.batch_seats == 8
    tight = c.decide(
        Observation(t=6.0, replica="r0", chat_ttft_p99_s=0.8, batch_in_flight=batch(2))
    )
    later = c.decide(
        Observation(t=9.0, replica="r0", chat_ttft_p99_s=0.2, batch_in_flight=batch(2))
    )
    assert tight.batch_seats < 8 and later.batch_seats < 8  # a measured near miss is remembered


def test_a_p99_near_the_slo_already_counts_as_a_violation():
    c = grown()
    seats = c.states["r0"].seats
    d = c.decide(obs(after(c), in_flight=seats, chat_itl_p99_s=0.047))  # 0.94 × SLO
    assert d.reason == "itl-violation" and d.batch_seats < seats


def test_an_itl_cut_shortens_a_long_chunk_no_further_than_one_engine_step():
    cfg = STEPPED.model_copy(update={"min_chunk_tokens": 64})
    c = SLOController(SLO_50, MODEL, cfg)
    c.decide(obs(0.0, in_flight=1, chat_itl_p99_s=0.02))
    chunk = c.states["r0"].chunk_cap
    assert chunk > 2 * ENGINE_STEP
    c.decide(obs(5.0, in_flight=1, chat_itl_p99_s=0.08))
    assert ENGINE_STEP <= c.states["r0"].chunk_cap < chunk  # its last steps sat deeper
    for t in (10.0, 15.0, 20.0):
        c.decide(obs(t, in_flight=1, chat_itl_p99_s=0.08))
    assert c.states["r0"].chunk_cap == ENGINE_STEP  # one step: shorter sections relieve no step
    c.decide(obs(25.0, in_flight=1, chat_itl_p99_s=0.08))
    assert c.states["r0"].chunk_cap == ENGINE_STEP // 2  # a chunk inside one step sets its size


def test_slack_bands_must_sit_below_the_cut():
    with pytest.raises(ValidationError, match="cut_fraction"):
        ControllerConfig(ttft_slack_fraction=0.95)


def test_slack_grows_seats_again_after_a_cut_to_zero():
    # With nothing in flight there is no batch sequence to prove the caps safe, but at zero seats
    # nothing can be in flight: slack is then the only evidence there is, and it must be enough.
    c = SLOController(SLO_50, MODEL, ControllerConfig(min_seats=0, cold_start_seats=2))
    for k in range(4):
        c.decide(obs(k * INTERVAL, in_flight=c.states["r0"].seats if k else 2, chat_itl_p99_s=0.2))
    assert c.states["r0"].seats == 0
    chunk = c.states["r0"].chunk_cap
    ds = drive(c, after(c), 8, chat_itl_p99_s=0.01, chat_ttft_p99_s=0.1)
    first = next(i for i, d in enumerate(ds) if d.batch_seats > 0)
    assert ds[first].reason == "grow" and ds[first].batch_seats == 1
    assert ds[first].chunk_tokens == chunk  # a chunk nobody sent is not grown


def test_batch_yields_while_chat_waits_for_its_first_token():
    c = grown()
    c.decide(obs(after(c), in_flight=2, chat_itl_p99_s=0.02, chat_ttft_p99_s=0.8))  # near the SLO
    seats = c.states["r0"].seats
    # 10 chat decoding, 3 chat requests not yet at their first token, 2 batch decoding
    busy = obs(after(c), in_flight=2, chat_itl_p99_s=0.02, chat_decoding=10, running=14, waiting=1)
    assert feed_forward.chat_queued(busy) == 3
    d = c.decide(busy)
    assert d.pause and d.reason == "chat-queue" and d.batch_seats <= 2
    assert c.states["r0"].seats == seats  # a queue is no verdict on the caps
    quiet = obs(after(c), in_flight=2, chat_itl_p99_s=0.02, chat_decoding=10, running=12)
    assert not c.decide(quiet).pause


def test_batch_yields_to_queued_chat_only_where_chat_ttft_came_near_its_slo():
    c = SLOController(SLO_50, MODEL, ControllerConfig(ttft_memory_s=30.0))
    queued = {"chat_decoding": 10, "running": 14, "waiting": 1}  # 3 chat before a first token
    assert c.decide(obs(0.0, in_flight=2, chat_itl_p99_s=0.02, **queued)).reason == "chat-queue"
    drive(c, after(c), 8, chat_itl_p99_s=0.02, chat_ttft_p99_s=0.2)  # 40 s of slack chat
    relaxed = c.decide(obs(after(c), in_flight=2, chat_itl_p99_s=0.02, **queued))
    assert not relaxed.pause  # one TTFT allowance behind a queued chat still fits its SLO
    c.decide(obs(after(c), in_flight=2, chat_itl_p99_s=0.02, chat_ttft_p99_s=0.8))  # past slack
    later = c.decide(obs(after(c), in_flight=2, chat_itl_p99_s=0.02, **queued))
    assert later.pause and later.reason == "chat-queue"


# -- growth while the engine's step budget bounds every step --------------------------------------

BOUNDED = ControllerConfig(engine_step_tokens=ENGINE_STEP)
HOLD_BAND = {
    "chat_itl_p99_s": 0.040,
    "chat_ttft_p99_s": 0.2,
}  # ITL 0.8 × SLO: neither slack nor cut


def test_seats_grow_from_the_hold_band_while_a_full_engine_step_fits_the_budget():
    # MODEL prices a 256-token step beside the batch decodes at ~11 ms: the 40 ms budget holds it,
    # so more seats make more such steps and none longer
    c = grown(steps=4, **BOUNDED.model_dump(exclude_defaults=True))
    seats, chunk = c.states["r0"].seats, c.states["r0"].chunk_cap
    ds = drive(c, after(c), 6, **HOLD_BAND)
    assert "grow-step-bound" in {d.reason for d in ds}
    assert c.states["r0"].seats > seats
    assert c.states["r0"].chunk_cap == chunk  # the chunk grows from slack only


def test_the_hold_band_holds_where_the_engine_step_is_unknown_or_too_long():
    unknown = grown()  # no engine_step_tokens: a prompt is one step, nothing bounds it
    seats = unknown.states["r0"].seats
    assert {d.reason for d in drive(unknown, after(unknown), 6, **HOLD_BAND)} == {"hold"}
    assert unknown.states["r0"].seats == seats
    # at a 20 ms SLO the budget is 16 ms: a chunk of ~700 tokens fits it, a 1024-token step does not
    slo_20 = SLO(chat_itl_p99_ms=20, chat_ttft_p99_ms=1000)
    tight = SLOController(slo_20, MODEL, ControllerConfig(engine_step_tokens=1024))
    drive(tight, 0.0, 8, chat_itl_p99_s=0.005, chat_ttft_p99_s=0.2)
    seats = tight.states["r0"].seats
    assert {d.reason for d in drive(tight, after(tight), 6, chat_itl_p99_s=0.016)} == {"hold"}
    assert tight.states["r0"].seats == seats


def test_a_full_step_is_priced_at_the_deepest_position_a_prompt_reaches():
    load = feed_forward.Load(
        decode_seqs=4, decode_context_tokens=4000, prefix_tokens=0, batch_in_flight=0,
        prefill_pending=0,
    )  # fmt: skip
    deep = replace(load, prefix_tokens=7 * ENGINE_STEP)  # a prefill in flight already that deep
    shallow_s = feed_forward.step_seconds(MODEL, load, ENGINE_STEP, ENGINE_STEP)
    deep_s = feed_forward.step_seconds(MODEL, deep, ENGINE_STEP, ENGINE_STEP)
    budget = (shallow_s + deep_s) / 2  # the first step of any prompt fits; its eighth does not
    assert feed_forward.full_step_fits(MODEL, load, budget, ENGINE_STEP, prompt_tokens=ENGINE_STEP)
    assert not feed_forward.full_step_fits(
        MODEL, load, budget, ENGINE_STEP, prompt_tokens=8 * ENGINE_STEP
    )
    assert not feed_forward.full_step_fits(MODEL, deep, budget, ENGINE_STEP)


def test_the_hold_band_holds_while_chat_ttft_is_not_slack():
    c = grown(**BOUNDED.model_dump(exclude_defaults=True))
    seats = c.states["r0"].seats
    ds = drive(c, after(c), 6, chat_itl_p99_s=0.040, chat_ttft_p99_s=0.8)  # 0.8 × TTFT SLO
    assert "grow-step-bound" not in {d.reason for d in ds}
    assert c.states["r0"].seats == seats


def test_the_hold_band_holds_for_the_ttft_memory_after_a_near_miss():
    c = grown(steps=4, engine_step_tokens=ENGINE_STEP, ttft_memory_s=30.0)
    near_miss = after(c)
    c.decide(obs(near_miss, chat_itl_p99_s=0.040, chat_ttft_p99_s=0.8))
    seats = c.states["r0"].seats
    ds = drive(c, after(c), 12, **HOLD_BAND)  # slack TTFT again, for 60 s
    t = [near_miss + (i + 1) * INTERVAL for i in range(len(ds))]
    soon = [d.reason for d, ti in zip(ds, t, strict=True) if ti - near_miss <= 30.0]
    later = [d.reason for d, ti in zip(ds, t, strict=True) if ti - near_miss > 30.0]
    assert "grow-step-bound" not in soon and "grow-step-bound" in later
    assert c.states["r0"].seats > seats


def test_step_bound_seats_grow_by_a_share_of_themselves():
    c = SLOController(SLO_50, MODEL, BOUNDED.model_copy(update={"cold_start_seats": 8}))
    ds = drive(c, 0.0, 4, chat_itl_p99_s=0.010, chat_ttft_p99_s=0.2)
    grow = next(d for d in ds if d.reason.startswith("grow"))
    assert grow.reason == "grow-step-bound" and c.states["r0"].seats == 12
    off = SLOController(SLO_50, MODEL, BOUNDED.model_copy(update={"cold_start_seats": 8,
                                                                  "bound_seat_growth": 0.0}))  # fmt: skip
    drive(off, 0.0, 4, chat_itl_p99_s=0.010, chat_ttft_p99_s=0.2)
    assert off.states["r0"].seats == 9  # additive, as without a step bound


def test_a_violation_after_step_bound_growth_still_cuts():
    c = grown(**BOUNDED.model_dump(exclude_defaults=True))
    drive(c, after(c), 8, **HOLD_BAND)
    seats = c.states["r0"].seats
    d = c.decide(obs(after(c), in_flight=seats, chat_itl_p99_s=0.047))
    assert d.reason == "itl-violation" and c.states["r0"].seats < seats


def test_batch_leaves_a_share_of_the_engine_sequence_slots_to_chat():
    assert batch_seat_limit({"max-num-seqs": 32}, 0.25) == 24
    assert batch_seat_limit({"max-num-seqs": 2}, 0.25) == 1  # one slot kept for chat at least
    assert batch_seat_limit({}, 0.25) is None
    flags = {"max-num-seqs": 32, "max-num-batched-tokens": 512}
    derived = controller_config(None, flags)
    assert derived.max_seats == 24 and derived.engine_step_tokens == 512
    few = controller_config(ControllerConfig(cold_start_seats=4), {"max-num-seqs": 4})
    assert few.max_seats == 3 and few.cold_start_seats == 3
    chosen = controller_config(ControllerConfig(max_seats=40), flags)
    assert chosen.max_seats == 40  # set on purpose: the caller's word stands
