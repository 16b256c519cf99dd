"""One simulated replica: engine scheduler, KV pool, step-time model and sensor, stepping in virtual time.

A step is priced when it starts (the model sees exactly the batch the scheduler chose) and applied
when it ends; every decoding sequence of the step gets its token at that end time, which is where
token gaps come from. A replica whose `step_time_ratio` is not 1 runs its steps that much slower
(or faster) than the model everyone else is given says; with a `step_time_spread` each step also
draws its own multiplier from it (a real engine's steps of one price vary: other processes on
the host, caches), which is what puts a tail on chat's gaps beyond the step target.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from scheduler.step import StepTimeModel
from simulator.config import EngineParams
from simulator.engine_scheduler import EngineScheduler, ScheduledStep, StepOutcome
from simulator.entities import Request
from simulator.kv_cache import KVCache
from simulator.sensors import ReplicaSensor

MIN_STEP_S = 1e-6


class StepSpread:
    """Draws a step's time multiplier from quantiles evenly spaced over [0, 1] (linear between
    them); with none, always 1."""

    def __init__(self, quantiles: Sequence[float], rng: random.Random) -> None:
        self.quantiles = tuple(quantiles)
        self.rng = rng

    @property
    def mean(self) -> float:
        """The mean multiplier a draw gives (the area under the quantile line)."""
        q = self.quantiles
        if not q:
            return 1.0
        return (sum(q) - (q[0] + q[-1]) / 2) / (len(q) - 1)

    def draw(self) -> float:
        q = self.quantiles
        if not q:
            return 1.0
        x = self.rng.random() * (len(q) - 1)
        i = int(x)
        return q[i] + (q[min(i + 1, len(q) - 1)] - q[i]) * (x - i)


class Replica:
    """A vLLM-like engine that is either idle or running exactly one step."""

    def __init__(
        self,
        name: str,
        params: EngineParams,
        model: StepTimeModel,
        intervals_per_window: int = 1,
        seed: int = 0,
    ) -> None:
        self.name = name
        self.params = params
        self.model = model
        self.spread = StepSpread(params.step_time_spread, random.Random(f"{seed}:{name}:steps"))
        self.kv = KVCache(
            params.kv_capacity_tokens, params.block_size, params.enable_prefix_caching
        )
        self.engine = EngineScheduler(params, self.kv)
        self.sensor = ReplicaSensor(intervals_per_window)
        self.step: ScheduledStep | None = None
        self.step_price = 0.0
        """The model's price of `step` (before the replica's own ratio and spread)."""
        self.step_started = 0.0
        self.busy = False
        self.steps = 0
        self.peak_used_blocks = 0

    def reject_reason(self, req: Request) -> str | None:
        """Why the engine would refuse `req` outright (vLLM answers such requests with an error)."""
        if req.total_tokens > self.params.max_model_len:
            return (
                f"{req.total_tokens} tokens exceed max_model_len {self.params.max_model_len}: "
                "raise max-model-len or shorten the request"
            )
        if self.kv.blocks_for(req.total_tokens) > self.kv.num_blocks:
            return (
                f"{req.total_tokens} tokens need more KV than the replica has "
                f"({self.kv.num_blocks * self.kv.block_size} tokens)"
            )
        return None

    def submit(self, req: Request) -> None:
        req.replica = self.name
        self.engine.add(req)

    def start_step(self, now: float) -> float | None:
        """Schedule and price the next step; returns its end time, or None (and goes idle)."""
        preempted_before = self.engine.preemptions
        step = self.engine.schedule(now)
        self.sensor.current.preemptions += self.engine.preemptions - preempted_before
        self.step = step
        if step is None:
            self.busy = False
            return None
        self.busy = True
        self.step_started = now
        self.peak_used_blocks = max(self.peak_used_blocks, self.kv.used_blocks)
        # A model that priced a step at zero would freeze virtual time; a microsecond is below any
        # real engine step.
        self.step_price = self.model.step_seconds(step.batch)
        seconds = self.step_price * self.params.step_time_ratio * self.spread.draw()
        return now + max(seconds, MIN_STEP_S)

    def end_step(self, now: float) -> StepOutcome:
        """Apply the step that ends at `now` and feed the sensor."""
        outcome = self.engine.complete(self.step, now)
        dt = now - self.step_started
        self.steps += 1
        if self.engine.batch_target is not None and any(
            r.cls == "batch" for r, _ in self.step.prefills
        ):
            self.engine.scale.observe(now, dt, self.step_price)
        iv = self.sensor.current
        iv.steps.append(dt)
        iv.target_bound_steps += self.step.target_bound
        iv.chat_gaps.extend(outcome.chat_gaps)
        iv.chat_ttfts.extend(now - r.arrival for r in outcome.first_tokens if r.cls == "chat")
        iv.chat_e2es.extend(now - r.arrival for r in outcome.finished if r.cls == "chat")
        for r in outcome.finished:
            if r.cls == "chat":
                self.sensor.answered(r.output_tokens)
        return outcome

    @property
    def kv_peak(self) -> float:
        return self.peak_used_blocks / self.kv.num_blocks
