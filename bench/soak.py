"""A night's soak: one cpu-small replica shared by varying chat and `nightshift run --policy slo`,
with the fault cases injected on a schedule, and what the night kept at its end.

It starts a replica tied to this process, a real Prometheus scraping it, a corpus that outlasts
the night and a chat trace whose rate swings twice over it (`bench.varying_trace`); runs
`nightshift chat-load` and `nightshift run` (deadline: the end of the night) as subprocesses;
injects each fault at its fraction of the night (`bench.soak_plan`, `bench.soak_faults`); samples
every long-lived process's resident memory once the first summary is in and again just before
the deadline. Then it reports documents done, failed, lost and duplicated (`bench.soak_report`
defines them), chat SLO windows held, memory per role from start to end, and each fault with its
outcome, into `OUT/soak.json` and a short table. Exit status 1 when a document was lost or
duplicated or a judged role's memory per process grew more than 10% (`bench.soak_memory`);
130/143 when interrupted (the report is still written). Everything it starts it stops, on every
way out (`bench.soak_night`).

    PYTHONPATH=. .venv/bin/python -m bench.soak --minutes 120 [--out DIR] [--docs N] [--seed S]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import traceback
from pathlib import Path

from bench import soak_processes as procs
from bench.soak_night import Night
from bench.soak_plan import (
    CHAT_TAIL_S,
    DOCS_PER_MINUTE,
    MEMORY_EVERY_S,
    MIN_MINUTES,
    deadline_hhmm,
    default_docs,
    end_sample_at,
    engine_config_for,
    fault_ready,
    fault_schedule,
    night_deadline,
)
from bench.soak_report import format_report
from bench.soak_steps import (
    POLL_S,
    NightLog,
    end_night,
    fault,
    keep_going,
    not_injected,
    start_chat,
    take_series_sample,
    take_start_sample,
)
from bench.soak_tables import SummaryWatch, build_report, sample_memory
from serving.paths import REPO_ROOT


class Interrupted(BaseException):
    """SIGINT or SIGTERM reached the soak: a BaseException, like KeyboardInterrupt, so that no
    `except Exception` on the way swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=120.0, help="Length of the night.")
    p.add_argument(
        "--engine-config",
        type=Path,
        default=None,
        help="Default: cpu-small, or cpu-small-fp32 on a CPU without native bf16.",
    )
    p.add_argument("--out", type=Path, default=None, help="Default: results/soak/<timestamp>.")
    p.add_argument(
        "--docs", type=int, default=None, help=f"Corpus size; default: {DOCS_PER_MINUTE} a minute."
    )
    p.add_argument("--min-tokens", type=int, default=600, help="Shortest document.")
    p.add_argument("--max-tokens", type=int, default=2400, help="Longest document.")
    p.add_argument("--chat-low-rps", type=float, default=0.5, help="Chat rate at its lowest.")
    p.add_argument("--chat-high-rps", type=float, default=2.0, help="Chat rate at its peak.")
    p.add_argument("--itl-slo-ms", type=float, default=None, help="Chat ITL p99 SLO of the run.")
    p.add_argument("--ttft-slo-ms", type=float, default=None, help="Chat TTFT p99 SLO.")
    p.add_argument(
        "--drain-s",
        type=float,
        default=300.0,
        help="How long the run may take to end after its deadline.",
    )
    p.add_argument("--seed", type=int, default=0, help="Seed of the corpus and the chat trace.")
    return p.parse_args(argv)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.minutes < MIN_MINUTES:
        print(f"error: --minutes must be at least {MIN_MINUTES:g}", file=sys.stderr)
        return 2
    from serving.cpu_features import cpu_flags, lacks_native_bf16
    from serving.engine_config import load_engine_config

    # Absolute: the night's subprocesses run in the repository, wherever the soak was started.
    config_path = args.engine_config or REPO_ROOT / engine_config_for(
        lacks_native_bf16(cpu_flags())
    )
    config_path = config_path.resolve()
    config = load_engine_config(config_path)
    out = (args.out or Path("results/soak") / time.strftime("%Y%m%d-%H%M%S")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    run_id = time.strftime("soak-%Y%m%d-%H%M%S")
    slo = {"--itl-slo-ms": args.itl_slo_ms, "--ttft-slo-ms": args.ttft_slo_ms}
    options = [f"{flag}={value:g}" for flag, value in slo.items() if value is not None]
    night, log = Night(out, config, config_path, run_id, options), NightLog()
    procs.become_subreaper()
    code = 0

    def interrupted(signum, _frame) -> None:
        raise Interrupted(signum)

    previous = {s: signal.signal(s, interrupted) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        watch = SummaryWatch(night.run_dir)
        run_night(night, log, args, watch)
    except Interrupted as exc:
        print(f"\n{exc}: stopping the night", file=sys.stderr)
        code = 128 + exc.signum
        log.event(f"interrupted by {exc}")
    except Exception as exc:  # stopped like the rest; the report says how far it got
        traceback.print_exc()
        code = 1
        log.event(f"error: {type(exc).__name__}: {exc}"[:300])
    finally:
        for s in previous:
            signal.signal(s, signal.SIG_IGN)  # nothing cuts the clean-up short
        left = night.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    if not night.run_dir.is_dir():
        print("no run was recorded; nothing to report", file=sys.stderr)
        return code or 1
    try:
        report = build_report(night, log, watch, args, left, interrupted=bool(code))
    except Exception:
        traceback.print_exc()
        print("the night's tables could not be read; no report", file=sys.stderr)
        return code or 1
    (out / "soak.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(format_report(report))
    print(f"wrote {out / 'soak.json'}")
    return code or (1 if report["failures"] else 0)


def run_night(night: Night, log: NightLog, args: argparse.Namespace, watch: SummaryWatch) -> None:
    """Set the night up, run it to its deadline with the faults, and let the run end."""
    from pipelines.corpus_maker import CorpusSpec, make_corpus, write_corpus
    from serving.launcher import free_port
    from serving.tokenizer import tokenizer_for

    log.t0 = time.time()
    docs = args.docs or default_docs(args.minutes)
    spec = CorpusSpec(docs=docs, min_tokens=args.min_tokens, max_tokens=args.max_tokens,
                      seed=args.seed)  # fmt: skip
    night.corpus = write_corpus(make_corpus(spec, tokenizer_for(night.config)),
                                night.out / "corpus.parquet")  # fmt: skip
    log.event(f"corpus: {docs} documents of {args.min_tokens}-{args.max_tokens} tokens")
    replica = night.start_replica(free_port())
    log.event(f"replica {replica.name} at {replica.base_url} ({replica.pid})")
    log.event(f"prometheus at {night.start_prometheus()} ({night.prometheus.pid})")
    log.deadline_ts = night_deadline(time.time(), args.minutes)
    night.deadline_hhmm = deadline_hhmm(log.deadline_ts)
    log.t0 = time.time()
    night.start_run("the night starts")
    until = time.time() + 300
    while not (night.run_dir / "run.json").is_file() and not night.run_ended():
        if time.time() > until:
            raise RuntimeError(f"the run wrote no run.json in 300 s; see {night.run.log}")
        time.sleep(0.5)
    duration = log.deadline_ts - log.t0
    start_chat(night, log.deadline_ts - time.time() + CHAT_TAIL_S, args)
    log.event(f"night {night.run_id}: run and chat load started, deadline {night.deadline_hhmm} "
              f"UTC ({duration:.0f} s)")  # fmt: skip
    pending = fault_schedule(duration)
    while time.time() < log.deadline_ts:
        procs.reap_orphans()
        rows = watch.poll()
        for entry in log.faults:
            if (
                entry["ok"]
                and entry["recovered_after_s"] is None
                and rows > entry["summaries_at_end"]
            ):
                entry["recovered_after_s"] = round(time.time() - entry["ended_at"], 1)
        due = pending and time.time() >= log.t0 + pending[0].at_s
        running = not night.run_ended()
        if not log.memory_start and (rows or due):
            take_start_sample(night, log)
        elif (
            log.memory_series
            and time.time() - log.t0 >= log.memory_series[-1]["at_s"] + MEMORY_EVERY_S
        ):
            take_series_sample(night, log)
        if due and fault_ready(pending[0].name, running):
            fault(night, log, pending.pop(0), watch)
        elif not running and not keep_going(night, log):
            break
        if not log.memory_end and time.time() >= end_sample_at(log.deadline_ts, duration):
            log.memory_end = sample_memory(night)
            log.event(f"end memory sampled ({len(log.memory_end)} processes)")
        time.sleep(POLL_S)
    for planned in pending:
        not_injected(log, planned)
    log.memory_end = log.memory_end or sample_memory(night)
    log.event("deadline: waiting for the run to end")
    end_night(night, log, args.drain_s)
    watch.poll()


if __name__ == "__main__":
    sys.exit(main())
