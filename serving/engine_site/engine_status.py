"""What the plug-in reports about its engine: step counts and times, tokens by class, chat's own
token gaps, written as a status document about once a second.

Everything is cumulative since the engine started (like Prometheus counters), so a reader turns
two documents into a window by subtraction; `recent` holds the figures of the last interval only,
for a person reading `nightshift engine status`.

Chat's token gaps are kept apart from batch's on purpose: vLLM's `inter_token_latency_seconds`
histogram counts every sequence's tokens, so a replica running batch alone looks like a replica
with slow chat, and a replica whose new chats wait behind a batch prefill produces no chat gaps at
all and looks healthy. Here a gap counts only when a chat request gets a token, and chat's time to
first token is recorded from the request's arrival, so chat is judged by chat's own numbers.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

FORMAT = "nightshift.engine_status/1"
BUCKET_RESOLUTION = 1.05
"""Width of a chat latency bucket where SLOs and batch step targets fall, as a ratio of its bounds:
a p99 read from the histogram lies within 5% of the true one. A window holds few chats, so its p99
is read from the bucket of its slowest one and lands near that bucket's top: wider buckets read a
chat's 76 ms first token as 100 ms (a 75-100 ms bucket), and a step sized just under a bound as
the next one, which the controller then takes for pressure that is not there."""


def _geometric(lo: float, hi: float, ratio: float) -> tuple[float, ...]:
    bounds, x = [], lo
    while x < hi * (1 + 1e-9):
        bounds.append(round(x, 4))
        x *= ratio
    return tuple(bounds)


GAP_BOUNDS_S = (
    0.002, 0.004, 0.006, 0.008, *_geometric(0.01, 0.25, BUCKET_RESOLUTION), 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0,
)  # fmt: skip
"""Chat ITL bucket bounds (seconds): fine from 10 to 250 ms."""
TTFT_BOUNDS_S = (
    0.005, *_geometric(0.01, 2.5, BUCKET_RESOLUTION), 3.0, 5.0, 10.0, 20.0, 60.0,
)  # fmt: skip
"""Chat TTFT bucket bounds (seconds): fine from 10 ms to 2.5 s."""
E2E_BOUNDS_S = (*_geometric(0.05, 120.0, BUCKET_RESOLUTION), 300.0, 900.0)
"""Chat end-to-end bucket bounds (seconds): fine from 50 ms to 2 minutes."""
ANSWER_BOUNDS_TOKENS = _geometric(1.0, 65536.0, BUCKET_RESOLUTION)
"""Chat answer length bucket bounds (tokens)."""
WRITE_EVERY_S = 1.0


@dataclass
class Buckets:
    """A cumulative histogram: `counts[i]` observations <= `bounds[i]`, the last slot +Inf."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def to_dict(self) -> dict:
        cumulative, running = [], 0
        for c in self.counts:
            running += c
            cumulative.append(running)
        return {"bounds": list(self.bounds), "cumulative": cumulative, "count": running,
                "sum": self.total}  # fmt: skip


@dataclass
class Totals:
    """Counters over many steps."""

    steps: int = 0
    batch_prefill_tokens: int = 0
    batch_decode_tokens: int = 0
    chat_prefill_tokens: int = 0
    chat_decode_tokens: int = 0
    batch_prefill_steps: int = 0
    """Steps that carried at least one batch prefill chunk."""
    target_bound_steps: int = 0
    """Steps in which the batch step target held a batch prefill below what vLLM would schedule:
    the steps that ran at the target (`StepBudget.target_bound`)."""
    measured_s: float = 0.0
    predicted_s: float = 0.0
    predicted_steps: int = 0
    """Steps with a prediction (a latency model from the control document); `predicted_s` and
    `measured_when_predicted_s` sum over these only, so their ratio is the model's error."""
    measured_when_predicted_s: float = 0.0
    model_s: float = 0.0
    """The control document's model alone over the same steps (`predicted_s` is after the
    plug-in's scale): `measured_when_predicted_s / model_s` is how far off the model is here."""
    batch_measured_s: float = 0.0
    batch_model_s: float = 0.0
    """Measured time and the model alone, over the steps with a model that carried a batch prefill
    chunk: their ratio is the model's error where the plug-in sizes, what a controller corrects
    the model by. Steps without batch are left out: their time is mostly the fixed cost of a step,
    which a fit prices less well, and it moves with chat's load, not with the chunks sized."""
    max_measured_s: float = 0.0


@dataclass
class StepRecord:
    """One step as scheduled: tokens by class, and the model's prediction when there was one."""

    batch_prefill: int = 0
    batch_decode: int = 0
    chat_prefill: int = 0
    chat_decode: int = 0
    target_bound: bool = False
    """Whether the batch step target held a batch prefill back in this step."""
    predicted_s: float | None = None
    """The model's prediction times the plug-in's current scale (what the budget sized to)."""
    model_s: float | None = None
    """The control document's model alone, before the scale."""
    scheduled_at: float = 0.0
    """Wall time the step was scheduled."""
    step: object | None = None
    """The step's composition (`scheduler.step.StepBatch`), for the step log."""


class EngineStatus:
    """Accumulates steps and chat gaps; `maybe_write` puts the document at `path` atomically."""

    def __init__(self, path: str | Path | None, wall=time.time) -> None:
        self.path = Path(path) if path else None
        self._wall = wall
        self.totals = Totals()
        self._recent = Totals()
        self.chat_itl = Buckets(GAP_BOUNDS_S)
        self.chat_ttft = Buckets(TTFT_BOUNDS_S)
        self.chat_e2e = Buckets(E2E_BOUNDS_S)
        self.chat_answer_tokens = Buckets(ANSWER_BOUNDS_TOKENS)
        self._last_write = 0.0
        self.errors = 0
        self.last_batch_prefill_at: float | None = None

    def step(self, rec: StepRecord, measured_s: float) -> None:
        if rec.batch_prefill:
            self.last_batch_prefill_at = rec.scheduled_at
        for t in (self.totals, self._recent):
            t.steps += 1
            t.batch_prefill_tokens += rec.batch_prefill
            t.batch_decode_tokens += rec.batch_decode
            t.chat_prefill_tokens += rec.chat_prefill
            t.chat_decode_tokens += rec.chat_decode
            t.batch_prefill_steps += rec.batch_prefill > 0
            t.target_bound_steps += rec.target_bound
            t.measured_s += measured_s
            t.max_measured_s = max(t.max_measured_s, measured_s)
            if rec.predicted_s is not None:
                t.predicted_steps += 1
                t.predicted_s += rec.predicted_s
                t.measured_when_predicted_s += measured_s
                t.model_s += rec.model_s or 0.0
                if rec.batch_prefill:
                    t.batch_measured_s += measured_s
                    t.batch_model_s += rec.model_s or 0.0

    def document(self, control: dict) -> dict:
        r = self._recent
        recent = {
            "steps": r.steps,
            "target_bound_steps": r.target_bound_steps,
            "batch_prefill_tokens_per_step": r.batch_prefill_tokens / r.steps if r.steps else 0,
            "batch_prefill_tokens_per_batch_step": (
                r.batch_prefill_tokens / r.batch_prefill_steps if r.batch_prefill_steps else 0
            ),
            "mean_step_ms": 1000 * r.measured_s / r.steps if r.steps else None,
            "max_step_ms": 1000 * r.max_measured_s if r.steps else None,
            "mean_predicted_ms": (
                1000 * r.predicted_s / r.predicted_steps if r.predicted_steps else None
            ),
        }
        return {
            "format": FORMAT,
            "written_at": self._wall(),
            "pid": os.getpid(),
            **control,
            "totals": self.totals.__dict__.copy(),
            "recent": recent,
            "chat_itl_seconds": self.chat_itl.to_dict(),
            "chat_ttft_seconds": self.chat_ttft.to_dict(),
            "chat_e2e_seconds": self.chat_e2e.to_dict(),
            "chat_answer_tokens": self.chat_answer_tokens.to_dict(),
            "last_batch_prefill_at": self.last_batch_prefill_at,
            "plugin_errors": self.errors,
        }

    @property
    def next_write_at(self) -> float:
        """Monotonic time from which `maybe_write` writes (never, without a path)."""
        return math.inf if self.path is None else self._last_write + WRITE_EVERY_S

    def maybe_write(
        self, now_mono: float, control: Callable[[], dict], drained: bool = False
    ) -> bool:
        """Write the document if `WRITE_EVERY_S` passed since the last write, or at once when the
        engine has just `drained` (nothing left to run) after steps not yet written; True if
        written. `control` gives the plug-in's fields, asked for only then (this runs every step).

        Invariant: the last document before an idle spell counts every step and chat gap of the
        busy one, so a reader that takes the last document written before a moment as its
        baseline (`written_at`) counts nothing from before it: a benchmark's next scenario starts
        clean even though no document is written while the engine is idle."""
        if self.path is None:
            return False
        due = now_mono - self._last_write >= WRITE_EVERY_S
        if not (due or (drained and self._recent.steps)):
            return False
        self._last_write = now_mono
        write_atomically(self.path, json.dumps(self.document(control())))
        self._recent = Totals()
        return True


def write_atomically(path: Path, text: str) -> None:
    """Readers see the old document or the new one, never half of one (`os.replace`)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
