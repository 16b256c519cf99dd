"""Stock vLLM against the engine plug-in at fixed batch step targets, side by side on one replica.

The same chat load in every scenario (streams that send a new 256-token chat as soon as the last
one ends) beside a backlog of long batch prompts (16k-32k tokens, one at a time, at batch
priority). Scenarios run one after another on one replica, in this order: chat alone, stock (no
control document: the plug-in only observes), then the plug-in at each target. Per scenario:

- chat ITL p99 from the plug-in's chat-only gaps, and from vLLM's own (class-blind) histogram;
- chat TTFT p99 and max as the clients saw them, and chats answered;
- batch tokens/s (prompt and output tokens the engine computed for batch, from the plug-in's
  counters, so a prompt cut off at the end of a scenario counts what it did).

    .venv/bin/python -m bench.plugin_targets --engine-config engine_configs/cpu-small.yaml \\
        --targets 20,40,80 --duration 60 --json results/plugin_targets.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from pathlib import Path

import httpx

from serving import engine_control
from serving.client import StreamingClient
from serving.engine_config import load_engine_config
from serving.launcher import Replica, ReplicaSet
from serving.metrics import histogram_delta, histogram_quantile, scrape
from serving.plugin_sensor import status_histogram
from serving.replica_targets import latency_model_for

CHAT_PROMPT_TOKENS = 256
CHAT_OUTPUT_TOKENS = 24
TOKEN_RANGE = (100, 1200)
"""Token ids every local model's vocabulary holds."""


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(*TOKEN_RANGE) for _ in range(n)]


async def chat_streams(replica: Replica, streams: int, deadline: float, seed: int) -> list[float]:
    """TTFTs of every chat answered before `deadline`."""
    ttfts: list[float] = []

    async def one(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        async with StreamingClient(replica.base_url, replica.served_model) as client:
            while time.monotonic() < deadline:
                done = await client.complete(
                    _tokens(rng, CHAT_PROMPT_TOKENS), max_tokens=CHAT_OUTPUT_TOKENS,
                    ignore_eos=True,
                )  # fmt: skip
                if done.record.status == "ok":
                    ttfts.append(done.record.ttft_s)

    await asyncio.gather(*(one(i) for i in range(streams)))
    return ttfts


async def batch_backlog(replica: Replica, lengths: tuple[int, int], seed: int) -> None:
    """Long batch prompts one after another until cancelled."""
    rng = random.Random(seed)
    async with httpx.AsyncClient(timeout=3600) as client:
        while True:
            body = {"model": replica.served_model, "prompt": _tokens(rng, rng.randint(*lengths)),
                    "max_tokens": 16, "priority": 10, "ignore_eos": True}  # fmt: skip
            await client.post(f"{replica.base_url}/v1/completions", json=body)


def _status(replica: Replica) -> dict:
    target = engine_control.ControlTarget(replica.name, folder=replica.control_dir)
    for _ in range(50):
        if (doc := engine_control.read_status(target)) is not None:
            return doc
        time.sleep(0.1)
    raise RuntimeError(f"{replica.name}: the plug-in wrote no status")


def _p99(values: list[float]) -> float | None:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else None


async def scenario(replica: Replica, args, batch: bool, seed: int) -> dict:
    async with httpx.AsyncClient() as http:
        m0, s0 = await scrape(http, replica.base_url), _status(replica)
        t0 = time.monotonic()
        backlog = asyncio.create_task(batch_backlog(replica, args.lengths, seed)) if batch else None
        ttfts = await chat_streams(replica, args.streams, t0 + args.duration, seed)
        if backlog is not None:
            backlog.cancel()
            await asyncio.gather(backlog, return_exceptions=True)
        elapsed = time.monotonic() - t0
        await asyncio.sleep(1.2)  # the plug-in's next status write
        m1, s1 = await scrape(http, replica.base_url), _status(replica)
    t0_, t1_ = s0["totals"], s1["totals"]
    batch_tokens = sum(t1_[k] - t0_[k] for k in ("batch_prefill_tokens", "batch_decode_tokens"))
    engine_itl = histogram_delta(
        m1.histogram("vllm:inter_token_latency_seconds"),
        m0.histogram("vllm:inter_token_latency_seconds"),
    )
    chat_gaps = histogram_delta(
        status_histogram(s1, "chat_itl_seconds"), status_histogram(s0, "chat_itl_seconds")
    )
    return {
        "state": s1["state"],
        "chats": len(ttfts),
        "chat_ttft_p99_s": _p99(ttfts),
        "chat_ttft_max_s": max(ttfts, default=None),
        "chat_itl_p50_s": histogram_quantile(chat_gaps, 0.5),
        "chat_itl_p99_s": histogram_quantile(chat_gaps, 0.99),
        "engine_itl_p99_s": histogram_quantile(engine_itl, 0.99),
        "batch_tokens_per_s": batch_tokens / elapsed,
    }


async def run(replica: Replica, args) -> dict:
    model = latency_model_for(args.engine_config)
    target = engine_control.ControlTarget(replica.name, folder=replica.control_dir)
    out = {"chat-only": await scenario(replica, args, False, 1)}
    out["stock"] = await scenario(replica, args, True, 2)
    for i, ms in enumerate(args.targets):
        doc = engine_control.decision_document(engine_control.next_seq(), ms, model, 3600)
        engine_control.send(target, doc)
        out[f"target-{ms:g}ms"] = await scenario(replica, args, True, 3 + i)
    return out


def verdicts(results: dict) -> dict[str, dict]:
    """Each target against the issue's bar: ITL p99 <= T + one decode step, TTFT p99 <= 2x chat
    alone's, batch tokens/s >= 60% of stock's."""
    alone, stock = results["chat-only"], results["stock"]
    out = {}
    for name, r in results.items():
        if not name.startswith("target-"):
            continue
        t_s = float(name[len("target-") : -2]) / 1000
        out[name] = {
            "itl_ok": r["chat_itl_p99_s"] <= t_s + alone["chat_itl_p50_s"],
            "ttft_ok": r["chat_ttft_p99_s"] <= 2 * alone["chat_ttft_p99_s"],
            "batch_vs_stock": r["batch_tokens_per_s"] / stock["batch_tokens_per_s"],
        }
    return out


def table(results: dict) -> str:
    def ms(v):
        return "-" if v is None else f"{1000 * v:.1f}"

    rows = ["| scenario | chat ITL p99 ms (chat gaps) | engine ITL p99 ms | chat TTFT p99 ms "
            "| TTFT max ms | chats | batch tok/s |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, r in results.items():
        rows.append(
            f"| {name} | {ms(r['chat_itl_p99_s'])} | {ms(r['engine_itl_p99_s'])} | "
            f"{ms(r['chat_ttft_p99_s'])} | {ms(r['chat_ttft_max_s'])} | {r['chats']} | "
            f"{r['batch_tokens_per_s']:.0f} |"
        )
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine-config", type=Path, default=Path("engine_configs/cpu-small.yaml"))
    p.add_argument("--targets", default="20,40,80", help="Batch step targets, ms, comma-separated.")
    p.add_argument("--duration", type=float, default=60.0, help="Seconds per scenario.")
    p.add_argument("--streams", type=int, default=4, help="Chat streams.")
    p.add_argument("--min-batch-tokens", type=int, default=16_384)
    p.add_argument("--max-batch-tokens", type=int, default=32_000)
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--json", type=Path, help="Write the results here.")
    args = p.parse_args()
    args.targets = [float(t) for t in args.targets.split(",")]
    args.lengths = (args.min_batch_tokens, args.max_batch_tokens)
    config = load_engine_config(args.engine_config)
    replicas = ReplicaSet("results/engines")
    with replicas.running(config, str(args.engine_config), args.port) as started:
        results = asyncio.run(run(started[0], args))
    doc = {"engine_config": str(args.engine_config), "duration_s": args.duration,
           "scenarios": results, "verdicts": verdicts(results)}  # fmt: skip
    print(table(results))
    print(json.dumps(doc["verdicts"], indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
