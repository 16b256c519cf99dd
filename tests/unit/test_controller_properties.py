"""Properties of the SLO controller over arbitrary observation sequences (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler import feed_forward
from scheduler.admission import BatchInFlight, Observation
from scheduler.controller import ControllerConfig, SLOController
from scheduler.latency_model import LatencyModel
from scheduler.slo import SLO

SLO_50 = SLO(chat_itl_p99_ms=50, chat_ttft_p99_ms=1000)
MODEL = LatencyModel(
    s_per_token=2e-5,
    s_weight_read=0.01,
    s_per_attention_unit=2e-10,
    s_per_context_token=2e-8,
    overhead_s=0.001,
)
CFG = ControllerConfig()
REASONS = {
    "cold-start",
    "grow",
    "grow-step-bound",
    "hold",
    "itl-violation",
    "ttft-violation",
    "kv-guard",
    "preemption",
    "stale-pause",
    "over-budget",
    "ttft-guard",
    "chat-queue",
}

signals = st.fixed_dictionaries(
    {
        "fresh": st.sampled_from([True, True, True, True, False]),
        "chat_itl_p99_s": st.none() | st.floats(0.001, 0.3),
        "chat_ttft_p99_s": st.none() | st.floats(0.01, 5.0),
        "kv_usage": st.none() | st.floats(0.0, 1.0),
        "kv_capacity_tokens": st.none() | st.integers(50_000, 1_000_000),
        "preemptions": st.sampled_from([0, 0, 0, 0, 1, 3]),
        "chat_decoding": st.integers(0, 120),
        "chat_queued": st.sampled_from([0, 0, 0, 1, 4]),
        "context_per_chat": st.integers(0, 8000),
        "in_flight": st.integers(0, 24),
        "prompt": st.integers(64, 20_000),
        "prefilled_fraction": st.floats(0.0, 1.0),
    }
)
fresh_signals = signals.map(lambda s: {**s, "fresh": True})


def make_obs(t: float, s: dict, replica: str = "r0") -> Observation:
    prefilled = int(s["prompt"] * s["prefilled_fraction"])
    batch_running = s["in_flight"] // 2
    return Observation(
        t=t,
        replica=replica,
        fresh=s["fresh"],
        chat_itl_p99_s=s["chat_itl_p99_s"],
        chat_ttft_p99_s=s["chat_ttft_p99_s"],
        kv_usage=s["kv_usage"],
        kv_capacity_tokens=s["kv_capacity_tokens"],
        preemptions=s["preemptions"],
        chat_decoding=s["chat_decoding"],
        chat_decode_context_tokens=s["chat_decoding"] * s["context_per_chat"],
        batch_in_flight=tuple(BatchInFlight(s["prompt"], prefilled) for _ in range(s["in_flight"])),
        # the engine's counts: chat decoding or queued, batch in flight split between the two
        running=s["chat_decoding"] + batch_running,
        waiting=s["chat_queued"] + s["in_flight"] - batch_running,
    )


def run(c: SLOController, seq: list[tuple[float, dict]]) -> list:
    t, out = 0.0, []
    for dt, s in seq:
        t += dt
        out.append((make_obs(t, s), c.decide(make_obs(t, s))))
    return out


def reversals(values: list[int]) -> int:
    """How often a sequence changes direction (up then down, or down then up)."""
    steps = [b - a for a, b in zip(values, values[1:], strict=False) if b != a]
    return sum(1 for a, b in zip(steps, steps[1:], strict=False) if (a > 0) != (b > 0))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.floats(0.5, 30.0), signals), min_size=1, max_size=40))
def test_every_decision_is_bounded_explained_and_within_budget(seq):
    c = SLOController(SLO_50, MODEL, CFG)
    for o, d in run(c, seq):
        assert d.reason in REASONS
        assert 0 <= d.batch_seats <= CFG.max_seats
        assert CFG.min_chunk_tokens <= d.chunk_tokens <= CFG.max_chunk_tokens
        assert d.chunk_tokens % CFG.chunk_granularity == 0
        if not o.fresh:
            assert d.pause and d.reason == "stale-pause"
        if not d.pause:  # feed-forward: the predicted step fits SLO × headroom
            assert d.predicted_step_ms <= SLO_50.chat_itl_p99_ms * CFG.headroom + 1e-6


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.5, 10.0), fresh_signals), min_size=1, max_size=30),
    st.floats(0.051, 1.0),
)
def test_an_itl_violation_cuts_caps_at_the_next_decision(prefix, itl):
    c = SLOController(SLO_50, MODEL, CFG)
    run(c, prefix)
    state = c.states["r0"]
    seats, chunk = state.seats, min(state.chunk_cap, state.last_chunk)
    violation = Observation(t=state.last_fresh_t + 5.0, replica="r0", chat_itl_p99_s=itl)
    d = c.decide(violation)
    assert d.reason == "itl-violation"
    assert state.seats < seats or seats == CFG.min_seats
    assert state.chunk_cap < chunk or chunk <= CFG.min_chunk_tokens
    assert d.batch_seats <= max(seats, CFG.min_seats)


@settings(max_examples=150, deadline=None)
@given(fresh_signals, st.integers(10, 60))
def test_a_steady_signal_never_makes_caps_oscillate(signal, steps):
    c = SLOController(SLO_50, MODEL, CFG)
    ds = [d for _, d in run(c, [(5.0, signal)] * steps)]
    assert reversals([d.batch_seats for d in ds]) == 0
    assert reversals([d.chunk_tokens for d in ds]) == 0
    assert reversals([int(d.pause) for d in ds]) <= 1  # cold start may differ from what follows


@settings(max_examples=150, deadline=None)
@given(
    st.floats(0.0, 1.0),
    st.integers(50_000, 1_000_000),
    st.integers(0, 16),
    st.integers(64, 30_000),
    st.floats(0.0, 1.0),
)
def test_kv_guard_never_admits_past_the_high_water_mark(kv, capacity, n, prompt, done):
    c = SLOController(SLO_50, MODEL, CFG.model_copy(update={"cold_start_seats": 32}))
    in_flight = tuple(BatchInFlight(prompt, int(prompt * done)) for _ in range(n))
    o = Observation(
        t=0.0,
        replica="r0",
        chat_itl_p99_s=0.01,
        kv_usage=kv,
        kv_capacity_tokens=capacity,
        batch_in_flight=in_flight,
    )
    d = c.decide(o)
    committed = kv + sum(b.prefill_remaining for b in in_flight) / capacity
    if committed >= CFG.kv_high_water:
        assert d.pause
    new_seats = 0 if d.pause else max(0, d.batch_seats - n)
    seat_tokens = (prompt if n else CFG.cold_start_chunk_tokens) + CFG.expected_output_tokens
    assert (
        committed + new_seats * seat_tokens / capacity <= CFG.kv_high_water + 1e-9 or new_seats == 0
    )


def test_closed_loop_settles_instead_of_oscillating():
    """A replica whose ITL rises with batch chunk and seats: the loop climbs into the hold band and
    stays there, with chat inside its SLO once it has settled."""
    c = SLOController(SLO_50, MODEL, CFG)
    seats, chunk, history = 0, 0, []
    for k in range(150):
        itl = 0.012 + chunk * 1e-5 + seats * 0.0015
        d = c.decide(
            Observation(
                t=k * 5.0,
                replica="r0",
                chat_itl_p99_s=itl,
                batch_in_flight=tuple(BatchInFlight(chunk or 512, 0) for _ in range(seats)),
            )
        )
        seats, chunk = d.batch_seats, d.chunk_tokens
        history.append((seats, chunk, itl))
    tail = history[-60:]
    assert len({(s, ch) for s, ch, _ in tail}) == 1
    assert all(itl <= 0.050 for _, _, itl in tail)
    assert tail[-1][0] > CFG.cold_start_seats  # it did use the room there was


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.floats(0.5, 10.0), fresh_signals), min_size=1, max_size=30))
def test_new_batch_prompts_never_queue_chat_past_the_ttft_allowance(seq):
    cfg = CFG.model_copy(update={"engine_step_tokens": 256})
    c = SLOController(SLO_50, MODEL, cfg)
    for o, d in run(c, seq):
        assert d.reason in REASONS
        if d.pause:
            continue
        load = feed_forward.load_of(o)
        wait_s = SLO_50.chat_ttft_p99_ms / 1000 * cfg.ttft_block_fraction
        allowance = feed_forward.prefill_allowance(MODEL, load, wait_s, 256)
        # the admitter holds prefill in flight to it, or (chat near its TTFT SLO) seats do
        assert d.prefill_budget_tokens in (allowance, None)
        if d.prefill_budget_tokens is None:
            new = max(0, d.batch_seats - len(o.batch_in_flight))
            assert load.prefill_pending + new * d.chunk_tokens <= allowance
        assert d.chunk_tokens <= max(cfg.chunk_granularity, allowance)  # one chunk always fits


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0.5, 10.0), fresh_signals), min_size=1, max_size=30))
def test_where_chat_ttft_is_tight_seats_never_queue_chat_past_the_ttft_allowance(seq):
    cfg = CFG.model_copy(update={"engine_step_tokens": 256})
    c = SLOController(SLO_50, MODEL, cfg)
    tight = [(dt, {**s, "chat_ttft_p99_s": 0.8}) for dt, s in seq]  # past slack, short of a cut
    for o, d in run(c, tight):
        if d.pause:
            continue
        load = feed_forward.load_of(o)
        wait_s = SLO_50.chat_ttft_p99_ms / 1000 * cfg.ttft_block_fraction
        allowance = feed_forward.prefill_allowance(MODEL, load, wait_s, 256)
        new = max(0, d.batch_seats - len(o.batch_in_flight))
        assert load.prefill_pending + new * d.chunk_tokens <= allowance


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0.5, 10.0), fresh_signals), min_size=1, max_size=30))
def test_slack_reopens_batch_from_any_state_even_zero_seats(prefix):
    """Whatever came before (cuts to zero included), quiet chat with every seat filled brings
    batch seats back: a controller must not shut a replica for good."""
    c = SLOController(SLO_50, MODEL, CFG.model_copy(update={"min_seats": 0}))
    run(c, prefix)
    t, seats = c.states["r0"].last_fresh_t, c.states["r0"].seats
    for _ in range(12):
        t += 5.0
        d = c.decide(
            Observation(
                t=t,
                replica="r0",
                chat_itl_p99_s=0.01,
                chat_ttft_p99_s=0.1,
                batch_in_flight=tuple(BatchInFlight(512, 512) for _ in range(seats)),
            )
        )
        seats = d.batch_seats
    assert seats >= 1 and not d.pause


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0.5, 10.0), fresh_signals), min_size=1, max_size=20))
def test_no_new_batch_prompt_starts_while_chat_waits_for_a_first_token(seq):
    # a memory longer than any sequence, and no reading in the slack band to end the cold start's
    # caution: chat counts as near its TTFT SLO throughout
    c = SLOController(SLO_50, MODEL, CFG.model_copy(update={"ttft_memory_s": 1e9}))
    near = [(dt, {**s, "chat_ttft_p99_s": s["chat_ttft_p99_s"] and max(0.7, s["chat_ttft_p99_s"])})
            for dt, s in seq]  # fmt: skip
    for o, d in run(c, near):
        if feed_forward.chat_queued(o) > 0:
            assert d.pause  # a paused replica is sent nothing new, whatever its seats
