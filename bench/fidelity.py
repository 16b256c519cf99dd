"""Simulator fidelity: the same mixed workload on a real replica and in the simulator, compared.

    python -m bench.fidelity --engine-config engine_configs/cpu-small.yaml --target-ms 40 \\
        --duration 120 --json results/fidelity.json

1. Runs two minutes of production-shaped chat plus closed-loop long batch prompts on a real replica
   (`bench.fidelity_real`), with the engine plug-in holding batch to a fixed batch step target
   (`--target-ms`), or as stock vLLM without it.
2. Replays the same work in the simulator with the fitted latency model: every chat request at its
   real arrival time with its real prompt and output length (the shared system prompt as the common
   prefix), the same batch seats, prompt length and output length, and the same step target, which
   the simulated engine meets with the plug-in's own sizing function.
3. Compares chat ITL p99, chat TTFT p99 and batch tokens/s, as relative errors.

The host's speed. A fit is measured once, on one host at one hour; the host a check runs on may
be faster or slower by tens of percent (a shared machine, another CPU of the same kind). That is
the fit's error, not the simulator's, and the plug-in and the controller correct for it online
with one number, the measured over modelled step time. With the plug-in the real side reports that
number over the run (its status), and the replay runs its steps that much slower or faster than
the fit while its plug-in and controller are given the fit itself, as the real ones are
(`EngineParams.step_time_ratio`). The replay at the fit as it stands is reported beside it
(`sim_at_fit`); a stock run has no such number and is replayed at the fit.

The API server (HTTP, tokenization) adds to every time to first token what no engine step
shows: the mean of chat's client TTFT over the mean of the plug-in's in-engine TTFT, which the
replay adds before each request reaches its engine (`EngineParams.request_overhead_s`).

Steps of one price vary too (other processes on a shared host, caches), and that spread, not the
mean, makes chat's ITL p99. The real replica logs every step it runs (`STEP_LOG_ENV`); each of
its steps that carried a prefill chunk (the long steps that chat's gap tail and waits are made
of) gives its time over its price, over the mean of those, and the replay draws every step's
multiplier from their quantiles (`EngineParams.step_time_spread`).

Like for like. With the plug-in, ITL is chat's own: the plug-in's chat-only gaps on the real side,
the simulated chat gaps on the other, read through the same buckets (a p99 interpolated inside a
bucket is only as exact as the bucket). Stock, the real ITL is the engine's own histogram
(serving/engine_itl.py), which counts every decoding sequence, so the simulated ITL counts chat and
batch gaps too. TTFT is chat's, client-side on both. Batch tokens/s counts prompt and output
tokens of batch requests that ended within the run, divided by its length, on both sides.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np

from bench.fidelity_real import MixedWorkload, RealRun
from scheduler.records import RequestRecord, percentile
from serving.metrics import Histogram, histogram_quantile

TARGET = 0.15
"""Largest relative error the simulator may show on any compared figure."""


def replay_trace(run: RealRun):
    """The real chat requests as simulator trace rows: arrival, prompt and output lengths."""
    from simulator.trace import TraceRow

    rows = [
        TraceRow(r.t_submit - run.t0, r.prompt_tokens, max(1, r.output_tokens))
        for r in run.chat
        if r.prompt_tokens > 0
    ]
    return sorted(rows, key=lambda row: row.t_s)


def simulate_replay(
    workload: MixedWorkload,
    run: RealRun,
    engine_config: str,
    latency_model: str,
    target_ms: float | None = None,
    step_time_ratio: float = 1.0,
    step_time_spread: tuple[float, ...] = (),
    request_overhead_s: float = 0.0,
):
    """The simulator's run of the same work (with the plug-in at `target_ms` when given, else
    stock), its steps `step_time_ratio` times the fit's, each drawing a multiplier from
    `step_time_spread`, every request reaching the engine `request_overhead_s` after it was
    sent; returns its `SimResult`."""
    from scheduler.policy_factory import PolicyChoice, make_policy
    from serving.engine_profile import engine_params, load_profile, step_model
    from simulator.config import sim_config
    from simulator.run import simulate

    cfg = load_profile(Path(engine_config), [])
    model = step_model(cfg, Path(latency_model))
    sim_cfg = sim_config(
        cfg.name,
        engine={
            **engine_params(cfg),
            "step_time_ratio": step_time_ratio,
            "step_time_spread": step_time_spread,
            "request_overhead_s": request_overhead_s,
        },
        chat={"rate": 0.0, "trace_shared_prefix_tokens": workload.chat.shape.system_prompt_tokens},
        batch={
            "docs": 10_000,
            "doc_tokens": workload.doc_tokens,
            "mode": "whole",
            "summary_tokens": workload.output_tokens,
            "instruction_tokens": 0,
        },
        duration_s=workload.duration_s,
        seed=workload.seed,
        run_id="fidelity-sim",
    )
    if target_ms is None:
        choice = PolicyChoice("static", seats=workload.seats, chunk_tokens=workload.doc_tokens)
    else:
        choice = PolicyChoice("budget", seats=workload.seats, target_ms=target_ms)
    caps = make_policy(choice, sim_cfg.slo)
    return simulate(sim_cfg, model, lambda _replica: caps, replay_trace(run))


SPREAD_POINTS = 101
"""Quantiles of the step-time spread handed to the replay (every percentile)."""
MIN_SPREAD_STEPS = 50
"""Fewer steps with a prefill chunk than this give no spread: their quantiles would be noise."""


def step_spread(steps, model) -> tuple[float, ...]:
    """Quantiles of real step time over price, relative to their time-weighted mean, over the
    logged steps that carried a prefill chunk (module docstring); () with too few of them."""
    priced = [(s.seconds, model.step_seconds(s.batch)) for s in steps if s.batch.prefills]
    priced = [(sec, price) for sec, price in priced if price > 0 and sec > 0]
    if len(priced) < MIN_SPREAD_STEPS:
        return ()
    mean = sum(sec for sec, _ in priced) / sum(price for _, price in priced)
    ratios = np.array([sec / price / mean for sec, price in priced])
    return tuple(float(q) for q in np.quantile(ratios, np.linspace(0, 1, SPREAD_POINTS)))


def batch_tokens_per_s(records: list[RequestRecord], t0: float, duration_s: float) -> float:
    """Prompt + output tokens of batch requests that ended ok inside the run, per second."""
    total = sum(
        r.prompt_tokens + r.output_tokens
        for r in records
        if r.cls == "batch"
        and r.status == "ok"
        and r.t_end is not None
        and t0 <= r.t_end < t0 + duration_s
    )
    return total / duration_s


def bucketed_p99_ms(gaps: np.ndarray, bounds: tuple[float, ...]) -> float | None:
    """p99 of `gaps` read through histogram `bounds`, as the engine's exporter would report it."""
    cumulative = tuple(float(np.count_nonzero(gaps <= b)) for b in bounds)
    h = Histogram(bounds, cumulative, float(len(gaps)), float(gaps.sum()))
    v = histogram_quantile(h, 0.99)
    return None if v is None else v * 1000


def p99_ms(values: list[float]) -> float | None:
    return percentile(sorted(values), 99) * 1000 if values else None


def compare(real: dict[str, float | None], sim: dict[str, float | None]) -> dict:
    """Relative error of each simulated figure against the real one, and whether all are within
    `TARGET`."""
    errors = {
        k: (None if real[k] in (None, 0) or sim[k] is None else (sim[k] - real[k]) / real[k])
        for k in real
    }
    return {
        "real": real,
        "sim": sim,
        "relative_error": errors,
        "target": TARGET,
        "within_target": all(e is not None and abs(e) <= TARGET for e in errors.values()),
    }


def figures_real(run: RealRun, duration_s: float) -> tuple[dict, tuple[float, ...]]:
    """The real figures, and the bucket bounds the ITL p99 was read through: the plug-in's
    chat-only gaps when the run kept them, else the engine's class-blind histogram."""
    h = run.chat_itl if run.chat_itl is not None else run.engine_itl.window(run.t0, run.t1)
    if h is None:
        raise RuntimeError("no ITL histogram was scraped from the replica; is /metrics served?")
    itl = histogram_quantile(h, 0.99)
    ok = [r for r in run.chat if r.status == "ok" and r.ttft_s is not None]
    return {
        "chat_itl_p99_ms": None if itl is None else itl * 1000,
        "chat_ttft_p99_ms": p99_ms([r.ttft_s for r in ok]),
        "batch_tokens_per_s": batch_tokens_per_s(run.batch, run.t0, duration_s),
    }, h.bounds


def figures_sim(
    result, bounds: tuple[float, ...], duration_s: float, chat_only_itl: bool = False
) -> dict:
    """The simulated figures; ITL through `bounds`, of chat's gaps alone when `chat_only_itl`
    (to match the plug-in's), else of every decoding request's (to match vLLM's histogram)."""
    rec = result.sim.recorder
    classes = ("chat",) if chat_only_itl else ("chat", "batch")
    gaps = np.concatenate([rec.class_gaps(c)[0] for c in classes])
    ok = [r for r in rec.records if r.cls == "chat" and r.status == "ok" and r.ttft_s is not None]
    return {
        "chat_itl_p99_ms": bucketed_p99_ms(gaps, bounds),
        "chat_ttft_p99_ms": p99_ms([r.ttft_s for r in ok]),
        "batch_tokens_per_s": batch_tokens_per_s(rec.records, 0.0, duration_s),
    }


def write_records(directory: Path, run: RealRun, result) -> None:
    """Both sides' request rows as JSON lines, times relative to the start of the run."""
    directory.mkdir(parents=True, exist_ok=True)
    sides = {"real": (run.chat + run.batch, run.t0), "sim": (result.sim.recorder.records, 0.0)}
    for side, (records, t0) in sides.items():
        with (directory / f"{side}.jsonl").open("w") as fh:
            for r in records:
                row = r.row()
                for key in ("t_submit", "t_first_token", "t_end"):
                    row[key] = None if row[key] is None else row[key] - t0
                fh.write(json.dumps(row) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine-config", default="engine_configs/cpu-small.yaml")
    parser.add_argument(
        "--latency-model",
        default=None,
        help="fitted model (default engine_configs/fits/<config name>.json)",
    )
    parser.add_argument("--duration", type=float, default=120.0)
    parser.add_argument("--rate", type=float, default=1.5, help="chat requests per second")
    parser.add_argument("--scale", type=float, default=0.1, help="chat token sizes x this")
    parser.add_argument("--seats", type=int, default=2)
    parser.add_argument(
        "--target-ms",
        type=float,
        default=None,
        help="the engine plug-in at this fixed batch step target on both sides (default: stock)",
    )
    parser.add_argument("--doc-tokens", type=int, default=6000)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--warmup", type=float, default=30.0, help="unmeasured seconds first")
    parser.add_argument("--port", type=int, default=8650)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=Path("results/fidelity.json"))
    parser.add_argument(
        "--records",
        type=Path,
        default=None,
        help="also write both sides' request records here (real.jsonl, sim.jsonl)",
    )
    args = parser.parse_args(argv)

    from bench.chat_load import ChatLoadSpec
    from bench.chat_sessions import ChatShape
    from bench.fidelity_real import run_real
    from scheduler.latency_model import LatencyModel
    from serving.engine_config import load_engine_config
    from serving.engine_site.step_log import STEP_LOG_ENV
    from serving.launcher import ReplicaSet
    from serving.replica_targets import fit_path
    from serving.tokenizer import tokenizer_for

    config = load_engine_config(args.engine_config)
    fit = args.latency_model or str(fit_path(args.engine_config, config))
    if args.target_ms is not None and not args.target_ms > 0:
        print(f"--target-ms {args.target_ms}: a batch step target must be > 0 ms", file=sys.stderr)
        return 2
    if args.target_ms is not None and config.flag("scheduler-cls") is None:
        print(
            f"--target-ms: {args.engine_config} does not select the engine plug-in "
            "(scheduler-cls); drop --target-ms for a stock run",
            file=sys.stderr,
        )
        return 2
    if not Path(fit).is_file():
        print(
            f"no latency model at {fit}: fit one with `nightshift calibrate --engine-config "
            f"{args.engine_config} --out {fit}`",
            file=sys.stderr,
        )
        return 2
    workload = MixedWorkload(
        chat=ChatLoadSpec(
            shape=ChatShape().scaled(args.scale),
            rate=args.rate,
            seed=args.seed,
            context_limit=int(config.flag("max-model-len", 32768)),
        ),
        duration_s=args.duration,
        seats=args.seats,
        doc_tokens=args.doc_tokens,
        output_tokens=args.output_tokens,
        seed=args.seed,
        warmup_s=args.warmup,
    )
    tokenizer = tokenizer_for(config)
    step_log = args.json.with_suffix(".steps.jsonl").resolve()
    step_log.parent.mkdir(parents=True, exist_ok=True)
    step_log.unlink(missing_ok=True)
    env = {STEP_LOG_ENV: str(step_log)}
    replicas = ReplicaSet(Path("results/engines"))
    with replicas.running(config, args.engine_config, args.port, extra_env=env) as r:
        steering = "stock" if args.target_ms is None else f"plug-in at {args.target_ms:g} ms"
        print(
            f"real: {args.duration:.0f} s of chat at {args.rate}/s + {args.seats} batch "
            f"prompts of {args.doc_tokens} tokens on {r[0].base_url} ({steering})",
            flush=True,
        )
        status = None
        if args.target_ms is not None:
            status = _steer(r[0], args.target_ms, Path(fit), args.warmup + args.duration + 600)
        run = run_real(
            workload, (r[0].name, r[0].base_url), config.model.served_name, tokenizer, status,
            step_log,
        )  # fmt: skip
    if args.target_ms is not None and run.chat_itl is None:
        print("the plug-in wrote no status: is it loaded (scheduler-cls)?", file=sys.stderr)
        return 1
    real, bounds = figures_real(run, args.duration)
    chat_only = args.target_ms is not None
    ratio = run.step_time_ratio or 1.0
    spread = step_spread(run.steps, LatencyModel.from_json(fit))
    overhead = run.request_overhead_s or 0.0
    result = simulate_replay(
        workload, run, args.engine_config, fit, args.target_ms, ratio, spread, overhead
    )
    at_fit = simulate_replay(workload, run, args.engine_config, fit, args.target_ms)
    out = compare(real, figures_sim(result, bounds, args.duration, chat_only))
    out.update(
        command="python -m bench.fidelity " + " ".join(argv or sys.argv[1:]),
        latency_model=fit,
        step_time_ratio=run.step_time_ratio,
        step_time_spread={f"p{p}": spread[p] for p in (1, 50, 90, 99)} if spread else None,
        steps_logged=len(run.steps),
        request_overhead_ms=None
        if run.request_overhead_s is None
        else run.request_overhead_s * 1e3,
        sim_at_fit=figures_sim(at_fit, bounds, args.duration, chat_only),
        batch_step_target_ms=args.target_ms,
        itl="chat's own gaps (plug-in)" if chat_only else "every sequence's (vLLM histogram)",
        workload={**asdict(workload), "chat": None},
        chat_requests=len(run.chat),
        batch_requests=len(run.batch),
        client_itl_p99_ms=p99_ms([g.gap_s for r in run.chat for g in r.gaps]),
        sim_wall_seconds=result.summary["wall_seconds"],
    )
    if args.records is not None:
        write_records(args.records, run, result)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    _print(out)
    return 0


def _steer(replica, target_ms: float, fit: Path, ttl_s: float):
    """Hold `replica`'s batch to `target_ms` for `ttl_s`; returns its status reader."""
    from scheduler.latency_model import LatencyModel
    from serving import engine_control

    target = engine_control.ControlTarget(replica.name, folder=replica.control_dir)
    model = LatencyModel.from_json(fit)
    doc = engine_control.decision_document(engine_control.next_seq(), target_ms, model, ttl_s)
    engine_control.send(target, doc)
    return lambda: engine_control.read_status(target)


def _print(out: dict) -> None:
    ratio = out["step_time_ratio"]
    if ratio is not None:
        print(f"steps here took {ratio:.2f}x the fit's time (plug-in status); replayed so")
    overhead = out["request_overhead_ms"]
    if overhead is not None:
        print(f"chat TTFT at the client over inside the engine: +{overhead:.1f} ms; replayed so")
    spread = out["step_time_spread"]
    if spread:
        print(
            f"step time over its mean, steps with a prefill chunk: p50 {spread['p50']:.2f}, "
            f"p90 {spread['p90']:.2f}, p99 {spread['p99']:.2f} (step log); replayed so"
        )
    print(f"{'figure':<22}{'real':>12}{'sim':>12}{'error':>9}{'at fit':>12}")
    for k, real in out["real"].items():
        sim, err = out["sim"][k], out["relative_error"][k]
        at_fit = out["sim_at_fit"][k]
        print(
            f"{k:<22}{_f(real):>12}{_f(sim):>12}{'' if err is None else f'{err:+.0%}':>9}"
            f"{_f(at_fit):>12}"
        )
    verdict = "within" if out["within_target"] else "NOT within"
    print(f"{verdict} ±{out['target']:.0%} on every figure; JSON: written")


def _f(v: float | None) -> str:
    return "–" if v is None else f"{v:,.1f}"


if __name__ == "__main__":
    raise SystemExit(main())
