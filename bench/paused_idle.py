"""What a replica costs the host while the plug-in holds batch back and no chat runs.

One replica with the plug-in (cpu-tiny by default), measured in two states side by side:

- idle: no control document, no request;
- paused: a pause document in force and one batch prompt (priority 10) waiting behind it, nothing
  else in the engine.

In each state: the CPU each process of the replica's group used over `--seconds` (from
/proc/<pid>/stat utime+stime, in % of one core), then the TTFT of `--chats` short chats sent one
at a time at random gaps (so they land at random moments of whatever the engine core is doing).

    .venv/bin/python -m bench.paused_idle --engine-config engine_configs/cpu-tiny.yaml
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
from pathlib import Path

import httpx

from scheduler.latency_model import LatencyModel
from serving import engine_control
from serving.client import BATCH_PRIORITY, StreamingClient
from serving.engine_config import load_engine_config
from serving.launcher import Replica, ReplicaSet

FIT = Path("engine_configs/fits/cpu-small.json")
"""The latency model the pause document carries (a pause grants nothing, whatever the model)."""
TOKEN_RANGE = (100, 1000)
"""Token ids every local model's vocabulary holds (the tiny one has 1,024)."""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def group_cpu_seconds(pgid: int) -> dict[int, float]:
    """CPU seconds (user + system) so far of every live process of group `pgid`."""
    out = {}
    for d in Path("/proc").glob("[0-9]*"):
        f = _stat(int(d.name))
        if f is not None and int(f[2]) == pgid and f[0] != "Z":
            out[int(d.name)] = (int(f[11]) + int(f[12])) / CLOCK_TICKS
    return out


def role(pid: int) -> str:
    """The process's title: vLLM names its engine core and workers (`VLLM::EngineCore`)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [a.decode(errors="replace") for a in argv if a]
    if len(words) == 1:
        return words[0]
    module = next((w for i, w in enumerate(words) if i and words[i - 1] == "-m"), words[0])
    return module.rsplit(".", 1)[-1]


def cpu_share(pgid: int, seconds: float) -> dict[str, float]:
    """% of one core each process of the group used over the next `seconds`, by role."""
    t0, c0 = time.monotonic(), group_cpu_seconds(pgid)
    time.sleep(seconds)
    t1, c1 = time.monotonic(), group_cpu_seconds(pgid)
    out: dict[str, float] = {}
    for pid, used in c1.items():
        name = role(pid)
        out[name] = out.get(name, 0.0) + 100 * (used - c0.get(pid, 0.0)) / (t1 - t0)
    return out


async def chat_ttfts(replica: Replica, chats: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    out = []
    async with StreamingClient(replica.base_url, replica.served_model) as client:
        for _ in range(chats):
            await asyncio.sleep(rng.uniform(0.1, 0.4))
            prompt = [rng.randrange(*TOKEN_RANGE) for _ in range(64)]
            done = await client.complete(prompt, max_tokens=4, ignore_eos=True)
            if done.record.status != "ok":
                raise RuntimeError(f"chat failed: {done.record.error}")
            out.append(done.record.ttft_s)
    return out


async def batch_waiting(replica: Replica, tokens: int) -> None:
    """One batch prompt, held back by the pause until cancelled."""
    prompt = [random.randrange(*TOKEN_RANGE) for _ in range(tokens)]
    body = {"model": replica.served_model, "prompt": prompt, "max_tokens": 4,
            "priority": BATCH_PRIORITY, "ignore_eos": True}  # fmt: skip
    async with httpx.AsyncClient(timeout=3600) as client:
        await client.post(f"{replica.base_url}/v1/completions", json=body)


def summary(cpu: dict[str, float], ttfts: list[float]) -> dict:
    ordered = sorted(ttfts)
    return {
        "cpu_pct_of_one_core": {k: round(v, 1) for k, v in sorted(cpu.items())},
        "chat_ttft_ms": {
            "median": round(1000 * statistics.median(ordered), 1),
            "p90": round(1000 * ordered[int(0.9 * (len(ordered) - 1))], 1),
            "max": round(1000 * ordered[-1], 1),
            "n": len(ordered),
        },
    }


async def run(replica: Replica, args) -> dict:
    await chat_ttfts(replica, 3, seed=0)  # warm the API server's paths
    out = {"idle": summary(cpu_share(replica.pid, args.seconds),
                           await chat_ttfts(replica, args.chats, seed=1))}  # fmt: skip
    target = engine_control.ControlTarget(replica.name, folder=replica.control_dir)
    doc = engine_control.decision_document(
        engine_control.next_seq(), 20.0, LatencyModel.from_json(FIT), 3600, pause=True
    )
    engine_control.send(target, doc)
    await asyncio.sleep(0.5)
    batch = asyncio.create_task(batch_waiting(replica, args.batch_tokens))
    await asyncio.sleep(1.0)
    try:
        cpu = await asyncio.to_thread(cpu_share, replica.pid, args.seconds)
        out["paused"] = summary(cpu, await chat_ttfts(replica, args.chats, seed=2))
        if batch.done():
            raise RuntimeError("the batch prompt finished: the pause did not hold it back")
    finally:
        batch.cancel()
        await asyncio.gather(batch, return_exceptions=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine-config", type=Path, default=Path("engine_configs/cpu-tiny.yaml"))
    p.add_argument("--seconds", type=float, default=10.0, help="CPU measuring window per state.")
    p.add_argument("--chats", type=int, default=30, help="Chats per state.")
    p.add_argument("--batch-tokens", type=int, default=1500)
    p.add_argument("--port", type=int, default=8150)
    p.add_argument("--json", type=Path, help="Write the results here.")
    args = p.parse_args()
    config = load_engine_config(args.engine_config)
    with ReplicaSet("results/engines").running(
        config, str(args.engine_config), args.port
    ) as started:
        results = asyncio.run(run(started[0], args))
    print(json.dumps(results, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
