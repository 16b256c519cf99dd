"""The Gate's SLO controller driving a real cpu-small replica's engine plug-in: chat's own ITL p99
(the plug-in's chat-only gaps) stays within the SLO while 16k-token batch prompts make progress.
The controller starts cold, at half the ITL SLO in real step time, and sends that over the plug-in's
measured/predicted step ratio: where this host runs steps slower than the fit says, the number
sent is smaller, and the steps are as long as intended.

The SLO is 40 ms ITL p99 and 500 ms TTFT p99, loosened where this host is slower as the bench
derives its own: an ITL no tighter than two full engine steps priced at the speed this host runs
the fit (chat's own prompts are prefilled in such steps, and a stream's gaps include them
whenever chats overlap), a TTFT `SLO_OVER_ALONE` times chat alone's. In float32 without AVX-512
chat's 256-token prompts alone take ~70-90 ms steps, and no batch setting brings chat under that."""

from __future__ import annotations

import asyncio
import time

import httpx

from pipelines.gate import GateActor
from scheduler.slo import SLO
from serving.engine_config import load_engine_config
from serving.engine_control import ControlTarget, read_status
from serving.metrics import histogram_delta, histogram_quantile
from serving.plugin_sensor import status_histogram
from tests.integration.small_replica.test_engine_plugin import (
    BATCH_TOKENS,
    chat_for,
    full_step_s,
    host_speed,
    p99,
    set_budget,
    status,
    status_after_load,
)
from tests.replicas import fit_of, for_this_cpu

SMALL = for_this_cpu("cpu-small")
FIT = fit_of(SMALL)
SLO_OVER_ALONE = 1.5
RUN_S = 40.0


def slo_for_this_host(replica) -> SLO:
    """40 ms / 500 ms, or the ITL floor at this host's speed and `SLO_OVER_ALONE` x chat alone's
    TTFT p99 where those are looser. Chat runs alone under a document with a target it never
    reaches, so the plug-in prices its steps: their measured over modelled time is the speed."""
    set_budget(replica, target_ms=1000.0)
    before = status(replica)
    ttfts = asyncio.run(chat_for(replica, 8, seed=5))
    speed = host_speed(before, status_after_load(replica))
    print(f"chat alone: steps at {speed:.2f}x the fit, TTFT p99 {1000 * p99(ttfts):.0f} ms")
    return SLO(chat_itl_p99_ms=max(40.0, round(2000 * full_step_s(speed), 1)),
               chat_ttft_p99_ms=max(500.0, round(SLO_OVER_ALONE * 1000 * p99(ttfts), 1)),
               window_s=5.0)  # fmt: skip


async def batch_worker(gate: GateActor, replica, seed: int, deadline: float) -> int:
    """Batch prompts through the Gate one after another; the prompts that finished."""
    done = 0
    async with httpx.AsyncClient(timeout=600) as client:
        while time.monotonic() < deadline:
            permit = await gate.acquire(f"doc-{seed}-{done}", BATCH_TOKENS, 8, timeout_s=RUN_S)
            prompt = [100 + (seed * 7 + done * 131 + k * 37) % 1200 for k in range(BATCH_TOKENS)]
            body = {"model": replica.served_model, "prompt": prompt, "max_tokens": 8,
                    "priority": permit.priority, "ignore_eos": True}  # fmt: skip
            try:
                remaining = max(1.0, deadline - time.monotonic())
                r = await asyncio.wait_for(
                    client.post(f"{permit.base_url}/v1/completions", json=body), remaining
                )
                done += r.status_code == 200
            except TimeoutError:
                return done
            finally:
                await gate.release(permit.permit_id)
    return done


def test_the_gate_steers_the_plugin_and_chat_holds_its_slo_while_batch_progresses(replica):
    target = ControlTarget(replica.name, folder=replica.control_dir)
    slo = slo_for_this_host(replica)
    gate = GateActor(
        "gate-plugin",
        [(replica.name, replica.base_url)],
        slo=slo,
        policy="slo",
        latency_model=str(FIT),
        sensor={"kind": "vllm", "window_s": slo.window_s},
        interval_s=1.0,
        engine_flags=load_engine_config(SMALL).vllm,
        control_targets={replica.name: target},
    )

    async def night() -> tuple[list[float], int]:
        deadline = time.monotonic() + RUN_S
        workers = [batch_worker(gate, replica, s, deadline) for s in range(2)]
        chat, *finished = await asyncio.gather(chat_for(replica, RUN_S, seed=11), *workers)
        await gate.close()
        return chat, sum(finished)

    before = read_status(target)
    ttfts, finished = asyncio.run(night())
    after = read_status(target)
    gaps = histogram_delta(
        status_histogram(after, "chat_itl_seconds"), status_histogram(before, "chat_itl_seconds")
    )
    itl_p99 = histogram_quantile(gaps, 0.99)
    prefilled = after["totals"]["batch_prefill_tokens"] - before["totals"]["batch_prefill_tokens"]
    rows = asyncio.run(gate.decision_rows())
    targets = [r["batch_step_target_ms"] for r in rows]
    report = (f"chat ITL p99 {1000 * itl_p99:.1f} ms (SLO {slo.chat_itl_p99_ms}), "
              f"{len(ttfts)} chats, batch prefilled {prefilled} tokens, {finished} prompts done, "
              f"targets {min(targets):.1f}..{max(targets):.1f} ms")  # fmt: skip
    print(report)
    assert after["state"] == "active" and after["control_seq"] is not None, report
    assert itl_p99 <= slo.chat_itl_p99_ms / 1000, report
    assert prefilled >= BATCH_TOKENS // 4, report
    assert len(set(targets)) > 1, "the controller moved the target"
    steps = asyncio.run(gate.engine_step_rows())
    assert steps and all(r["replica"] == replica.name for r in steps)
