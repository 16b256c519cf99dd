"""The fidelity check's own logic: replaying a real run's chat in the simulator, and comparing."""

import numpy as np
import pytest

from bench.chat_load import ChatLoadSpec
from bench.chat_sessions import ChatShape
from bench.fidelity import (
    batch_tokens_per_s,
    bucketed_p99_ms,
    compare,
    figures_sim,
    replay_trace,
    simulate_replay,
)
from bench.fidelity_real import MixedWorkload, RealRun
from scheduler.records import RequestRecord

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
    assert compare(real, {"itl": 110.0, "ttft": 850.0, "tps": 59.0})["within_target"]
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
    workload = MixedWorkload(
        chat=ChatLoadSpec(shape=ChatShape().scaled(0.1)),
        duration_s=20,
        seats=1,
        doc_tokens=2000,
        output_tokens=16,
    )
    result = simulate_replay(workload, run, SMALL, FIT)
    chat_done = [r for r in result.sim.recorder.records if r.cls == "chat" and r.status == "ok"]
    assert len(chat_done) == 10
    assert sorted(r.prompt_tokens for r in chat_done) == [300 + 10 * i for i in range(10)]
    figures = figures_sim(result, (0.01, 0.1, 1.0, float("inf")), 20.0)
    assert figures["batch_tokens_per_s"] > 0 and figures["chat_ttft_p99_ms"] > 0
