"""Sensors against local HTTP responders: vLLM-shaped /metrics and a Prometheus query API."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from scheduler.admission import Observation
from scheduler.records import RequestRecord, percentile
from serving.sensors import (
    MergedSensor,
    PrometheusSensor,
    StreamedTimingsSensor,
    VllmMetricsSensor,
)

# vLLM's own bucket bounds (vllm/v1/metrics/buckets.py)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0)


class FakeVllm:
    """The metric families a vLLM replica exports, with its names, labels and buckets."""

    def __init__(self, engines: int = 1, num_gpu_blocks: int = 1000, block_size: int = 16) -> None:
        r = self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds", "", labels, buckets=ITL_BUCKETS, registry=r
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "", labels, buckets=TTFT_BUCKETS, registry=r
        )
        self.kv = Gauge("vllm:kv_cache_usage_perc", "", labels, registry=r)
        self.running = Gauge("vllm:num_requests_running", "", labels, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "", labels, registry=r)
        self.preemptions = Counter("vllm:num_preemptions", "", labels, registry=r)
        info = Gauge(
            "vllm:cache_config_info", "", ["engine", "num_gpu_blocks", "block_size"], registry=r
        )
        self.engines = [("m", str(e)) for e in range(engines)]
        for e in range(engines):
            info.labels(str(e), str(num_gpu_blocks), str(block_size)).set(1)
            for g in (self.kv, self.running, self.waiting):
                g.labels(*self.engines[e]).set(0)
            self.preemptions.labels(*self.engines[e])

    def text(self) -> str:
        return generate_latest(self.registry).decode()


@contextmanager
def serve(route: Callable[[str, dict], tuple[int, str]]) -> Iterator[str]:
    """A real HTTP server on loopback answering GETs with `route(path, query)`."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            url = urlparse(self.path)
            status, body = route(url.path, parse_qs(url.query))
            try:
                self.send_response(status)
                self.end_headers()
                self.wfile.write(body.encode())
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up on this query after another one failed

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def replica(fake: FakeVllm) -> Iterator[str]:
    with serve(lambda path, q: (200, fake.text()) if path == "/metrics" else (404, "")) as url:
        yield url


# -- vLLM /metrics --------------------------------------------------------------------------------


async def test_vllm_sensor_reports_window_p99_of_the_delta_only():
    fake = FakeVllm()
    for _ in range(1000):
        fake.itl.labels("m", "0").observe(0.3)  # a bad past, before the first scrape
    with replica(fake) as url:
        sensor = VllmMetricsSensor({"r0": url})
        first = (await sensor.observe())["r0"]
        assert first.fresh and first.chat_itl_p99_s is None  # no window yet
        for _ in range(980):
            fake.itl.labels("m", "0").observe(0.02)
        for _ in range(20):  # 2% slow tokens put the p99 in their bucket
            fake.itl.labels("m", "0").observe(0.17)
        second = (await sensor.observe())["r0"]
        assert 0.15 < second.chat_itl_p99_s <= 0.2  # the tail of this window, not the past's
        for _ in range(100):
            fake.itl.labels("m", "0").observe(0.02)
        third = (await sensor.observe())["r0"]
        assert 0.01 < third.chat_itl_p99_s <= 0.025
        empty = (await sensor.observe())["r0"]
        assert empty.chat_itl_p99_s is None
        await sensor.aclose()


async def test_vllm_sensor_window_slides_over_the_last_window_s_seconds():
    fake, now = FakeVllm(), [0.0]
    itl = fake.itl.labels("m", "0")
    with replica(fake) as url:
        sensor = VllmMetricsSensor({"r0": url}, window_s=15.0, clock=lambda: now[0])
        await sensor.observe()  # t=0: the window's first edge
        for t, slow in ((3.0, 30), (6.0, 0), (9.0, 0), (12.0, 0), (15.0, 0), (18.0, 0)):
            for _ in range(480):
                itl.observe(0.02)
            for _ in range(slow):  # one slow spell in the first 3 s
                itl.observe(0.17)
            fake.preemptions.labels("m", "0").inc(1 if t == 6.0 else 0)
            now[0] = t
            o = (await sensor.observe())["r0"]
            # the slow spell (over 1% of every window that holds it) is in the window until
            # the window starts from the scrape at t=3, just after it
            assert (o.chat_itl_p99_s > 0.15) == (t < 18.0), t
            assert o.window_s == pytest.approx(min(t, 15.0))
            assert o.preemptions == (1 if t == 6.0 else 0)  # counted once, not per window
        await sensor.aclose()


def test_sensor_window_must_be_positive():
    with pytest.raises(ValueError, match="window_s"):
        VllmMetricsSensor({"r0": "http://127.0.0.1:9"}, window_s=0)
    with pytest.raises(ValueError, match="window_s"):
        StreamedTimingsSensor(["r0"], window_s=-1.0)


async def test_vllm_sensor_reads_gauges_preemptions_and_kv_capacity():
    fake = FakeVllm(engines=2, num_gpu_blocks=1000, block_size=16)
    with replica(fake) as url:
        sensor = VllmMetricsSensor({"r0": url}, report_ttft=True)
        await sensor.observe()
        fake.kv.labels("m", "0").set(0.5)
        fake.kv.labels("m", "1").set(0.7)
        fake.running.labels("m", "0").set(12)
        fake.running.labels("m", "1").set(8)
        fake.waiting.labels("m", "1").set(3)
        fake.preemptions.labels("m", "1").inc(2)
        for v in (0.05, 0.3, 2.0):
            fake.ttft.labels("m", "0").observe(v)
        o = (await sensor.observe())["r0"]
        assert o.kv_usage == pytest.approx(0.6)  # mean over data-parallel engines
        assert o.kv_capacity_tokens == 2 * 1000 * 16
        assert (o.running, o.waiting, o.preemptions) == (20, 3, 2)
        assert 1.0 < o.chat_ttft_p99_s <= 2.5
        again = (await sensor.observe())["r0"]
        assert again.preemptions == 0  # a delta, not the running total
        await sensor.aclose()


async def test_vllm_sensor_can_leave_mixed_ttft_out():
    fake = FakeVllm()
    with replica(fake) as url:
        sensor = VllmMetricsSensor({"r0": url}, report_ttft=False)
        await sensor.observe()
        fake.ttft.labels("m", "0").observe(30.0)  # a long batch prompt's TTFT
        assert (await sensor.observe())["r0"].chat_ttft_p99_s is None
        await sensor.aclose()


async def test_unreachable_replica_is_stale_and_others_are_not():
    fake = FakeVllm()
    with replica(fake) as url:
        with serve(lambda path, q: (500, "boom")) as broken:
            sensor = VllmMetricsSensor(
                {"ok": url, "down": "http://127.0.0.1:9", "broken": broken}, timeout_s=1.0
            )
            obs = await sensor.observe()
            await sensor.aclose()
    assert obs["ok"].fresh
    assert not obs["down"].fresh and not obs["broken"].fresh


async def test_engine_restart_does_not_produce_negative_windows():
    before, after = FakeVllm(), FakeVllm()
    for _ in range(500):
        before.itl.labels("m", "0").observe(0.02)
    before.preemptions.labels("m", "0").inc(9)
    after.preemptions.labels("m", "0").inc(1)
    for _ in range(10):
        after.itl.labels("m", "0").observe(0.09)
    current = {"fake": before}
    with serve(lambda path, q: (200, current["fake"].text())) as url:
        sensor = VllmMetricsSensor({"r0": url})
        await sensor.observe()
        current["fake"] = after  # the engine restarted: counters start again from zero
        o = (await sensor.observe())["r0"]
        await sensor.aclose()
    assert o.preemptions == 1
    assert 0.075 < o.chat_itl_p99_s <= 0.1


# -- streamed timings -----------------------------------------------------------------------------


def finished(cls: str, t0: float, ttft: float, gaps: list[float], replica: str = "r0"):
    r = RequestRecord("run", f"{cls}-{t0}", cls, cls if cls == "chat" else "map", replica)
    r.t_submit = t0
    times = [t0 + ttft]
    for g in gaps:
        times.append(times[-1] + g)
    r.finish(times, times[-1])
    return r


async def test_streamed_itl_is_token_weighted_and_per_class():
    now = 1000.0
    sensor = StreamedTimingsSensor(["r0"], clock=lambda: now)
    long_fast = finished("chat", 990.0, 0.2, [0.02] * 400)
    short_slow = finished("chat", 995.0, 0.3, [0.2] * 3)
    batch = finished("batch", 980.0, 9.0, [0.03] * 50)
    for r in (long_fast, short_slow, batch):
        sensor.feed(r)
    o = (await sensor.observe())["r0"]
    all_chat_gaps = sorted([0.02] * 400 + [0.2] * 3)
    assert o.chat_itl_p99_s == pytest.approx(percentile(all_chat_gaps, 99))
    assert o.chat_itl_p99_s < 0.2  # 3 slow gaps of 403 tokens are under 1%
    assert o.chat_ttft_p99_s == pytest.approx(percentile([0.2, 0.3], 99))  # batch TTFT left out
    assert len(o.step_samples_s) == 400 + 3 + 50  # every decode gap is a step
    assert o.fresh


async def test_streamed_windows_do_not_overlap_and_old_samples_age_out():
    now = [1000.0]
    sensor = StreamedTimingsSensor(["r0", "r1"], max_age_s=30.0, clock=lambda: now[0])
    sensor.feed_gaps("r0", "chat", [(999.0, 0.09), (940.0, 0.5)])  # the second is old news
    o = await sensor.observe()
    assert o["r0"].chat_itl_p99_s == pytest.approx(0.09)
    assert o["r1"].chat_itl_p99_s is None and o["r1"].step_samples_s == ()
    now[0] = 1005.0
    assert (await sensor.observe())["r0"].chat_itl_p99_s is None  # already reported


async def test_streamed_sliding_window_reports_samples_again_until_they_age_out():
    now = [1000.0]
    sensor = StreamedTimingsSensor(["r0"], window_s=15.0, clock=lambda: now[0])
    sensor.feed_gaps("r0", "chat", [(999.0, 0.09)])
    sensor.feed_ttft("r0", "chat", 999.0, 0.4)
    first = (await sensor.observe())["r0"]
    assert first.chat_itl_p99_s == pytest.approx(0.09) and first.window_s == 15.0
    now[0] = 1010.0
    again = (await sensor.observe())["r0"]
    assert again.chat_itl_p99_s == pytest.approx(0.09)  # still inside the window
    assert again.chat_ttft_p99_s == pytest.approx(0.4)
    now[0] = 1015.0
    gone = (await sensor.observe())["r0"]
    assert gone.chat_itl_p99_s is None and gone.chat_ttft_p99_s is None


# -- Prometheus server ----------------------------------------------------------------------------


def prometheus_api(answers: dict[str, str | None]) -> Callable[[str, dict], tuple[int, str]]:
    """Answer /api/v1/query like Prometheus: the first answer whose key occurs in the query."""

    def route(path: str, q: dict) -> tuple[int, str]:
        if path != "/api/v1/query":
            return 404, ""
        query = q["query"][0]
        for key, value in answers.items():
            if key in query:
                result = [] if value is None else [{"metric": {}, "value": [1e9, value]}]
                body = {"status": "success", "data": {"resultType": "vector", "result": result}}
                return 200, json.dumps(body)
        err = {"status": "error", "errorType": "bad_data", "error": "unknown query"}
        return 400, json.dumps(err)

    return route


def test_prometheus_queries_are_the_promql_we_mean():
    s = PrometheusSensor("http://prom:9090", {"r0": "http://10.0.0.5:8000"}, range_="1m")
    q = s.queries(s.selectors["r0"])
    assert q["itl"] == (
        "histogram_quantile(0.99, sum by (le) "
        '(rate(vllm:inter_token_latency_seconds_bucket{instance="10.0.0.5:8000"}[1m])))'
    )
    assert q["preemptions"] == (
        'sum(increase(vllm:num_preemptions_total{instance="10.0.0.5:8000"}[1m]))'
    )
    assert (
        'replica="a"'
        in PrometheusSensor("http://p", {"a": 'replica="a"'}).queries('replica="a"')["kv"]
    )


async def test_prometheus_sensor_reads_every_field():
    answers = {
        "min(up": "1",
        "inter_token_latency": "0.042",
        "time_to_first_token": "NaN",  # no chat request in the range
        "kv_cache_usage": "0.61",
        "num_preemptions": "2",
        "num_requests_running": "17",
        "num_requests_waiting": None,  # series absent
    }
    with serve(prometheus_api(answers)) as url:
        sensor = PrometheusSensor(url, {"r0": 'instance="a:1"'})
        o = (await sensor.observe())["r0"]
        await sensor.aclose()
    assert o.fresh
    assert o.chat_itl_p99_s == pytest.approx(0.042)
    assert o.chat_ttft_p99_s is None
    assert o.kv_usage == pytest.approx(0.61)
    assert (o.preemptions, o.running, o.waiting) == (2, 17, 0)


@pytest.mark.parametrize(
    "answers",
    [
        {"min(up": "0", "": "1"},  # Prometheus cannot scrape the replica
        {"min(up": None, "": "1"},  # no such target
        {"min(up": "1"},  # every other query fails
    ],
)
async def test_prometheus_sensor_marks_unknown_or_down_replicas_stale(answers):
    with serve(prometheus_api(answers)) as url:
        sensor = PrometheusSensor(url, {"r0": 'instance="a:1"'})
        assert not (await sensor.observe())["r0"].fresh
        await sensor.aclose()


async def test_prometheus_server_down_is_stale():
    sensor = PrometheusSensor("http://127.0.0.1:9", {"r0": 'instance="a:1"'}, timeout_s=1.0)
    assert not (await sensor.observe())["r0"].fresh
    await sensor.aclose()


# -- merging --------------------------------------------------------------------------------------


class Fixed:
    def __init__(self, obs: dict[str, Observation]) -> None:
        self.obs = obs

    async def observe(self) -> dict[str, Observation]:
        return self.obs


async def test_merged_sensor_prefers_measured_latency_and_keeps_engine_state():
    state = Fixed(
        {
            "r0": Observation(0, "r0", chat_itl_p99_s=0.08, chat_ttft_p99_s=9.0, kv_usage=0.4),
            "r1": Observation(0, "r1", chat_itl_p99_s=0.03, kv_usage=0.2),
            "r2": Observation(0, "r2", fresh=False),
        }
    )
    latency = Fixed(
        {
            "r0": Observation(0, "r0", chat_ttft_p99_s=0.4, step_samples_s=(0.05,)),
            "r2": Observation(0, "r2", chat_itl_p99_s=0.01),
        }
    )
    merged = await MergedSensor(state, latency).observe()
    assert merged["r0"].chat_itl_p99_s == 0.08  # streamed saw no chat tokens: engine's mixed ITL
    assert merged["r0"].chat_ttft_p99_s == 0.4  # exact chat TTFT wins over the mixed one
    assert merged["r0"].kv_usage == 0.4 and merged["r0"].step_samples_s == (0.05,)
    assert merged["r1"].chat_itl_p99_s == 0.03
    assert not merged["r2"].fresh  # an unreadable engine stays unreadable


async def test_merged_sensor_can_keep_the_engines_itl():
    state = Fixed({"r0": Observation(0, "r0", chat_itl_p99_s=0.004, window_s=15.0)})
    latency = Fixed(
        {
            "r0": Observation(
                0, "r0", chat_itl_p99_s=0.04, chat_ttft_p99_s=0.3, step_samples_s=(0.04,)
            )
        }
    )
    merged = (await MergedSensor(state, latency, itl_from_state=True).observe())["r0"]
    assert merged.chat_itl_p99_s == 0.004  # the engine's step cadence, not bursty client gaps
    assert merged.step_samples_s == ()
    assert merged.chat_ttft_p99_s == 0.3  # TTFT still the client's, chat only
    assert merged.window_s == 15.0
