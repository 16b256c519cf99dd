"""The SLO controller against the issue's targets, in the simulator at 70B FP8 / 2×H100 (issue 4).

Targets: with chat ITL p99 ≤ 50 ms and TTFT p99 ≤ 1 s as the SLO and a backlog of 80k-token
documents, the controller (1) holds both in ≥ 99% of 1-minute windows, (2) reaches ≥ 85% of the
batch throughput of the best static caps that also hold them, chosen in hindsight from a sweep of
seats × chunk under steady Poisson chat, and (3) beats that static choice by ≥ 1.3× under a chat
trace whose rate swings 3.3× over the run (bench/varying_trace.py). The static caps best for the
varying trace in hindsight are reported beside it, for honesty.

Every policy sees the same seeds, engine profile and control loop: decisions every 2 s from a 20 s
sensor window (a p99 needs ~100 samples to mean anything), map-reduce sections as the pipeline
sends them, and the backlog arriving after a minute of chat (the nightly job starts while chat
runs). Windows met and tokens/s are pooled over seeds.

The margin is thin at the issue's 5 chat requests/s: under the 272-token step budget the ITL SLO
needs, chat sessions alone reach TTFT p99 ~0.8 s in some minutes, so any batch work can tip a
minute over, and one window in 60 is the difference between 98.3% and 100%. Read the windows
figure with its sample size; `--chat-rate 4.5` shows the same comparison with more room.

Shorter runs than the issue's hour keep this within a few minutes on two cores (~100-300 simulated
seconds per wall second per process): 15 simulated minutes × 4 seeds by default, 60 windows per
policy. Fewer windows flatter the sweep: the static caps that look best in hindsight are often the
luckiest (6×2048 met 100% of 30 windows, then 91% of 120).

    .venv/bin/python -m bench.controller_targets [--minutes 15] [--seeds 0,1] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench.varying_trace import TraceShape, generate

PROFILE = Path(__file__).resolve().parents[1] / "engine_configs" / "h100x2-llama-3.1-70b-fp8.yaml"
SEATS = (1, 2, 3, 4, 6)
CHUNKS = (2048, 4096)
"""Sections of 1024 were never better in trials: they lose to 2048 on throughput and on TTFT alike
(a longer reduce prompt)."""
WINDOWS_TARGET, STEADY_TARGET, VARYING_TARGET = 0.99, 0.85, 1.3
MAP_MIN_SECTION = 1024
"""Shortest map-reduce section the controller cuts: below it the reduce prompt (one summary per
section) grows longer than the sections it saves, and blocks chat for longer."""


@dataclass(frozen=True)
class Job:
    """One simulated run: a policy under one load and seed."""

    scenario: str  # "steady" or "varying"
    policy: str  # "chat-only", "slo" or "static SxC"
    seed: int
    minutes: float
    chat_rate: float
    docs: int


def run_job(job: Job) -> dict:
    """Simulate `job` and return its figures (runs in a worker process)."""
    from flows.cli_simulate import engine_params, load_profile, sim_config, step_model
    from simulator.run import simulate

    profile = load_profile(PROFILE, [])
    model = step_model(profile, None)
    trace = None
    chat: dict = {"rate": job.chat_rate}
    if job.scenario == "varying":
        shape = TraceShape(job.minutes * 60, seed=job.seed)
        trace = generate(shape)
        chat = {"trace": "generated", "trace_shared_prefix_tokens": shape.shared_prefix_tokens}
    cfg = sim_config(
        profile,
        engine=engine_params(profile),
        chat=chat,
        batch={"docs": 0 if job.policy == "chat-only" else job.docs, "start_s": 60.0},
        control={"interval_s": 2.0, "observe_window_s": 20.0},
        slo={"chat_itl_p99_ms": 50.0, "chat_ttft_p99_ms": 1000.0},
        duration_s=job.minutes * 60,
        seed=job.seed,
    )
    policy = _policy(job.policy, cfg.slo, model, profile.vllm)
    s = simulate(cfg, model, lambda _replica: policy, trace).summary
    return {
        "scenario": job.scenario,
        "policy": job.policy,
        "seed": job.seed,
        "windows": round(s["sim_seconds"] / 60),
        "slo_windows_met": s["chat"]["slo_windows_met"],
        "itl_p99_ms": s["chat"]["itl_ms"]["p99"],
        "ttft_p99_ms": s["chat"]["ttft_ms"]["p99"],
        "batch_tokens_per_s": s["batch"]["tokens_per_s"],
        "goodput_tokens_per_s": s["batch"]["goodput_tokens_per_s"],
        "docs_done": s["batch"]["docs_done"],
        "wall_s": s["wall_seconds"],
    }


def _policy(name: str, slo, model, flags):
    from scheduler.admission import StaticCaps
    from scheduler.controller import ControllerConfig, SLOController, engine_step_tokens

    if name.startswith("static"):
        seats, chunk = (int(x) for x in name.split()[1].split("x"))
        return StaticCaps(seats, chunk)
    if name == "chat-only":
        return StaticCaps(0, 1)
    config = ControllerConfig(
        engine_step_tokens=engine_step_tokens(flags),
        min_chunk_tokens=MAP_MIN_SECTION,
        cold_start_chunk_tokens=MAP_MIN_SECTION,
    )
    return SLOController(slo, model, config)


def jobs(args: argparse.Namespace) -> list[Job]:
    statics = [f"static {s}x{c}" for s in SEATS for c in CHUNKS]
    policies = ["chat-only", "slo", *statics]
    return [
        Job(scenario, policy, seed, args.minutes, args.chat_rate, args.docs)
        for scenario in ("steady", "varying")
        for policy in policies
        for seed in args.seeds
    ]


def pool(runs: list[dict]) -> dict[tuple[str, str], dict]:
    """Figures per (scenario, policy), pooled over seeds: windows met over all windows, means."""
    out: dict[tuple[str, str], dict] = {}
    for key in sorted({(r["scenario"], r["policy"]) for r in runs}):
        rs = [r for r in runs if (r["scenario"], r["policy"]) == key]
        windows = sum(r["windows"] for r in rs)
        mean = {k: sum(r[k] for r in rs) / len(rs) for k in _MEANS}
        met = sum(r["slo_windows_met"] * r["windows"] for r in rs) / windows
        out[key] = {"scenario": key[0], "policy": key[1], "windows": windows,
                    "slo_windows_met": met, **mean}  # fmt: skip
    return out


_MEANS = ("itl_p99_ms", "ttft_p99_ms", "batch_tokens_per_s", "goodput_tokens_per_s", "docs_done")


def best_static(pooled: dict, scenario: str) -> dict | None:
    """The static caps with the most batch tokens/s among those holding the SLO in ≥ 99% of
    windows; None when none does."""
    holding = [
        v
        for (sc, policy), v in pooled.items()
        if sc == scenario and policy.startswith("static")
        and v["slo_windows_met"] >= WINDOWS_TARGET - 1e-9
    ]  # fmt: skip
    return max(holding, key=lambda v: v["batch_tokens_per_s"], default=None)


def targets(pooled: dict) -> dict:
    """The three targets, with the figures each is judged on."""
    slo_steady, slo_varying = pooled[("steady", "slo")], pooled[("varying", "slo")]
    chosen = best_static(pooled, "steady")
    hindsight = best_static(pooled, "varying")
    out = {
        "static_chosen": chosen and chosen["policy"],
        "static_best_for_varying": hindsight and hindsight["policy"],
        "windows_met_steady": slo_steady["slo_windows_met"],
        "windows_met_varying": slo_varying["slo_windows_met"],
        "windows_ok": min(slo_steady["slo_windows_met"], slo_varying["slo_windows_met"])
        >= WINDOWS_TARGET - 1e-9,
    }
    if chosen is not None:
        same_on_trace = pooled[("varying", chosen["policy"])]
        out["steady_ratio"] = _ratio(slo_steady, chosen)
        out["varying_ratio"] = _ratio(slo_varying, same_on_trace)
        out["varying_static_windows_met"] = same_on_trace["slo_windows_met"]
        out["steady_ok"] = out["steady_ratio"] >= STEADY_TARGET
        out["varying_ok"] = out["varying_ratio"] >= VARYING_TARGET
    if hindsight is not None:
        out["varying_ratio_to_hindsight"] = _ratio(slo_varying, hindsight)
    return out


def _ratio(a: dict, b: dict) -> float:
    return a["batch_tokens_per_s"] / max(b["batch_tokens_per_s"], 1e-9)


def print_report(pooled: dict, result: dict, args: argparse.Namespace) -> None:
    print(
        f"70B FP8 / 2xH100, chat {args.chat_rate} req/s steady | trace "
        f"{TraceShape.low_rps}-{TraceShape.high_rps} req/s; {args.minutes:g} min x seeds "
        f"{','.join(map(str, args.seeds))}; SLO ITL p99 50 ms, TTFT p99 1 s"
    )
    print(
        f"{'scenario':8} {'policy':14} {'windows':>8} {'ITL p99':>8} {'TTFT p99':>9} "
        f"{'batch tok/s':>12} {'goodput':>8} {'docs':>5}"
    )
    for v in pooled.values():
        print(
            f"{v['scenario']:8} {v['policy']:14} {100 * v['slo_windows_met']:7.1f}% "
            f"{v['itl_p99_ms']:6.1f}ms {v['ttft_p99_ms']:7.0f}ms {v['batch_tokens_per_s']:12,.0f} "
            f"{v['goodput_tokens_per_s']:8,.0f} {v['docs_done']:5.1f}"
        )
    _print_targets(result)


def _print_targets(r: dict) -> None:
    def verdict(ok: bool | None) -> str:
        return "n/a" if ok is None else ("PASS" if ok else "FAIL")

    print(
        f"static chosen under steady load (best holding >= 99%): {r['static_chosen']}; "
        f"best for the varying trace in hindsight: {r['static_best_for_varying']}"
    )
    print(
        f"[{verdict(r['windows_ok'])}] controller windows met: steady "
        f"{100 * r['windows_met_steady']:.1f}%, varying {100 * r['windows_met_varying']:.1f}% "
        f"(target >= {100 * WINDOWS_TARGET:.0f}%)"
    )
    if "steady_ratio" in r:
        print(
            f"[{verdict(r['steady_ok'])}] steady: controller / chosen static batch tokens/s = "
            f"{r['steady_ratio']:.2f} (target >= {STEADY_TARGET})"
        )
        print(
            f"[{verdict(r['varying_ok'])}] varying: controller / chosen static = "
            f"{r['varying_ratio']:.2f} (target >= {VARYING_TARGET}; that static met "
            f"{100 * r['varying_static_windows_met']:.1f}% of windows there)"
        )
    else:
        print("[FAIL] no static caps held the SLO in 99% of windows under steady load")
    if "varying_ratio_to_hindsight" in r:
        print(
            f"       varying: controller / best static in hindsight = "
            f"{r['varying_ratio_to_hindsight']:.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.minutes <= 1 or args.chat_rate <= 0 or not args.seeds:
        print("error: need --minutes > 1, --chat-rate > 0 and at least one seed", file=sys.stderr)
        return 2
    started = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as ex:
        runs = list(ex.map(run_job, jobs(args)))
    pooled = pool(runs)
    result = targets(pooled)
    print_report(pooled, result, args)
    print(f"{len(runs)} runs in {time.perf_counter() - started:.0f} s wall")
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k != "json"}
        doc = {"settings": settings, "targets": result, "pooled": list(pooled.values()),
               "runs": runs}  # fmt: skip
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


def _seeds(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=15.0, help="Simulated minutes per run.")
    p.add_argument("--seeds", type=_seeds, default=[0, 1, 2, 3], help="Comma-separated seeds.")
    p.add_argument("--chat-rate", type=float, default=5.0, help="Steady chat requests/s.")
    p.add_argument("--docs", type=int, default=300, help="80k-token documents in the backlog.")
    p.add_argument("--jobs", type=int, default=2, help="Simulations run in parallel.")
    p.add_argument("--json", type=Path, help="Write settings, runs and targets here.")
    return p


if __name__ == "__main__":
    sys.exit(main())
