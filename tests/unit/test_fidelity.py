"""The fidelity check's own logic: replaying a real run's chat in the simulator, and comparing."""

import numpy as np
import pytest

from bench.chat_load import ChatLoadSpec
from bench.chat_sessions import ChatShape
from bench.fidelity import (
    SPREAD_POINTS,
    batch_tokens_per_s,
    bucketed_p99_ms,
    compare,
    figures_real,
    figures_sim,
    replay_trace,
    simulate_replay,
    step_spread,
)
from bench.fidelity_real import MixedWorkload, RealRun, model_error, request_overhead
from scheduler.records import RequestRecord
from serving.metrics import Histogram

SMALL = "engine_configs/cpu-small.yaml"
FIT = "engine_configs/fits/cpu-small.json"


def record(
    cls: str,
    t_submit: float,
    prompt: int,
    output: int,
    t_end: float | None = None,
    status: str = "ok",
) -> RequestRecord:
    r = RequestRecord(
        "run",
        f"{cls}{t_submit}",
        cls,
        "chat" if cls == "chat" else "map",
        "a",
        prompt_tokens=prompt,
        output_tokens=output,
        t_submit=t_submit,
    )
    r.t_end, r.status = t_end, status  # type: ignore[assignment]
    return r


def test_compare_flags_any_figure_beyond_the_target() -> None:
    real = {"itl": 100.0, "ttft": 1000.0, "tps": 50.0}
    assert compare(real, {"itl": 110.0, "ttft": 870.0, "tps": 57.0})["within_target"]
    assert not compare(real, {"itl": 110.0, "ttft": 840.0, "tps": 50.0})["within_target"]
    out = compare(real, {"itl": 110.0, "ttft": 700.0, "tps": 50.0})
    assert not out["within_target"] and out["relative_error"]["ttft"] == pytest.approx(-0.3)
    assert not compare(real, {"itl": None, "ttft": 1000.0, "tps": 50.0})["within_target"]


def test_bucketed_p99_reads_gaps_as_the_engine_exporter_would() -> None:
    gaps = np.array([0.005] * 99 + [0.08])
    bounds = (0.01, 0.05, 0.1, float("inf"))
    assert 0.0 < bucketed_p99_ms(gaps, bounds) <= 10.0  # the 99th of 100 is in the first bucket
    assert 50.0 < bucketed_p99_ms(np.array([0.08] * 10), bounds) <= 100.0


def test_batch_tokens_count_only_requests_that_ended_ok_inside_the_run() -> None:
    rows = [
        record("batch", 0, 1000, 10, t_end=5),
        record("batch", 0, 1000, 10, t_end=12),
        record("batch", 0, 999, 0, t_end=6, status="error"),
        record("chat", 0, 50, 5, 3),
    ]
    assert batch_tokens_per_s(rows, 0.0, 10.0) == pytest.approx(101.0)


def test_replay_runs_the_real_chat_arrivals_in_the_simulator() -> None:
    chat = [record("chat", 100.0 + i, 300 + 10 * i, 20, t_end=101.0 + i) for i in range(10)]
    run = RealRun(t0=100.0, t1=120.0, chat=chat, batch=[])
    rows = replay_trace(run)
    assert [r.t_s for r in rows] == [float(i) for i in range(10)]
    result = simulate_replay(_workload(seats=1, doc_tokens=2000), run, SMALL, FIT)
    chat_done = [r for r in result.sim.recorder.records if r.cls == "chat" and r.status == "ok"]
    assert len(chat_done) == 10
    assert sorted(r.prompt_tokens for r in chat_done) == [300 + 10 * i for i in range(10)]
    figures = figures_sim(result, (0.01, 0.1, 1.0, float("inf")), 20.0)
    assert figures["batch_tokens_per_s"] > 0 and figures["chat_ttft_p99_ms"] > 0


def _workload(seats: int, doc_tokens: int) -> MixedWorkload:
    """20 s of the bench's chat shape beside `seats` batch prompts of `doc_tokens` tokens."""
    chat = ChatLoadSpec(shape=ChatShape().scaled(0.1))
    return MixedWorkload(chat, duration_s=20, seats=seats, doc_tokens=doc_tokens, output_tokens=16)


def _replay(target_ms: float | None):
    chat = [record("chat", 100.0 + 0.5 * i, 300, 24, t_end=101.0 + i) for i in range(30)]
    run = RealRun(t0=100.0, t1=120.0, chat=chat, batch=[])
    return simulate_replay(_workload(seats=2, doc_tokens=1500), run, SMALL, FIT, target_ms)


def test_replay_at_a_batch_step_target_holds_chat_gaps_that_stock_lets_grow() -> None:
    bounds = tuple(b / 1000 for b in range(5, 500, 5)) + (float("inf"),)
    stock = figures_sim(_replay(None), bounds, 20.0, chat_only_itl=True)
    steered = figures_sim(_replay(15.0), bounds, 20.0, chat_only_itl=True)
    assert steered["chat_itl_p99_ms"] <= 20.0 < stock["chat_itl_p99_ms"]
    assert 0 < steered["batch_tokens_per_s"] < stock["batch_tokens_per_s"]


def test_real_itl_is_the_plug_ins_chat_gaps_when_the_run_kept_them() -> None:
    bounds = (0.01, 0.1, float("inf"))
    chat_gaps = Histogram(bounds, (99.0, 100.0, 100.0), 100.0, 0.6)
    run = RealRun(t0=0.0, t1=10.0, chat=[record("chat", 1.0, 50, 5, 2.0)], batch=[],
                  chat_itl=chat_gaps)  # fmt: skip
    figures, read_through = figures_real(run, 10.0)
    assert read_through == bounds and figures["chat_itl_p99_ms"] <= 10.0


def test_a_host_off_the_fit_is_replayed_at_its_speed_and_its_plug_in_corrects_as_the_real_one():
    """Faster than the fit: the plug-in sizes chunks to the fit as sent (its scale never goes
    below 1), so steps, and chat's gaps, come out shorter than the target and batch gains.
    Slower: the plug-in scales the fit up, so chat's gaps stay at the target and batch loses."""
    bounds = tuple(b / 1000 for b in range(1, 500)) + (float("inf"),)

    def figures(ratio: float) -> dict:
        chat = [record("chat", 100.0 + 0.5 * i, 300, 24, t_end=101.0 + i) for i in range(30)]
        run = RealRun(t0=100.0, t1=120.0, chat=chat, batch=[])
        workload = _workload(seats=2, doc_tokens=1500)
        result = simulate_replay(workload, run, SMALL, FIT, 15.0, step_time_ratio=ratio)
        return figures_sim(result, bounds, 20.0, chat_only_itl=True)

    fast, as_fit, slow = figures(0.6), figures(1.0), figures(2.0)
    assert fast["chat_itl_p99_ms"] < 0.7 * as_fit["chat_itl_p99_ms"]
    assert fast["batch_tokens_per_s"] > as_fit["batch_tokens_per_s"] > slow["batch_tokens_per_s"]
    assert slow["chat_itl_p99_ms"] <= 1.1 * as_fit["chat_itl_p99_ms"]


def test_the_fit_s_error_is_read_from_two_plug_in_status_documents() -> None:
    def status(measured: float, modelled: float) -> dict:
        return {"totals": {"measured_when_predicted_s": measured, "model_s": modelled}}

    assert model_error(status(13.0, 20.0), status(1.0, 0.0)) == pytest.approx(0.6)
    assert model_error(status(6.0, 3.0), None) == pytest.approx(2.0)  # since the engine started
    assert model_error(status(5.0, 4.0), status(5.0, 4.0)) is None  # no step priced between
    old_plugin = {"totals": {"measured_when_predicted_s": 3.0}}  # a status without `model_s`
    assert model_error(old_plugin, None) is None


SPREAD = tuple(np.linspace(0.8, 1.2, 99)) + (1.5, 1.6)
"""Step time over price: mean about 1, a tail to 1.6."""


def _spread_replay(target_ms: float | None, spread: tuple[float, ...]):
    chat = [record("chat", 100.0 + 0.5 * i, 300, 24, t_end=101.0 + i) for i in range(30)]
    run = RealRun(t0=100.0, t1=120.0, chat=chat, batch=[])
    workload = _workload(seats=2, doc_tokens=1500)
    return simulate_replay(workload, run, SMALL, FIT, target_ms, step_time_spread=spread)


def test_a_spread_of_step_times_puts_a_tail_on_chat_gaps_and_keeps_their_mean() -> None:
    bounds = tuple(b / 1000 for b in range(1, 500)) + (float("inf"),)
    exact, spread_out = _spread_replay(None, ()), _spread_replay(None, SPREAD)  # stock engine
    tail, flat = (figures_sim(r, bounds, 20.0, chat_only_itl=True) for r in (spread_out, exact))
    assert tail["chat_itl_p99_ms"] > 1.1 * flat["chat_itl_p99_ms"]
    gaps = [np.mean(r.sim.recorder.class_gaps("chat")[0]) for r in (spread_out, exact)]
    assert gaps[0] == pytest.approx(gaps[1], rel=0.1)


def test_the_simulated_plug_in_scales_its_model_by_the_tail_of_the_spread() -> None:
    exact, spread_out = _spread_replay(15.0, ()), _spread_replay(15.0, SPREAD)
    (flat,), (tail,) = ([r.engine.scale.value for r in x.sim.replicas] for x in (exact, spread_out))
    assert flat == pytest.approx(1.0)
    assert 1.4 <= tail <= 1.6  # the 99th percentile of the spread, as the real plug-in takes it


def test_the_spread_is_each_prefill_step_s_time_over_price_relative_to_their_mean() -> None:
    from scheduler.latency_fit import StepSample
    from scheduler.step import PrefillChunk, StepBatch

    class Flat:  # every step priced at 10 ms
        def step_seconds(self, batch) -> float:
            return 0.010

    chunk = StepBatch((PrefillChunk(256, 0),), 1, 300)
    decode_only = StepBatch((), 1, 300)
    times = [0.006] * 50 + [0.009] * 49 + [0.018]
    mean = sum(times) / (0.010 * len(times))  # time-weighted: decode-only steps left out
    steps = [StepSample(chunk, t) for t in times] + [StepSample(decode_only, 0.5)] * 10
    q = step_spread(steps, Flat())
    assert len(q) == SPREAD_POINTS and list(q) == sorted(q)
    assert q[0] == pytest.approx(0.6 / mean) and q[-1] == pytest.approx(1.8 / mean)
    assert step_spread(steps[:10], Flat()) == ()  # too few steps with a prefill chunk


def test_the_request_overhead_is_client_ttft_over_engine_ttft_on_average() -> None:
    chat = [record("chat", 1.0 + i, 50, 5, 3.0 + i) for i in range(4)]
    for r, ttft in zip(chat, (0.030, 0.040, 0.050, None), strict=True):
        r.ttft_s = ttft
    engine = Histogram((0.1, float("inf")), (3.0, 3.0), 3.0, 0.090)  # mean 30 ms
    assert request_overhead(chat, engine) == pytest.approx(0.010)
    assert request_overhead(chat, Histogram((0.1, float("inf")), (0.0, 0.0), 0.0, 0.0)) is None
    fast_client = Histogram((0.1, float("inf")), (3.0, 3.0), 3.0, 0.3)
    assert request_overhead(chat, fast_client) == 0.0
