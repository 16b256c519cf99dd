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
needs, chat sessions alone reach TTFT p99 ~0.9 s in some minutes, so any batch work can tip a
minute over, and one window in 240 is the difference between 99.2% and 99.6%. Read the windows
figure with its sample size, and with the list of the controller's missed windows printed under
it: a miss with no batch prefill ahead of its slowest chat was a chat burst, or a long chat history
evicted from the prefix cache (which batch churn makes likelier), not a prompt the controller let
in ahead of chat. No static caps of the sweep hold 99% of the windows there; targets (2) and (3)
are then judged against the static caps that met the most windows (stricter than the trivially
holding "no batch at all"), and the report says so.

The issue's hour takes ~16 minutes on two idle cores with `--jobs 1` (~100-300 simulated seconds
per wall second per process); 15 simulated minutes × 4 seeds, the default, takes ~3. Fewer windows
flatter the sweep: the static caps that look best in hindsight are often the luckiest (6×2048 met
100% of 30 windows, then 91% of 120).

    .venv/bin/python -m bench.controller_targets --minutes 60 --jobs 1 --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

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
    result = simulate(cfg, model, lambda _replica: policy, trace)
    s = result.summary
    return {
        "scenario": job.scenario,
        "policy": job.policy,
        "seed": job.seed,
        "windows": round(s["sim_seconds"] / 60),
        "slo_windows_met": s["chat"]["slo_windows_met"],
        "itl_p99_ms": s["chat"]["itl_ms"]["p99"],
        "ttft_p99_ms": s["chat"]["ttft_ms"]["p99"],
        "batch_tokens_per_s": s["batch"]["tokens_per_s"],
        "slo_batch_tokens_per_s": s["batch"]["slo_batch_tokens_per_s"],
        "docs_done": s["batch"]["docs_done"],
        "wall_s": s["wall_seconds"],
        "missed": missed_windows(result) if job.policy == "slo" else [],
    }


def missed_windows(result) -> list[dict]:
    """The 1-minute windows whose chat ITL or TTFT p99 broke the SLO, each with what to look at
    first: its slowest chat, the batch prompt tokens that chat waited behind (prefills that had
    started before its first token and ran on after its arrival), and the decision in force when
    it arrived. Windows counted as in the run summary, but for failed or cancelled chat."""
    rec, slo = result.sim.recorder, result.sim.cfg.slo
    gaps, gap_t = rec.class_gaps("chat")
    chat = [r for r in rec.records if r.cls == "chat" and r.ttft_s is not None]
    batch = [r for r in rec.records if r.cls == "batch" and r.t_first_token is not None]
    out = []
    for w in range(round(result.sim.cfg.duration_s / 60)):
        lo, hi = 60.0 * w, 60.0 * (w + 1)
        in_w = gaps[(gap_t >= lo) & (gap_t < hi)]
        firsts = [r for r in chat if lo <= r.t_first_token < hi]
        itl = float(np.percentile(in_w, 99)) * 1000 if len(in_w) else 0.0
        ttft = float(np.percentile([r.ttft_s for r in firsts], 99)) * 1000 if firsts else 0.0
        if itl <= slo.chat_itl_p99_ms and ttft <= slo.chat_ttft_p99_ms:
            continue
        worst = max(firsts, key=lambda r: r.ttft_s)
        ahead = [b for b in batch if b.t_submit <= worst.t_first_token
                 and b.t_first_token >= worst.t_submit]  # fmt: skip
        d = max((d for d in rec.decisions if d["t"] <= worst.t_submit), key=lambda d: d["t"])
        out.append({"window": w, "itl_p99_ms": itl, "ttft_p99_ms": ttft,
                    "worst_ttft_s": worst.ttft_s, "batch_ahead_tokens":
                    sum(b.prompt_tokens for b in ahead), "reason": d["reason"],
                    "seats": d["batch_seats"], "chunk": d["chunk_tokens"], "pause": d["pause"]})  # fmt: skip
    return out


def _policy(name: str, slo, model, flags):
    from scheduler.admission import StaticCaps
    from scheduler.budget_controller import BudgetController

    if name.startswith("static"):
        seats, chunk = (int(x) for x in name.split()[1].split("x"))
        return StaticCaps(seats, chunk)
    if name == "chat-only":
        return StaticCaps(0, 1)
    slots = flags.get("max-num-seqs")
    return BudgetController(slo, model, engine_slots=int(slots) if slots else None)


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


_MEANS = ("itl_p99_ms", "ttft_p99_ms", "batch_tokens_per_s", "slo_batch_tokens_per_s", "docs_done")


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


def closest_static(pooled: dict, scenario: str) -> dict:
    """The static caps that met the most windows (then the most batch tokens/s): the reference
    when none holds the SLO, stricter than the chat-only run that holds it with no batch at all."""
    statics = [v for (sc, p), v in pooled.items() if sc == scenario and p.startswith("static")]
    return max(statics, key=lambda v: (v["slo_windows_met"], v["batch_tokens_per_s"]))


def targets(pooled: dict) -> dict:
    """The three targets, with the figures each is judged on."""
    slo_steady, slo_varying = pooled[("steady", "slo")], pooled[("varying", "slo")]
    chosen = best_static(pooled, "steady")
    holds = chosen is not None
    if not holds:
        chosen = closest_static(pooled, "steady")
    hindsight = best_static(pooled, "varying")
    out = {
        "static_holds": holds,
        "static_windows_met": chosen["slo_windows_met"],
        "static_chosen": chosen["policy"],
        "static_best_for_varying": hindsight and hindsight["policy"],
        "windows_met_steady": slo_steady["slo_windows_met"],
        "windows_met_varying": slo_varying["slo_windows_met"],
        "windows_ok": min(slo_steady["slo_windows_met"], slo_varying["slo_windows_met"])
        >= WINDOWS_TARGET - 1e-9,
    }
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
            f"{v['slo_batch_tokens_per_s']:8,.0f} {v['docs_done']:5.1f}"
        )
    _print_targets(result)


def _print_targets(r: dict) -> None:
    def verdict(ok: bool | None) -> str:
        return "n/a" if ok is None else ("PASS" if ok else "FAIL")

    if r["static_holds"]:
        chosen = f"{r['static_chosen']} (best holding >= 99%)"
    else:
        chosen = (
            f"none held >= 99%; compared with the closest, {r['static_chosen']} "
            f"({100 * r['static_windows_met']:.1f}% of windows)"
        )
    print(
        f"static chosen under steady load: {chosen}; best for the varying trace in hindsight: "
        f"{r['static_best_for_varying']}"
    )
    print(
        f"[{verdict(r['windows_ok'])}] controller windows met: steady "
        f"{100 * r['windows_met_steady']:.1f}%, varying {100 * r['windows_met_varying']:.1f}% "
        f"(target >= {100 * WINDOWS_TARGET:.0f}%)"
    )
    print(
        f"[{verdict(r['steady_ok'])}] steady: controller / chosen static batch tokens/s = "
        f"{r['steady_ratio']:.2f} (target >= {STEADY_TARGET})"
    )
    print(
        f"[{verdict(r['varying_ok'])}] varying: controller / chosen static = "
        f"{r['varying_ratio']:.2f} (target >= {VARYING_TARGET}; that static met "
        f"{100 * r['varying_static_windows_met']:.1f}% of windows there)"
    )
    if "varying_ratio_to_hindsight" in r:
        print(
            f"       varying: controller / best static in hindsight = "
            f"{r['varying_ratio_to_hindsight']:.2f}"
        )


def print_misses(runs: list[dict]) -> None:
    """The controller's missed windows, and how many of them had batch prefill ahead of their
    slowest chat: the others chat broke by itself (bursts, a history evicted from the cache)."""
    misses = [(r["scenario"], r["seed"], m) for r in runs for m in r["missed"]]
    behind = sum(1 for *_, m in misses if m["batch_ahead_tokens"])
    print(f"controller missed {len(misses)} windows, {behind} with batch prefill ahead of the "
          f"slowest chat{'; decision in force when it arrived:' if misses else ''}")  # fmt: skip
    for scenario, seed, m in misses:
        print(
            f"  {scenario} seed {seed} minute {m['window']}: ITL p99 {m['itl_p99_ms']:.1f} ms, "
            f"TTFT p99 {m['ttft_p99_ms']:.0f} ms; slowest chat {m['worst_ttft_s']:.2f} s behind "
            f"{m['batch_ahead_tokens']} batch tokens; {m['reason']} {m['seats']} seats x "
            f"{m['chunk']}{' paused' if m['pause'] else ''}"
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
    print_misses(runs)
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
