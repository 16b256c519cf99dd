"""What one controller decision costs: the target is under 1 ms.

The Gate decides for every replica every few seconds and the simulator for every replica every
virtual interval, so decision cost bounds how many replicas one Gate can steer and how fast the
simulator runs. Observations are realistic and varied (70B model, chat and batch load, KV state,
windows of step samples) so the number covers every branch, not just the cheap ones.

    .venv/bin/python -m bench.controller_decide_speed [--decisions N] [--replicas R]
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from scheduler.admission import BatchInFlight, Observation
from scheduler.latency_model import roofline_model
from scheduler.policy_factory import PolicyChoice, make_policy
from scheduler.slo import SLO

TARGET_US = 1000.0


def observations(n: int, replicas: int, seed: int = 7) -> list[Observation]:
    """`n` observations cycling over `replicas`, five seconds apart per replica."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        in_flight = rng.randint(0, 16)
        out.append(
            Observation(
                t=(i // replicas) * 5.0,
                replica=f"r{i % replicas}",
                fresh=rng.random() > 0.02,
                chat_itl_p99_s=rng.choice([None, rng.uniform(0.01, 0.08)]),
                chat_ttft_p99_s=rng.uniform(0.1, 1.5),
                kv_usage=rng.uniform(0.1, 0.95),
                kv_capacity_tokens=500_000,
                preemptions=int(rng.random() < 0.02),
                running=in_flight + 100,
                chat_decoding=rng.randint(0, 150),
                chat_decode_context_tokens=rng.randint(0, 150) * 4000,
                batch_in_flight=tuple(
                    BatchInFlight(80_000, rng.randint(0, 80_000), 500) for _ in range(in_flight)
                ),
                step_time_ratio=rng.choice([None, rng.uniform(0.8, 1.4)]),
                window_s=60.0,
            )
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=20_000)
    parser.add_argument("--replicas", type=int, default=8)
    args = parser.parse_args()
    model = roofline_model("llama-3.1-70b", "h100-sxm", 2, "fp8", "fp8", efficiency=0.6)
    slo = SLO(chat_itl_p99_ms=50, chat_ttft_p99_ms=1000)
    controller = make_policy(PolicyChoice("slo"), slo, model, engine_slots=256)
    obs = observations(args.decisions, args.replicas)
    costs = []
    for o in obs:
        start = time.perf_counter()
        controller.decide(o)
        costs.append(time.perf_counter() - start)
    costs.sort()
    mean_us = 1e6 * sum(costs) / len(costs)
    p99_us = 1e6 * costs[int(0.99 * (len(costs) - 1))]
    print(f"decisions          {len(costs)} over {args.replicas} replicas")
    print(f"mean µs / decide   {mean_us:.1f}")
    print(f"p99  µs / decide   {p99_us:.1f}")
    print(f"max  µs / decide   {1e6 * costs[-1]:.1f}")
    ok = p99_us < TARGET_US
    print(f"target p99 < {TARGET_US:.0f} µs: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
