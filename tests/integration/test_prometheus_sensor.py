"""PrometheusSensor against a real Prometheus server scraping a real cpu-tiny replica.

The unit tests answer the sensor's PromQL from a fake; this one lets Prometheus itself scrape the
replica every second and evaluate `histogram_quantile` over `rate(...)`, then checks the sensor's
p99 against the one computed from two direct scrapes around the same requests. Needs the
`prometheus` binary (`make prometheus`); deselect with `-m "not prometheus"` where it cannot run.
"""

from __future__ import annotations

import asyncio
import bisect
import multiprocessing
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

import httpx
import pytest

from scheduler.admission import Observation
from serving.client import Completion, StreamingClient
from serving.engine_config import load_engine_config
from serving.metrics import MetricsSnapshot, histogram_delta, histogram_quantile, scrape
from serving.sensors import ITL_HISTOGRAMS, PrometheusSensor
from tests.integration.prometheus_server import prometheus_server
from tests.replicas import TINY, free_port_block

pytestmark = [pytest.mark.engine, pytest.mark.prometheus]

ITL = ITL_HISTOGRAMS[0]
MAX_TOKENS = 256
# Requests beyond max-num-seqs: they queue, so `waiting` has something to read.
EXTRA_REQUESTS = 4
LOAD_DEADLINE_S = 30.0


@pytest.fixture
def prometheus(tiny_replica, tmp_path):
    """A Prometheus scraping the replica (job `vllm`) and a port nobody listens on (job `gone`)."""
    dead = f"127.0.0.1:{free_port_block(1)}"
    jobs = {"vllm": [f"{tiny_replica.host}:{tiny_replica.port}"], "gone": [dead]}
    with prometheus_server(tmp_path / "prometheus", jobs) as url:
        yield url, dead


async def test_sensor_reads_a_real_replica_through_a_real_prometheus(
    tiny_replica, prometheus
) -> None:
    url, dead = prometheus
    replica_url = tiny_replica.base_url
    instance = f'instance="{tiny_replica.host}:{tiny_replica.port}"'
    count_query = f"sum({ITL}_count{{{instance}}})"
    replicas = {"tiny": replica_url, "gone": f"http://{dead}"}
    async with httpx.AsyncClient() as http:
        sensor = PrometheusSensor(url, replicas, client=http)
        # Prometheus spreads its first scrapes over the first seconds; both targets must be seen.
        await until(http, url, f'up{{instance="{dead}"}}', lambda v: v == 0.0)
        await until(http, url, f"up{{{instance}}}", lambda v: v == 1.0)
        before = await scrape(http, replica_url)
        assert await query(http, url, count_query) == before.histogram(ITL).count
        seats, during = await stream_until_seen(tiny_replica, url)
        after = await scrape(http, replica_url)
        await until(http, url, count_query, lambda v: v == after.histogram(ITL).count)
        observed = await sensor.observe()

    tiny, gone = observed["tiny"], observed["gone"]
    assert tiny.fresh and tiny.replica == "tiny"
    direct = histogram_quantile(histogram_delta(after.histogram(ITL), before.histogram(ITL)), 0.99)
    print(
        f"\nITL p99: Prometheus {tiny.chat_itl_p99_s * 1e3:.2f} ms, "
        f"direct scrapes {direct * 1e3:.2f} ms"
    )
    assert tiny.chat_itl_p99_s > 0 and direct > 0
    assert abs(tiny.chat_itl_p99_s - direct) <= bucket_width(after, direct)
    assert tiny.chat_ttft_p99_s is not None and tiny.chat_ttft_p99_s > 0
    assert tiny.kv_usage is not None and 0.0 <= tiny.kv_usage <= 1.0
    preempted = after.counter("vllm:num_preemptions") - before.counter("vllm:num_preemptions")
    assert abs(tiny.preemptions - preempted) <= max(1, preempted // 10)  # increase() extrapolates
    states = [(o.fresh, o.running, o.waiting, o.kv_usage) for o in during]
    assert saw_full_seats(during, seats), f"never saw {seats} running and a queue: {states}"
    assert not gone.fresh and gone.chat_itl_p99_s is None


async def stream_until_seen(replica, url: str) -> tuple[int, list[Observation]]:
    """Keep every seat busy and a few requests queued until the sensor has seen that state.

    Topping requests up keeps the state steady, so a watcher that a starved CPU delays still sees
    it; the deadline bounds the test when it never does. Returns the seats and what was seen."""
    seats = int(load_engine_config(TINY).flag("max-num-seqs"))
    done: list[Completion] = []
    with Watcher(url, "tiny", replica.base_url) as watcher:
        async with StreamingClient(replica.base_url, replica.served_model, run_id="it-prom") as c:
            in_flight: set[asyncio.Task] = set()
            deadline = time.monotonic() + LOAD_DEADLINE_S
            while not saw_full_seats(watcher.seen(), seats) and time.monotonic() < deadline:
                while len(in_flight) < seats + EXTRA_REQUESTS:
                    prompt = f"Night shift report {len(done) + len(in_flight)}:"
                    request = c.complete(prompt, max_tokens=MAX_TOKENS, ignore_eos=True)
                    in_flight.add(asyncio.create_task(request))
                finished, in_flight = await asyncio.wait(
                    in_flight, timeout=0.25, return_when=asyncio.FIRST_COMPLETED
                )
                done += [task.result() for task in finished]
            done += await asyncio.gather(*in_flight)
        seen = watcher.seen()
    assert all(r.ok for r in done), [r.record.error for r in done if not r.ok]
    return seats, seen


def saw_full_seats(seen: list[Observation], seats: int) -> bool:
    """Some observation had every seat running, a queue behind them and KV in use."""
    return any(o.running == seats and o.waiting >= 1 and (o.kv_usage or 0) > 0 for o in seen)


class Watcher:
    """A PrometheusSensor polled in a process of its own: thousands of streamed tokens a second
    keep the test's process (event loop and GIL alike) too busy to poll on time."""

    def __init__(self, url: str, name: str, base_url: str) -> None:
        spawn = multiprocessing.get_context("spawn")
        self._conn, theirs = spawn.Pipe()
        self._process = spawn.Process(target=watch, args=(url, name, base_url, theirs), daemon=True)
        self._seen: list[Observation] = []

    def __enter__(self) -> Watcher:
        self._process.start()
        # Its first observation says it is polling; nothing else runs yet, so blocking is fine.
        if not self._conn.poll(60.0):
            self._stop()
            raise AssertionError("the watcher process sent no observation within 60 s")
        return self

    def seen(self) -> list[Observation]:
        """Every observation made so far."""
        while self._conn.poll():
            self._seen.append(self._conn.recv())
        return self._seen

    def __exit__(self, *exc: object) -> None:
        self.seen()
        self._stop()

    def _stop(self) -> None:
        self._conn.send("stop")
        self._process.join(timeout=10.0)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()


def watch(url: str, name: str, base_url: str, conn: Connection) -> None:
    """In the watcher process: send one observation of `name` every quarter second until told
    to stop."""

    async def poll() -> None:
        sensor = PrometheusSensor(url, {name: base_url})
        while not conn.poll():
            conn.send((await sensor.observe())[name])
            await asyncio.sleep(0.25)
        await sensor.aclose()

    asyncio.run(poll())


def bucket_width(snap: MetricsSnapshot, value: float) -> float:
    """Width of the ITL bucket that holds `value`: the resolution both p99s are known to."""
    bounds = [b for b in snap.histogram(ITL).bounds if b != float("inf")]
    i = bisect.bisect_left(bounds, value)
    lower = bounds[i - 1] if i > 0 else 0.0
    return bounds[min(i, len(bounds) - 1)] - lower


async def query(http: httpx.AsyncClient, url: str, promql: str) -> float | None:
    """The single value of an instant query, None when it has no result yet."""
    response = await http.get(f"{url}/api/v1/query", params={"query": promql}, timeout=5.0)
    response.raise_for_status()
    result = response.json()["data"]["result"]
    return float(result[0]["value"][1]) if result else None


async def until(
    http: httpx.AsyncClient,
    url: str,
    promql: str,
    accept: Callable[[float], bool],
    timeout_s: float = 20.0,
) -> float:
    """Poll a query until its value is accepted: Prometheus sees the replica a scrape late."""
    deadline = time.monotonic() + timeout_s
    value = None
    while time.monotonic() < deadline:
        value = await query(http, url, promql)
        if value is not None and accept(value):
            return value
        await asyncio.sleep(0.2)
    raise AssertionError(f"{promql} still {value} after {timeout_s:.0f} s")
