"""The Gate as a real Ray actor, driven by a scripted sensor: seats, routing, pause, cuts, records."""

from __future__ import annotations

import dataclasses
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
import ray
import ray.cloudpickle

from pipelines.gate import BATCH_PRIORITY, GateActor, gate_name, start_gate
from pipelines.gate_setup import GateConfig, build_policy, build_sensor
from pipelines.request_journal import WORKER_DIED_IN_FLIGHT, read_events
from scheduler import control_document
from scheduler.admission import Decision, Observation
from scheduler.budget_controller import BudgetControllerConfig
from scheduler.latency_model import LatencyModel
from scheduler.slo import SLO
from serving.engine_control import ControlTarget
from serving.sensors import StreamedTimingsSensor

MODEL = LatencyModel(
    s_per_token=2e-5,
    s_weight_read=0.01,
    s_per_attention_unit=2e-10,
    s_per_context_token=2e-8,
    overhead_s=0.001,
)
QUIET = 600.0  # background polls never come during a test; poll_now drives the loop
PATIENT = BudgetControllerConfig(stale_after_s=2 * QUIET)  # so no replica goes stale between polls
REPLICAS = [("r0", "http://r0:8000"), ("r1", "http://r1:8000")]


class ScriptedSensor:
    """Returns the next step of a script at each poll (the last one repeats), stamped with the
    wall clock the Gate uses."""

    def __init__(self, script: list[dict[str, dict]]) -> None:
        self.script = script
        self.polls = 0

    async def observe(self) -> dict[str, Observation]:
        step = self.script[min(self.polls, len(self.script) - 1)]
        self.polls += 1
        t = time.time()
        return {name: Observation(t=t, replica=name, **kw) for name, kw in step.items()}


# the actor unpickles ScriptedSensor by value: this test module is not importable by Ray workers
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module", autouse=True)
def ray_local():
    if ray.is_initialized():  # a pipeline test earlier in the session left its local Ray up
        ray.shutdown()
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture
def gates():
    """Start Gates for a test and kill them afterwards."""
    started = []

    def start(run_id: str, script, replicas=REPLICAS, **kw):
        kw.setdefault("interval_s", QUIET)
        kw.setdefault("controller", PATIENT)
        gate = start_gate(run_id, replicas, sensor=ScriptedSensor(script), **kw)
        started.append(gate)
        return gate

    yield start
    for gate in started:
        ray.get(gate.close.remote())
        ray.kill(gate)


def ready(refs, n: int | None = None, timeout: float = 0.5) -> list:
    """Those of `refs` that finish within `timeout`; waits no longer once `n` have finished."""
    done, _ = ray.wait(refs, num_returns=n or len(refs), timeout=timeout)
    return done


def test_seats_are_respected_under_concurrency(gates):
    gate = gates(
        "seats",
        [{"r0": {"kv_usage": 0.1}}],
        replicas=REPLICAS[:1],
        policy="static",
        static_caps=(3, 1024),
    )
    refs = [gate.acquire.remote(f"doc-{i}", 1000, 200) for i in range(8)]
    first = ready(refs, n=3, timeout=10.0)
    waiting = [r for r in refs if r not in first]
    assert len(first) == 3 and not ready(waiting, n=1, timeout=0.3)
    granted = ray.get(first)
    assert {(p.replica, p.chunk_tokens, p.priority) for p in granted} == {
        ("r0", 1024, BATCH_PRIORITY)
    }
    while waiting:
        ray.get(gate.release.remote(granted.pop().permit_id))
        newly = ready(waiting, n=1, timeout=5.0)
        waiting = [r for r in waiting if r not in newly]
        assert len(newly) == 1 and not ready(waiting, n=1, timeout=0.2)  # one seat, one waiter
        granted += ray.get(newly)
        assert ray.get(gate.stats.remote())["in_flight"]["r0"] == 3
    stats = ray.get(gate.stats.remote())
    assert (stats["granted"], stats["released"], stats["waiting"]) == (8, 5, 0)


def test_routing_prefers_headroom_and_mark_down_reroutes(gates):
    script = [{"r0": {"kv_usage": 0.6}, "r1": {"kv_usage": 0.2}}]
    gate = gates("route", script, policy="static", static_caps=(2, 512), down_grace_s=0)
    first, second, third = (ray.get(gate.acquire.remote(f"d{i}", 100)) for i in range(3))
    assert first.replica == "r1"  # equal free seats: lower KV usage wins
    assert second.replica == "r0"  # r0 now has more free seats
    assert third.replica == "r1"
    assert first.base_url == "http://r1:8000"
    ray.get(gate.mark_down.remote("r1"))
    for p in (first, third):
        ray.get(gate.release.remote(p.permit_id))
    assert ray.get(gate.acquire.remote("d3", 100)).replica == "r0"
    blocked = gate.acquire.remote("d4", 100)  # r0 is full and r1 is down: wait, never r1
    assert not ready([blocked], timeout=0.5)
    ray.get(gate.release.remote(second.permit_id))
    assert ray.get(blocked).replica == "r0"
    caps = ray.get(gate.caps.remote())
    assert caps["r1"]["pause"] and caps["r1"]["reason"] == "down"
    ray.get(gate.mark_down.remote("r0"))
    with pytest.raises(ray.exceptions.RayTaskError, match="every replica has been marked down"):
        ray.get(gate.acquire.remote("d5", 100))


def test_pause_blocks_acquire_until_caps_reopen(gates):
    script = [{"r0": {"fresh": False}}, {"r0": {"chat_itl_p99_s": 0.01, "kv_usage": 0.2}}]
    gate = gates("pause", script, replicas=REPLICAS[:1], policy="slo", latency_model=MODEL)
    pending = gate.acquire.remote("doc", 400, 100)
    assert not ready([pending], timeout=0.5)
    assert ray.get(gate.caps.remote())["r0"]["pause"]
    ray.get(gate.poll_now.remote())
    permit = ray.get(pending, timeout=5.0)
    assert permit.replica == "r0"
    reasons = [row["reason"] for row in ray.get(gate.decision_rows.remote())]
    assert reasons == ["stale", "cold-start"]


def test_a_pause_stops_new_grants_but_never_revokes_permits(gates):
    script = [
        {"r0": {"chat_itl_p99_s": 0.01, "kv_usage": 0.2}},
        {"r0": {"fresh": False}},  # the sensor lost the replica
        {"r0": {"chat_itl_p99_s": 0.01, "kv_usage": 0.2}},
    ]
    gate = gates("pause-held", script, replicas=REPLICAS[:1], latency_model=MODEL)
    held = [ray.get(gate.acquire.remote(f"d{i}", 400), timeout=5.0) for i in range(3)]
    caps = ray.get(gate.poll_now.remote())
    assert caps["r0"]["pause"] and caps["r0"]["in_flight"] == 3  # nothing taken back
    pending = gate.acquire.remote("d3", 400)
    assert not ready([pending], timeout=0.5)
    ray.get(gate.release.remote(held[0].permit_id))
    assert not ready([pending], timeout=0.5), "a free seat does not lift a pause"
    ray.get(gate.poll_now.remote())
    assert ray.get(pending, timeout=5.0).replica == "r0"


def test_the_kv_room_is_checked_at_every_grant(gates):
    # 100k tokens of KV at 50% use under a 0.9 high-water mark: 40k tokens of room
    state = {"chat_itl_p99_s": 0.01, "kv_usage": 0.5, "kv_capacity_tokens": 100_000}
    gate = gates("kv", [{"r0": state}], replicas=REPLICAS[:1], latency_model=MODEL)
    first = ray.get(gate.acquire.remote("d0", 29_000, 1_000), timeout=5.0)
    second = gate.acquire.remote("d1", 19_000, 1_000)
    assert not ready([second], timeout=0.5), "prompt and output must fit, not the prompt alone"
    small = ray.get(gate.acquire.remote("d2", 9_000, 500), timeout=5.0)
    assert ray.get(gate.caps.remote())["r0"]["kv_room_tokens"] == 40_000
    ray.get(gate.release.remote(first.permit_id))
    ray.get(gate.release.remote(small.permit_id))
    ray.get(gate.poll_now.remote())  # the engine's KV is read again before it is counted free
    assert ray.get(second, timeout=5.0).replica == "r0"


def test_control_documents_reach_the_replicas_folder_and_pause_when_it_goes_stale(gates, tmp_path):
    script = [{"r0": {"chat_itl_p99_s": 0.01, "kv_usage": 0.2}}, {"r0": {"fresh": False}}]
    target = ControlTarget("r0", folder=tmp_path)
    gate = gates("control", script, replicas=REPLICAS[:1], latency_model=MODEL,
                 control_targets={"r0": target})  # fmt: skip
    ray.get(gate.caps.remote())
    first = control_document.parse((tmp_path / "control.json").read_text())
    assert first.batch_step_target_ms == pytest.approx(25.0) and not first.pause
    assert first.latency_model.coefficients() == MODEL.coefficients()
    assert first.expires_at - time.time() >= 10.0
    assert not first.tail_scale, "the controller corrects the model; the plug-in does not again"
    ray.get(gate.poll_now.remote())
    second = control_document.parse((tmp_path / "control.json").read_text())
    assert second.pause and second.seq > first.seq


def test_static_and_uncontrolled_runs_leave_the_engine_stock(gates, tmp_path):
    target = ControlTarget("r0", folder=tmp_path)
    gate = gates("stock", [{"r0": {"kv_usage": 0.2}}], replicas=REPLICAS[:1], policy="static",
                 control_targets={"r0": target})  # fmt: skip
    ray.get(gate.poll_now.remote())
    assert not (tmp_path / "control.json").exists()


def test_the_budget_policy_sends_its_fixed_target(gates, tmp_path):
    target = ControlTarget("r0", folder=tmp_path)
    gate = gates("fixed", [{"r0": {"kv_usage": 0.2}}], replicas=REPLICAS[:1], policy="budget",
                 budget=(2, 33.0), latency_model=MODEL, control_targets={"r0": target})  # fmt: skip
    caps = ray.get(gate.poll_now.remote())["r0"]
    assert caps["batch_seats"] == 2 and caps["batch_step_target_ms"] == 33.0
    sent = control_document.parse((tmp_path / "control.json").read_text())
    assert sent.batch_step_target_ms == 33.0 and sent.tail_scale, "a fixed target holds at its p99"


def test_released_and_reported_timings_reach_the_controller(gates):
    script = [{"r0": {"kv_usage": 0.2}}]  # the engine sensor sees no latency at all
    gate = gates("feed", script, replicas=REPLICAS[:1], latency_model=MODEL)
    permit = ray.get(gate.acquire.remote("doc", 400))
    now = time.time()
    row = {"replica": "r0", "class": "chat", "ttft_s": 0.1, "t_first_token": now}
    gaps = [{"t": now + i * 0.1, "gap_s": 0.1} for i in range(50)]  # chat at 100 ms per token
    ray.get(gate.report.remote(row, gaps))
    assert ray.get(gate.release.remote(permit.permit_id, {**row, "class": "batch"}))
    assert not ray.get(gate.release.remote(permit.permit_id))  # a second release is a no-op
    ray.get(gate.poll_now.remote())
    last = ray.get(gate.decision_rows.remote())[-1]
    assert last["reason"] == "cut"
    assert last["observed_itl_p99_s"] == pytest.approx(0.1)


def test_decisions_are_recorded_and_exported_on_the_metrics_port(gates):
    script = [{"r0": {"chat_itl_p99_s": 0.012, "kv_usage": 0.3}, "r1": {"fresh": False}}]
    gate = gates("metrics", script, latency_model=MODEL, metrics_port=0)
    ray.get(gate.poll_now.remote())
    rows = ray.get(gate.decision_rows.remote())
    assert len(rows) == 2 and {r["replica"] for r in rows} == {"r0", "r1"}
    assert set(rows[0]) == {
        "run_id", "t", "replica", "batch_seats", "chunk_tokens", "pause", "observed_itl_p99_s",
        "observed_ttft_p99_s", "observed_kv_usage", "predicted_step_ms", "reason",
        "prefill_budget_tokens", "batch_step_target_ms", "kv_room_tokens",
        "observed_target_bound_share",
        "observed_chat_cache_tokens", "slack_mark", "mean_step_target_ms",
    }  # fmt: skip
    r0 = [r for r in rows if r["replica"] == "r0"][-1]
    assert r0["observed_itl_p99_s"] == 0.012 and r0["observed_kv_usage"] == 0.3
    assert r0["predicted_step_ms"] > 0 and r0["run_id"] == "metrics"
    assert r0["slack_mark"] == pytest.approx(0.8)  # the configured one: no windows paired yet
    port = ray.get(gate.stats.remote())["metrics_port"]
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5.0).text
    assert 'nightshift_batch_seats{replica="r0"} 64.0' in text
    assert 'nightshift_batch_step_target_seconds{replica="r0"} 0.025' in text
    assert 'nightshift_kv_room_tokens{replica="r0"} NaN' in text  # no KV capacity: unbounded
    assert 'nightshift_batch_step_mean_seconds{replica="r0"} NaN' in text  # no E2E SLO
    assert 'nightshift_chat_cache_tokens{replica="r0"} NaN' in text  # no plug-in counting it
    mark = re.search(r'nightshift_slack_mark\{replica="r0"\} (\S+)', text)
    assert mark and float(mark.group(1)) == pytest.approx(0.8)
    assert 'nightshift_chat_itl_p99_seconds{replica="r0"} 0.012' in text
    assert 'nightshift_decisions_total{reason="stale"} 1.0' in text
    assert "nightshift_controller_last_decision_timestamp_seconds" in text


def test_one_gate_per_run_is_found_by_name(gates):
    gate = gates("named", [{"r0": {}}], replicas=REPLICAS[:1], policy="none")
    same = start_gate("named", REPLICAS[:1], policy="none")  # joins, does not create
    assert ray.get_actor(gate_name("named"))._actor_id == gate._actor_id == same._actor_id


class Recorder:
    """A policy that remembers what it was shown."""

    def __init__(self) -> None:
        self.seen: list[Observation] = []

    def decide(self, observation: Observation) -> Decision:
        self.seen.append(observation)
        return Decision(2, 512, reason="static")


async def test_the_policy_sees_the_batch_the_gate_admitted():
    """Outside Ray: the engine counts all running requests; the Gate knows which are its batch."""
    script = [{"r0": {"running": 10, "kv_usage": 0.5, "kv_capacity_tokens": 100_000}}]
    sensor = ScriptedSensor(script)
    gate = GateActor("plain", REPLICAS[:1], policy="static", sensor=sensor, interval_s=QUIET)
    policy = gate.policy = Recorder()
    a = await gate.acquire("d0", 4000, 100)
    await gate.acquire("d1", 2000, 100)
    await gate.progress(a.permit_id, 4000)  # its prompt is in KV: it decodes its summary now
    await gate.poll_now()
    o = policy.seen[-1]
    assert sorted((b.prompt_tokens, b.prefilled_tokens) for b in o.batch_in_flight) == [
        (2000, 0),
        (4000, 4000),
    ]
    assert o.chat_decoding == 9  # 10 running, one of them our decoding batch request
    assert o.chat_decode_context_tokens == 50_000 - 4000
    with pytest.raises(TimeoutError, match="no batch seat for d2"):
        await gate.acquire("d2", 100, timeout_s=0.2)
    assert (await gate.stats())["waiting"] == 0
    await gate.close()


def vllm_metrics(itl_fast: int, itl_slow: int, kv: float) -> str:
    """A vLLM /metrics excerpt: fast tokens under 25 ms, slow ones between 100 and 150 ms."""
    fast, total = itl_fast, itl_fast + itl_slow
    buckets = [("0.01", 0), ("0.025", fast), ("0.05", fast), ("0.1", fast), ("0.15", total)]
    lines = [
        "# TYPE vllm:inter_token_latency_seconds histogram",
        *(
            f'vllm:inter_token_latency_seconds_bucket{{engine="0",le="{le}",model_name="m"}} {n}'
            for le, n in [*buckets, ("+Inf", total)]
        ),
        f'vllm:inter_token_latency_seconds_count{{engine="0",model_name="m"}} {total}',
        f'vllm:inter_token_latency_seconds_sum{{engine="0",model_name="m"}} {0.02 * total}',
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {kv}',
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{engine="0",model_name="m"} 12.0',
        "# TYPE vllm:cache_config_info gauge",
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="6250"} 1.0',
    ]
    return "\n".join(lines) + "\n"


async def test_default_sensor_reads_vllm_metrics_into_decisions():
    """Outside Ray: the Gate's default sensor scrapes a replica's /metrics over HTTP."""
    current = {"text": vllm_metrics(100, 0, 0.2)}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(current["text"].encode())

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    gate = GateActor(
        "http", [("r0", url)], latency_model=MODEL, interval_s=QUIET, controller=PATIENT
    )
    try:
        await gate.poll_now()
        current["text"] = vllm_metrics(100 + 900, 100, 0.3)  # 10% of this window's tokens slow
        caps = await gate.poll_now()
        current["text"] = vllm_metrics(1000 + 1000, 100, 0.95)  # fast again, KV nearly full
        late = await gate.poll_now()
    finally:
        await gate.close()
        server.shutdown()
        server.server_close()
    rows = await gate.decision_rows()
    assert [r["reason"] for r in rows] == ["cold-start", "cut", "grow"]
    assert 0.1 < rows[1]["observed_itl_p99_s"] <= 0.15 and rows[1]["observed_kv_usage"] == 0.3
    assert caps["r0"]["batch_step_target_ms"] < rows[0]["batch_step_target_ms"]
    assert late["r0"]["kv_room_tokens"] == 0, "KV past the high-water mark: no room for batch"


def test_bad_gate_arguments_fail_in_the_caller():
    with pytest.raises(ValueError, match="latency_model"):
        start_gate("bad", REPLICAS, policy="slo")
    with pytest.raises(ValueError, match="none, static, budget, slo"):
        build_policy("fastest", SLO())
    with pytest.raises(ValueError, match="'vllm', 'prometheus' or 'streamed'"):
        build_sensor({"kind": "carrier-pigeon"}, dict(REPLICAS), StreamedTimingsSensor())
    with pytest.raises(ValueError, match="url"):
        build_sensor({"kind": "prometheus"}, dict(REPLICAS), StreamedTimingsSensor())
    with pytest.raises(ValueError, match="stale_after_s"):
        start_gate("bad", REPLICAS, latency_model=MODEL, interval_s=30.0)
    with pytest.raises(ValueError, match="sensor kind"):
        start_gate("bad", REPLICAS, policy="none", sensor={"kind": "smoke-signals"})


def test_the_gate_takes_its_settings_as_one_frozen_config():
    config = GateConfig(policy="static", static_caps=(3, 512), interval_s=QUIET)
    gate = GateActor("cfg", REPLICAS[:1], config)
    assert gate.config is config and gate.policy.batch_seats == 3 and gate.interval_s == QUIET
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.policy = "none"  # type: ignore[misc]
    with pytest.raises(ValueError, match="not both"):
        GateActor("cfg", REPLICAS[:1], config, policy="none")
    with pytest.raises(ValueError, match="stale_after_s"):
        GateConfig(latency_model=MODEL, interval_s=30.0).check()


def test_the_seats_of_a_worker_that_falls_silent_are_taken_back(gates, tmp_path):
    journal = tmp_path / "journal.jsonl"
    gate = gates("lease", [{"r0": {"kv_usage": 0.1}}], replicas=REPLICAS[:1], policy="static",
                 static_caps=(2, 1024), lease_s=1.0, journal=journal)  # fmt: skip
    dead = [ray.get(gate.acquire.remote(f"d{i}", 100, 0, None, "whole", "w-dead")) for i in (0, 1)]
    dead_waiting = gate.acquire.remote("d9", 100, 0, None, "whole", "w-dead")  # its caller died
    last_word = time.monotonic()
    waiting = gate.acquire.remote("d2", 100, 0, None, "whole", "w-alive")
    while not ready([waiting], timeout=0.1):  # polls well within half a lease apart
        assert ray.get(gate.heartbeat.remote("w-alive")) is False  # only the living renew
        ray.get(gate.poll_now.remote())
        assert time.monotonic() - last_word < 10.0, "the silent worker's seats were never freed"
    assert time.monotonic() - last_word >= 1.0  # not before its lease lapsed
    assert ray.get(waiting).replica == "r0"
    with pytest.raises(ray.exceptions.RayTaskError, match="lease of w-dead lapsed"):
        ray.get(dead_waiting, timeout=10.0)  # no seat for a dead worker's leftover call
    stats = ray.get(gate.stats.remote())
    assert (stats["expired"], stats["in_flight"]["r0"]) == (2, 1)
    assert not ray.get(gate.release.remote(dead[0].permit_id))  # a late release is a no-op
    ray.get(gate.close.remote())
    lapsed = [e for e in read_events(journal) if e.get("reason") == WORKER_DIED_IN_FLIGHT]
    assert sorted(e["permit_id"] for e in lapsed) == sorted(p.permit_id for p in dead)


def test_a_replica_marked_down_rejoins_once_the_sensor_reads_it_again(gates):
    script = [
        {"r0": {"kv_usage": 0.1}, "r1": {"kv_usage": 0.1}},
        {"r0": {"kv_usage": 0.1}, "r1": {"fresh": False}},  # r1 restarting: not answering
        {"r0": {"kv_usage": 0.1}, "r1": {"kv_usage": 0.1}},  # r1 serving again
    ]
    gate = gates("rejoin", script, policy="static", static_caps=(1, 512))
    ray.get(gate.mark_down.remote("r1"))
    assert ray.get(gate.acquire.remote("d0", 100)).replica == "r0"
    ray.get(gate.poll_now.remote())
    assert ray.get(gate.caps.remote())["r1"]["reason"] == "down"
    ray.get(gate.poll_now.remote())
    assert ray.get(gate.caps.remote())["r1"]["reason"] != "down"
    assert ray.get(gate.acquire.remote("d1", 100), timeout=5.0).replica == "r1"


def test_with_every_replica_down_requests_wait_out_the_grace_for_a_restart_then_fail(gates):
    script = [
        {"r0": {"kv_usage": 0.1}},
        {"r0": {"fresh": False}},  # restarting: not answering
        {"r0": {"kv_usage": 0.1}},  # serving again under its URL
    ]
    gate = gates("grace", script, replicas=REPLICAS[:1], policy="static", static_caps=(1, 512),
                 down_grace_s=QUIET)  # fmt: skip
    ray.get(gate.mark_down.remote("r0"))
    waiting = gate.acquire.remote("d0", 100)
    ray.get(gate.poll_now.remote())
    assert not ready([waiting], timeout=0.5)  # down, within the grace: it waits, it does not fail
    ray.get(gate.poll_now.remote())
    assert ray.get(waiting, timeout=5.0).replica == "r0"  # the restarted replica takes it

    brief = gates("brief", script[:2], replicas=REPLICAS[:1], policy="static",
                  static_caps=(1, 512), down_grace_s=0.3)  # fmt: skip
    ray.get(brief.mark_down.remote("r0"))
    given_up = brief.acquire.remote("d1", 100)
    time.sleep(0.4)
    ray.get(brief.poll_now.remote())  # a poll wakes the waiters, past the grace
    with pytest.raises(ray.exceptions.RayTaskError, match=r"down_grace_s 0\.3"):
        ray.get(given_up, timeout=5.0)
