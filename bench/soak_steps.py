"""The steps of the soak's night (`bench.soak` runs the loop): its log, chat load's start, the
memory samples, each fault and its entry in the log, and what happens when a run attempt ends
before the deadline (the next one resumes the run id) or after it (it is given time to drain).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field

from bench.soak_faults import inject
from bench.soak_memory import by_role
from bench.soak_night import Night
from bench.soak_plan import PlannedFault, chat_period_s, may_start_attempt
from bench.soak_tables import SummaryWatch, sample_memory

POLL_S = 2.0
RESUME_DELAY_S = 10.0
MAX_RESUMES = 10
"""Run attempts started because the last one ended before the deadline (not by a fault)."""


@dataclass
class NightLog:
    """What the night did, filled in as it goes (kept when it is interrupted)."""

    t0: float = 0.0
    deadline_ts: float = 0.0
    faults: list[dict] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    memory_start: list = field(default_factory=list)
    memory_end: list = field(default_factory=list)
    memory_start_at: float | None = None
    memory_series: list[dict] = field(default_factory=list)
    """Per-process MiB of each role every `MEMORY_EVERY_S` (`take_series_sample`)."""

    def event(self, what: str) -> None:
        self.events.append({"at_s": round(time.time() - self.t0, 1), "what": what})
        print(f"[{time.time() - self.t0:7.1f} s] {what}", flush=True)


def start_chat(night: Night, duration: float, args: argparse.Namespace) -> None:
    from bench.varying_trace import TraceShape, generate, write_csv

    shape = TraceShape(duration_s=duration, low_rps=args.chat_low_rps,
                       high_rps=args.chat_high_rps, period_s=chat_period_s(duration),
                       seed=args.seed)  # fmt: skip
    trace = night.out / "chat-trace.csv"
    write_csv(generate(shape), trace)
    night.start_chat(trace, duration, args.seed)


def take_start_sample(night: Night, log: NightLog) -> None:
    """The judged start sample, which is also the series' first point."""
    log.memory_start, log.memory_start_at = sample_memory(night), time.time()
    log.event(f"start memory sampled ({len(log.memory_start)} processes)")
    take_series_sample(night, log, log.memory_start)


def take_series_sample(night: Night, log: NightLog, sample: list | None = None) -> None:
    """One point of the memory series: per-process MiB of each role in `sample` (default: now)."""
    roles = by_role(sample if sample is not None else sample_memory(night))
    log.memory_series.append(
        {
            "at_s": round(time.time() - log.t0, 1),
            "per_process_mib": {role: r["per_process_mib"] for role, r in roles.items()},
        }
    )


def not_injected(log: NightLog, planned: PlannedFault) -> None:
    """A fault still waiting for a run attempt when the night ended, in the log as not done."""
    why = "not injected: no run attempt ran for it before the night ended"
    log.event(f"fault {planned.name} {why}")
    at = log.t0 + planned.at_s
    entry = {"fault": planned.name, "planned_s": round(planned.at_s, 1), "ok": False}
    entry |= {"at_s": entry["planned_s"], "at": at, "ended_at": at, "detail": why}
    log.faults.append(entry | {"summaries_at_end": 0, "recovered_after_s": None})


def fault(night: Night, log: NightLog, planned: PlannedFault, watch: SummaryWatch) -> None:
    at = time.time()
    log.event(f"fault {planned.name} (planned at {planned.at_s:.0f} s)")
    outcome = inject(planned.name, night, log.deadline_ts)
    entry = {"fault": planned.name, "planned_s": round(planned.at_s, 1),
             "at_s": round(at - log.t0, 1), "at": at, **outcome,
             "summaries_at_end": watch.poll(), "recovered_after_s": None}  # fmt: skip
    log.faults.append(entry)
    log.event(f"  {'ok' if outcome['ok'] else 'NOT DONE'}: {outcome['detail']}")


def keep_going(night: Night, log: NightLog) -> bool:
    """After a run attempt ended on its own before the deadline: start the next one (after a
    pause) unless the night is complete; False when the night is over."""
    attempt = night.run
    s = attempt.summary
    if attempt.rc == 0 and s and not s["partial"] and not s["failed"]:
        log.event(f"attempt {attempt.number} ended the night: {s}")
        return False
    if time.time() - attempt.ended < RESUME_DELAY_S:
        return True
    resumes = sum(a.why.startswith("resume") for a in night.attempts)
    if resumes >= MAX_RESUMES or not may_start_attempt(time.time(), log.deadline_ts):
        return True  # chat goes on to the deadline; no more attempts
    log.event(f"attempt {attempt.number} ended (rc {attempt.rc}, {s}); resuming the run id")
    night.start_run(f"resume after attempt {attempt.number} ended (rc {attempt.rc})")
    return True


def end_night(night: Night, log: NightLog, drain_s: float) -> None:
    """Let the run finish its requests in flight and load its warehouse; stop it after `drain_s`.
    Chat load ends with its trace."""
    until = time.time() + drain_s
    while not night.run_ended() and time.time() < until:
        time.sleep(POLL_S)
    if not night.run_ended():
        log.event(f"the run had not ended {drain_s:.0f} s after the deadline: stopping it")
        night.stop_run()
    log.event(f"run ended (rc {night.run.rc}): {night.run.summary}")
    if night.chat is not None:
        try:
            night.chat.wait(timeout=60)
        except Exception:
            night.stop_chat()
