"""What a person watching a night run sees: documents done of total, tokens/s, caps, ETA."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from scheduler.admission import NoAdmissionControl, Observation


@dataclass
class Throughput:
    """Batch tokens per second since the start, and an ETA from the documents' pace. Pure."""

    total_docs: int
    started: float
    done_docs: int = 0
    tokens: int = 0
    _last: float = field(default=0.0, repr=False)

    def add(self, batch_tokens: int, now: float) -> None:
        self.done_docs += 1
        self.tokens += batch_tokens
        self._last = now

    def tokens_per_s(self, now: float) -> float:
        return self.tokens / max(1e-9, now - self.started)

    def eta_s(self, now: float) -> float | None:
        if not self.done_docs:
            return None
        per_doc = (now - self.started) / self.done_docs
        return per_doc * (self.total_docs - self.done_docs)


UNCONTROLLED = NoAdmissionControl().decide(Observation(t=0.0, replica="")).reason
"""The reason policy `none` gives every decision."""


def describe_caps(caps: dict[str, dict]) -> str:
    """`r1 4 seats at 25 ms` per replica (the engine plug-in's batch step target), `r1 4 seats`
    where the engine is stock, `uncapped` under policy none (whose caps are only the engine's own,
    so its placeholder seat count means nothing to a reader), `paused` when paused, `down` when
    out."""
    parts = []
    for name, c in sorted(caps.items()):
        target = c.get("batch_step_target_ms")
        if c.get("reason") == "down":
            parts.append(f"{name} down")
        elif c.get("pause"):
            parts.append(f"{name} paused")
        elif c.get("reason") == UNCONTROLLED:
            parts.append(f"{name} uncapped")
        elif target is not None:
            parts.append(f"{name} {c.get('batch_seats')} seats at {target:.0f} ms")
        else:
            parts.append(f"{name} {c.get('batch_seats')} seats")
    return ", ".join(parts)


class RunProgress:
    """A live progress bar (plain lines when not on a terminal)."""

    def __init__(self, total_docs: int, enabled: bool = True) -> None:
        self.stats = Throughput(total_docs, time.time())
        self._progress = Progress(
            TextColumn("[bold]documents"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TextColumn("caps {task.fields[caps]}"),
            TextColumn("ETA {task.fields[eta]}"),
            TimeElapsedColumn(),
            disable=not enabled,
            transient=False,
        )
        self._task = self._progress.add_task("run", total=total_docs, rate="", caps="-", eta="-")

    def __enter__(self) -> RunProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def update(self, batch_tokens: int, caps: dict[str, dict] | None = None) -> None:
        now = time.time()
        self.stats.add(batch_tokens, now)
        eta = self.stats.eta_s(now)
        fields = {
            "rate": f"{self.stats.tokens_per_s(now):,.0f} tok/s",
            "eta": "-" if eta is None else f"{eta / 60:.1f} min",
        }
        if caps is not None:
            fields["caps"] = describe_caps(caps)
        self._progress.update(self._task, advance=1, **fields)
