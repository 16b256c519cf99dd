"""Whole simulated runs: events, controller hookup, records and drain (simulator/run.py & co)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from scheduler.admission import Decision, Observation, StaticCaps
from scheduler.run_schemas import RUN_TABLES
from scheduler.step import StepBatch
from simulator.config import SimConfig
from simulator.run import simulate
from simulator.trace import TraceRow
from warehouse.run_files import conform

SUMMARY_KEYS = {"chat", "batch", "preemptions", "kv_peak", "sim_seconds", "wall_seconds"}


class LinearSteps:
    """A step costs 10 ms plus 20 µs per scheduled token plus 10 ns per decode-context token."""

    def step_seconds(self, batch: StepBatch) -> float:
        return 0.010 + 2e-5 * batch.total_tokens + 1e-8 * batch.decode_context_tokens


@dataclass
class Recording:
    """A policy that grants fixed caps and keeps every observation it was shown."""

    decision: Decision
    seen: list[Observation] = field(default_factory=list)

    def decide(self, observation: Observation) -> Decision:
        self.seen.append(observation)
        return self.decision


def config(**settings) -> SimConfig:
    base = {
        "duration_s": 120.0,
        "engine": {"kv_capacity_tokens": 200_000, "max_num_batched_tokens": 512},
        "chat": {"rate": 2.0, "system_prompt_tokens": 1000, "context_tokens": 300},
        "batch": {"docs": 3, "doc_tokens": 4000, "summary_tokens": 64},
    }
    for key, value in settings.items():
        if isinstance(value, dict):
            base[key] = {**base.get(key, {}), **value}
        else:
            base[key] = value
    return SimConfig.model_validate(base)


def static(seats: int, chunk: int):
    caps = StaticCaps(seats, chunk)
    return lambda _name: caps


def test_the_summary_has_the_shape_the_benchmark_reads():
    s = simulate(config(), LinearSteps(), static(2, 1024)).summary
    assert set(s) == SUMMARY_KEYS
    assert set(s["chat"]) == {
        "ttft_ms",
        "itl_ms",
        "e2e_ms",
        "slo_windows_met",
        "requests",
        "errors",
    }
    assert set(s["chat"]["itl_ms"]) == {"p50", "p95", "p99"}
    assert set(s["batch"]) == {"tokens_per_s", "docs_done", "slo_batch_tokens_per_s"}
    assert s["chat"]["requests"] > 100 and s["batch"]["docs_done"] == 3
    assert s["chat"]["ttft_ms"]["p50"] <= s["chat"]["ttft_ms"]["p99"]
    assert 0 < s["kv_peak"] <= 1 and s["sim_seconds"] == 120.0


def test_a_seed_fixes_the_run_and_another_seed_changes_it():
    a = simulate(config(seed=3), LinearSteps()).summary
    b = simulate(config(seed=3), LinearSteps()).summary
    c = simulate(config(seed=4), LinearSteps()).summary
    for s in (a, b, c):
        s.pop("wall_seconds")
    assert a == b
    assert a != c


def test_at_one_seed_every_policy_serves_the_same_chat_users():
    """Batch slows chat's answers, which moves follow-up turns later, but the users, their turns
    and their lengths stay those of the seed: chat alone is a baseline for the same load."""

    def chats(policy) -> dict:
        result = simulate(config(seed=5, batch={"docs": 60}), LinearSteps(), policy)
        return {r.request_id: r for r in result.sim.recorder.records if r.cls == "chat"}

    alone, busy = chats(static(0, 1)), chats(static(4, 4000))
    common = alone.keys() & busy.keys()
    assert len(common) >= 0.95 * max(len(alone), len(busy))
    for rid in common:
        a, b = alone[rid], busy[rid]
        assert (a.prompt_tokens, a.output_tokens) == (b.prompt_tokens, b.output_tokens)
        if rid.endswith("-1"):  # a session's first turn waits on nothing a policy changes
            assert a.t_submit == b.t_submit
    assert any(busy[rid].ttft_s > 1.5 * alone[rid].ttft_s for rid in common), (
        "batch at 4 seats should slow some chat, or this compares nothing"
    )


def test_token_gaps_are_one_fewer_than_the_tokens_of_each_request():
    result = simulate(config(), LinearSteps(), static(2, 1024))
    rec = result.sim.recorder
    for r, gaps in zip(rec.records, rec.gaps, strict=True):
        if r.status == "ok":
            assert len(gaps) == r.output_tokens - 1
            assert r.e2e_s == pytest.approx(r.t_end - r.t_submit)
    chat_itl, _ = rec.class_gaps("chat")
    p99 = result.summary["chat"]["itl_ms"]["p99"]
    assert p99 == pytest.approx(1000 * np.percentile(chat_itl, 99))


def test_chat_in_flight_drains_and_batch_in_flight_is_cancelled_at_the_end():
    result = simulate(config(batch={"docs": 100, "doc_tokens": 60_000}), LinearSteps())
    by_status: dict[tuple[str, str], int] = {}
    for r in result.sim.recorder.records:
        by_status[r.cls, r.status] = by_status.get((r.cls, r.status), 0) + 1
    assert ("chat", "cancelled") not in by_status and by_status["chat", "ok"] > 0
    assert by_status["batch", "cancelled"] >= 1
    rows = result.sim.dispatcher.document_rows("sim")
    assert {row["status"] for row in rows} <= {"done", "skipped"}


def test_the_api_server_s_overhead_is_part_of_every_ttft_and_no_request_is_lost_in_it():
    def ttfts(overhead: float, **settings) -> tuple[np.ndarray, list]:
        cfg = config(engine={"request_overhead_s": overhead}, **settings)
        records = simulate(cfg, LinearSteps()).sim.recorder.records
        chat = [r.ttft_s for r in records if r.cls == "chat" and r.ttft_s is not None]
        return np.array(chat), records

    direct, _ = ttfts(0.0, batch={"docs": 0})
    delayed, _ = ttfts(0.05, batch={"docs": 0})
    assert np.median(delayed) == pytest.approx(np.median(direct) + 0.05, abs=0.01)
    # Sent, never past the API server before the run ended: cancelled, not dropped.
    _, records = ttfts(500.0, duration_s=10.0, drain_s=0.0)
    assert records and {r.status for r in records} == {"cancelled"}
    assert all(r.replica for r in records)


def test_tables_fit_the_warehouse_schemas():
    result = simulate(config(), LinearSteps(), static(2, 1024))
    tables = result.tables()
    assert set(tables) <= set(RUN_TABLES)
    for name, table in tables.items():
        assert set(table.column_names) == set(RUN_TABLES[name].names)
        assert conform(name, table, run_id="sim").num_rows == table.num_rows
    gaps = tables["token_gaps"].to_pydict()
    n_gaps = sum(len(g) for g in result.sim.recorder.gaps)
    assert len(gaps["gap_s"]) == n_gaps
    first = result.sim.recorder.records[0]
    own = [i for i, rid in enumerate(gaps["request_id"]) if rid == first.request_id]
    assert [gaps["idx"][i] for i in own] == list(range(len(own)))


def test_the_policy_observes_every_interval_and_its_caps_hold():
    policy = Recording(Decision(batch_seats=2, chunk_tokens=700))
    cfg = config(control={"interval_s": 5.0}, batch={"docs": 4, "doc_tokens": 3000})
    result = simulate(cfg, LinearSteps(), lambda _name: policy)
    times = [o.t for o in policy.seen]
    assert times == [5.0 * i for i in range(len(times))] and times[-1] == 120.0
    assert all(len(o.batch_in_flight) <= 2 for o in policy.seen)
    assert all(0 <= o.kv_usage <= 1 for o in policy.seen)
    busy = [o for o in policy.seen if o.chat_itl_p99_s is not None]
    assert busy and all(o.chat_decoding <= o.running for o in busy)
    batch = [r for r in result.sim.recorder.records if r.cls == "batch"]
    assert batch and all(r.prompt_tokens <= 700 + cfg.batch.instruction_tokens for r in batch)
    assert len(result.sim.recorder.decisions) == len(times)


def test_a_paused_policy_keeps_batch_out():
    pause = Recording(Decision(batch_seats=4, chunk_tokens=512, pause=True))
    result = simulate(config(), LinearSteps(), lambda _name: pause)
    assert not [r for r in result.sim.recorder.records if r.cls == "batch"]
    assert result.summary["batch"]["tokens_per_s"] == 0


def test_observed_itl_p99_is_that_of_the_chat_gaps_in_the_window():
    policy = Recording(Decision(batch_seats=0, chunk_tokens=512))
    cfg = config(control={"interval_s": 10.0}, batch={"docs": 0})
    result = simulate(cfg, LinearSteps(), lambda _name: policy)
    rec = result.sim.recorder
    gaps, at = rec.class_gaps("chat")
    for obs in policy.seen[3:6]:
        window = gaps[(at > obs.t - 10.0) & (at <= obs.t)]
        assert obs.chat_itl_p99_s == pytest.approx(np.percentile(window, 99))


def test_requests_the_engine_cannot_hold_are_errors_and_fail_their_window():
    cfg = config(engine={"max_model_len": 1500}, batch={"docs": 0})
    s = simulate(cfg, LinearSteps()).summary
    assert s["chat"]["errors"] > 0
    assert s["chat"]["slo_windows_met"] < 1.0


def test_sessions_spread_over_replicas_and_stick_to_one():
    result = simulate(config(replicas=2, batch={"docs": 0}), LinearSteps())
    replica_of: dict[str, set[str]] = {}
    for r in result.sim.recorder.records:
        session = r.request_id.rsplit("-", 1)[0]
        replica_of.setdefault(session, set()).add(r.replica)
    assert all(len(names) == 1 for names in replica_of.values())
    assert len(set().union(*replica_of.values())) == 2


def test_trace_replay_submits_each_row_at_its_time():
    rows = [TraceRow(t_s=float(i), context_tokens=500 + i, generated_tokens=20) for i in range(30)]
    cfg = config(chat={"rate": 0.0}, batch={"docs": 0}, duration_s=60.0)
    result = simulate(cfg, LinearSteps(), trace=rows)
    records = {r.request_id: r for r in result.sim.recorder.records}
    assert len(records) == 30
    assert records["trace-7"].t_submit == 7.0 and records["trace-7"].prompt_tokens == 507
    assert records["trace-7"].output_tokens == 20


def test_prefix_caching_hits_the_shared_system_prompt():
    result = simulate(config(batch={"docs": 0}), LinearSteps())
    later = [r for r in result.sim.recorder.records if r.request_id.endswith("-2")]
    assert later and all(r.cached_tokens >= 1000 // 16 * 16 for r in later)
