"""The engine plug-in on a real cpu-small replica: 16k-token batch prompts, one after another,
beside streaming chat that keeps sending new requests, stock vLLM against the plug-in at a batch
step target, then the pause and a controller killed with -9.

Chat's ITL is read from the plug-in's own chat-only gap histogram (engine-side, so host noise in
the streaming clients does not count); TTFT from the clients.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from bench.paused_idle import cpu_share
from bench.verdicts import MeasuredModel, engine_itl_floor_ms
from serving import engine_control
from serving.client import StreamingClient
from serving.engine_config import load_engine_config
from serving.metrics import Histogram, histogram_delta, histogram_quantile
from serving.plugin_sensor import status_histogram
from serving.replica_targets import latency_model_for
from tests.replicas import REPO, for_this_cpu

SMALL = for_this_cpu("cpu-small")
BATCH_TOKENS = 16_384
CHAT_STREAMS = 4
DECODE_STEPS_PER_TARGET = 6
"""The fixed batch step target, in chat-alone decode steps (20 ms at least)."""


def target_of(replica) -> engine_control.ControlTarget:
    return engine_control.ControlTarget(replica.name, folder=replica.control_dir)


def status(replica, newer_than: float = 0.0) -> dict:
    """The plug-in's status document once one newer than `newer_than` is there. It writes about
    once a second while the engine steps and not at all while it is idle, so the last document of
    a phase of load is at most a second older than the phase's end."""
    for _ in range(40):
        doc = engine_control.read_status(target_of(replica))
        if doc and doc["written_at"] > newer_than:
            return doc
        time.sleep(0.1)
    raise AssertionError(f"the plug-in wrote no status after {newer_than}")


def status_after_load(replica) -> dict:
    return status(replica, time.time() - 1.5)


def chat_gaps(doc: dict) -> Histogram:
    return status_histogram(doc, "chat_itl_seconds")


def set_budget(replica, target_ms: float = 0.0, pause: bool = False, ttl_s: float = 600) -> float:
    doc = engine_control.decision_document(
        engine_control.next_seq(), target_ms, latency_model_for(SMALL), ttl_s, pause
    )
    engine_control.send(target_of(replica), doc)
    return time.time()


async def chat_for(replica, seconds: float, seed: int) -> list[float]:
    """CHAT_STREAMS clients, each sending a new 256-token chat as soon as its last one ends;
    the TTFT of every chat that finished."""
    ttfts: list[float] = []
    deadline = time.monotonic() + seconds

    async def stream(i: int) -> None:
        async with StreamingClient(replica.base_url, replica.served_model) as client:
            n = 0
            while time.monotonic() < deadline:
                prompt = [100 + (seed * 7919 + i * 131 + n * 17 + k) % 1200 for k in range(256)]
                done = await client.complete(prompt, max_tokens=24, ignore_eos=True)
                assert done.record.status == "ok", done.record.error
                ttfts.append(done.record.ttft_s)
                n += 1

    await asyncio.gather(*(stream(i) for i in range(CHAT_STREAMS)))
    return ttfts


async def batch_prompt(replica, seed: int) -> None:
    """One batch request of BATCH_TOKENS prompt tokens at batch priority (cancelled = aborted)."""
    prompt = [100 + (seed * 104729 + k * 37) % 1200 for k in range(BATCH_TOKENS)]
    async with httpx.AsyncClient(timeout=600) as client:
        r = await client.post(
            f"{replica.base_url}/v1/completions",
            json={"model": replica.served_model, "prompt": prompt, "max_tokens": 4,
                  "priority": 10, "ignore_eos": True},
        )  # fmt: skip
        assert r.status_code == 200, r.text


async def chat_beside_batch(replica, seconds: float, seed: int) -> list[float]:
    """Chat for `seconds` while batch prompts are prefilled one after another: batch is in
    prefill for the whole window however fast the host prefills one (stock vLLM on an AMX host
    prefills 16k tokens in under 2 s, a fifth of the window, and the chats it starved fell under
    the p99)."""

    async def one_after_another() -> None:
        for n in range(1000):
            await batch_prompt(replica, seed + 1000 * n)  # a new prompt: no prefix cache hit

    batch = asyncio.create_task(one_after_another())
    await asyncio.sleep(0.5)
    try:
        return await chat_for(replica, seconds, seed)
    finally:
        batch.cancel()
        await asyncio.gather(batch, return_exceptions=True)


def host_speed(start: dict, end: dict) -> float:
    """Measured over modelled time of the steps the plug-in priced between two status documents
    (1 where it priced none): how much slower than its fit this host runs the replica."""
    measured, model = (
        end["totals"][k] - start["totals"][k] for k in ("measured_when_predicted_s", "model_s")
    )
    return measured / model if model > 0 else 1.0


def full_step_s(speed: float) -> float:
    """One engine step that prefills a full step budget beside a decoding chat, at `speed` times
    the fit: the step that prefills chat's own prompts when several arrive together, which no
    batch setting shortens (`bench.verdicts.itl_floor_ms` prices two of them)."""
    model = MeasuredModel(latency_model_for(SMALL), speed)
    return engine_itl_floor_ms(model, load_engine_config(SMALL).vllm) / 2 / 1000


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def test_stock_starves_new_chats_and_the_plugin_holds_chat_at_its_target(replica):
    before = status(replica)
    alone = asyncio.run(chat_for(replica, 8, seed=1))
    after_alone = status_after_load(replica)
    gaps_alone = histogram_delta(chat_gaps(after_alone), chat_gaps(before))
    decode_step = histogram_quantile(gaps_alone, 0.5)
    assert after_alone["state"] == "inert"

    stock = asyncio.run(chat_beside_batch(replica, 10, seed=2))
    assert status_after_load(replica)["state"] == "inert"

    # A target a few of this host's decode steps long, as an operator would set it: batch has
    # room beside chat's decodes on a host that runs its fit 2-3x slow (float32 without AVX-512),
    # where a fixed 20 ms leaves the scaled model almost none.
    target_ms = max(20.0, round(DECODE_STEPS_PER_TARGET * decode_step * 1000))
    set_budget(replica, target_ms)
    start = status_after_load(replica)
    budgeted = asyncio.run(chat_beside_batch(replica, 12, seed=3))
    end = status_after_load(replica)
    assert end["state"] == "active"
    gaps = histogram_delta(chat_gaps(end), chat_gaps(start))
    itl_p99 = histogram_quantile(gaps, 0.99)
    prefilled = end["totals"]["batch_prefill_tokens"] - start["totals"]["batch_prefill_tokens"]
    speed = host_speed(start, end)
    chat_step = full_step_s(speed)
    report = (
        f"chat alone TTFT p99 {p99(alone):.3f} s, decode step {decode_step * 1000:.1f} ms; "
        f"stock TTFT p99 {p99(stock):.3f} s (max {max(stock):.3f}); plug-in at {target_ms} ms: "
        f"TTFT p99 {p99(budgeted):.3f} s, chat ITL p99 {itl_p99 * 1000:.1f} ms, "
        f"batch prefilled {prefilled} tokens; steps at {speed:.2f}x the fit, a full step "
        f"{chat_step * 1000:.1f} ms"
    )
    print(report)
    assert p99(stock) > 4 * p99(alone), report
    # Chat's gaps sit near the target, within the error of the host's step fit (~20-35% here,
    # docs/results.md, calibration; 1.27x the target at worst on a loaded fresh-clone host), plus
    # its own decode step; unsized 512-token chunks deep in the prompt run ~67 ms steps. Steps
    # that prefill chat's prompts carry no batch and are chat's own: where one is longer than
    # the target (float32 without AVX-512 runs them at ~70-90 ms) it bounds chat's gaps, within
    # the tail of one step's time (p99 1.25-1.5x its mean, docs/results.md, fidelity). How close
    # to the target itself chat's gaps sit is a speed figure, measured by bench.plugin_targets.
    bound = max(1.75 * target_ms / 1000 + decode_step, 1.5 * chat_step)
    assert itl_p99 <= bound, report
    assert p99(budgeted) <= 2 * p99(alone), report
    assert prefilled > 2048, report


def test_pause_stops_batch_prefill_within_100_ms_and_chat_streams_on(replica):
    """Then, with the paused batch prompt alone in the engine, the replica idles: its engine core
    holds the empty steps (serving/engine_site/idle_hold.py) instead of looping through them
    as fast as it can in three processes (docs/results.md has the figures)."""
    set_budget(replica, 20.0)

    async def run() -> tuple[float, list[float], dict[str, float]]:
        batch = asyncio.create_task(batch_prompt(replica, seed=4))
        await asyncio.sleep(2.0)
        paused_at = set_budget(replica, pause=True)
        ttfts = await chat_for(replica, 3, seed=5)
        await asyncio.sleep(1.2)  # the worker polls its queue for a second after the last step
        cpu = await asyncio.to_thread(cpu_share, replica.pid, 3.0)
        assert not batch.done(), "the paused batch prompt was still waiting"
        batch.cancel()
        await asyncio.gather(batch, return_exceptions=True)
        return paused_at, ttfts, cpu

    paused_at, ttfts, cpu = asyncio.run(run())
    doc = status_after_load(replica)
    assert doc["state"] == "paused"
    assert ttfts, "chat went on while batch was paused"
    assert doc["last_batch_prefill_at"] <= paused_at + 0.1
    shares = {k: round(v, 1) for k, v in cpu.items()}
    report = f"% of one core by process while paused, no chat: {shares}"
    print(report)
    assert sum(cpu.values()) < 25, report


def test_the_plugin_times_each_finished_chat_end_to_end_as_its_client_does(replica):
    """The controller's optional E2E SLO is judged by the plug-in's count: from the request's
    arrival in the engine to its last token, once per chat, never longer than the client saw;
    and it counts each answer's tokens, whose p99 sets the step an E2E SLO allows."""
    before = status(replica)

    async def chats() -> list[float]:
        async with StreamingClient(replica.base_url, replica.served_model) as client:
            e2es = []
            for n in range(6):
                prompt = [100 + (n * 211 + k) % 1200 for k in range(128)]
                done = await client.complete(prompt, max_tokens=8 + 4 * n, ignore_eos=True)
                assert done.ok, done.record.error
                e2es.append(done.record.e2e_s)
            return e2es

    e2es = asyncio.run(chats())
    after = status_after_load(replica)
    counted = histogram_delta(status_histogram(after, "chat_e2e_seconds"),
                              status_histogram(before, "chat_e2e_seconds"))  # fmt: skip
    assert counted.count == len(e2es)
    engine_p99 = histogram_quantile(counted, 0.99)
    assert 0.8 * max(e2es) <= engine_p99 <= 1.05 * max(e2es), (engine_p99, e2es)
    answers = histogram_delta(status_histogram(after, "chat_answer_tokens"),
                              status_histogram(before, "chat_answer_tokens"))  # fmt: skip
    assert answers.count == len(e2es) and answers.sum == sum(8 + 4 * n for n in range(6))
    assert histogram_quantile(answers, 0.99) == pytest.approx(8 + 4 * 5, rel=0.05)


def test_a_killed_controller_leaves_chat_served_and_batch_paused_after_expiry(replica):
    ttl_s = 1.5
    controller = subprocess.Popen(
        [sys.executable, "-c", CONTROLLER, str(replica.control_dir), str(SMALL), str(ttl_s)],
        cwd=REPO,
    )

    async def run() -> list[float]:
        batch = asyncio.create_task(batch_prompt(replica, seed=6))
        await asyncio.sleep(2.0)
        os.kill(controller.pid, signal.SIGKILL)
        controller.wait()
        ttfts = await chat_for(replica, 4, seed=7)
        batch.cancel()
        await asyncio.gather(batch, return_exceptions=True)
        return ttfts

    try:
        ttfts = asyncio.run(run())
    finally:
        controller.kill()
    killed_at = time.time() - 4
    doc = status_after_load(replica)
    assert doc["state"] == "expired"
    assert ttfts, "chat was served after the controller died"
    assert doc["last_batch_prefill_at"] <= killed_at + ttl_s + 0.1


CONTROLLER = """
import sys, time
from bench.paused_idle import cpu_share
from serving import engine_control
from serving.replica_targets import latency_model_for
folder, config, ttl = sys.argv[1], sys.argv[2], float(sys.argv[3])
target = engine_control.ControlTarget("test", folder=__import__("pathlib").Path(folder))
model = latency_model_for(config)
while True:
    doc = engine_control.decision_document(engine_control.next_seq(), 20.0, model, ttl)
    engine_control.send(target, doc)
    time.sleep(0.25)
"""
