"""vLLM-like continuous batching for one replica, readable top to bottom (after vLLM V1's scheduler).

Every step spends a token budget: running requests first (one token each when decoding, a chunk when
prefilling), then waiting requests in priority order while the budget, `max_num_seqs` and KV memory
allow. When KV runs out for a running request, the lowest-priority, latest-arrived running request is
preempted: its blocks are freed and it goes back to the waiting queue to recompute from scratch
(prefix cache hits included). No new request is admitted in a step that preempted.

With a `batch_target` set (the engine plug-in's control document, in the real engine) each step
first reserves chat's share and then sizes every batch prefill chunk with the plug-in's own
`StepBudget`, in the same order vLLM reaches the requests, and keeps the plug-in's `StepCredit`
under a mean target, so a simulated replica runs the plug-in.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field

from scheduler.chat_cache import ChatCacheSet
from scheduler.step import PrefillChunk, StepBatch
from scheduler.step_budget import (
    BatchPrefill,
    BatchStepTarget,
    InEngine,
    StepBudget,
    StepCredit,
    any_chat,
    batch_room,
    chat_reservation,
)
from scheduler.step_scale import StepTimeScale
from simulator.config import EngineParams
from simulator.entities import Request
from simulator.kv_cache import KVCache


@dataclass(slots=True)
class ScheduledStep:
    """What one step carries: decoding requests (one token each), prefill `(request, tokens)`
    chunks, and the batch the latency model prices."""

    decodes: list[Request] = field(default_factory=list)
    prefills: list[tuple[Request, int]] = field(default_factory=list)
    batch: StepBatch | None = None
    target_bound: bool = False
    """Whether the plug-in's target held a batch prefill back (`StepBudget.target_bound`)."""

    def unschedule(self, req: Request) -> int:
        """Drop `req` from the step (it was preempted); returns the tokens given back."""
        if req in self.decodes:
            self.decodes.remove(req)
            return 1
        for j, (r, n) in enumerate(self.prefills):
            if r is req:
                del self.prefills[j]
                return n
        return 0


@dataclass(slots=True)
class StepOutcome:
    """What one finished step produced, for records and sensors."""

    finished: list[Request] = field(default_factory=list)
    first_tokens: list[Request] = field(default_factory=list)
    chat_gaps: list[float] = field(default_factory=list)


class EngineScheduler:
    """Waiting queue, running list and KV pool of one replica."""

    def __init__(self, params: EngineParams, kv: KVCache) -> None:
        self.kv = kv
        self.chunked = params.enable_chunked_prefill
        # vLLM refuses chunked prefill off with a budget below max_model_len; like its default, the
        # budget then grows to fit any whole prompt.
        self.budget = (
            params.max_num_batched_tokens
            if self.chunked
            else max(params.max_num_batched_tokens, params.max_model_len)
        )
        self.threshold = params.long_prefill_token_threshold if self.chunked else 0
        self.max_seqs = params.max_num_seqs
        self.step_time_ratio = params.step_time_ratio
        self.scale = StepTimeScale()
        """The plug-in's correction of its model, learnt from this replica's steps as the real one
        learns it (`Replica.end_step` feeds it)."""
        self.by_priority = params.scheduling_policy == "priority"
        self.running: list[Request] = []
        self._heap: list[tuple[int, float, int, Request]] = []
        self._fifo: deque[Request] = deque()
        self._order = itertools.count()
        self.preemptions = 0
        self.block_size = kv.block_size
        self.batch_target: BatchStepTarget | None = None
        """The plug-in's batch step target for this replica; None: stock scheduling."""
        self._step_budget: StepBudget | None = None
        self._credit = StepCredit()
        self._step_scale = 1.0  # what this step's model prediction was scaled by
        self._chat_reserved = False
        self._chat_prefill_stalled = False
        """The last step reserved chat prefill and scheduled none of it: the next leaves waiting
        chat out of its reservation (`chat_reservation`)."""
        self.chat_cache = ChatCacheSet(kv.block_size)
        self.chat_cache_horizon_s: float | None = None
        """How far back chat's prefix-cache working set is counted, as the plug-in does for the
        controller in charge (None: not counted)."""

    def chat_cache_tokens(self, now: float) -> int | None:
        """Chat's prefix-cache working set at `now` (`scheduler/chat_cache.py`), in tokens."""
        return self.chat_cache.tokens(now, self.chat_cache_horizon_s)

    @property
    def num_waiting(self) -> int:
        return len(self._heap) + len(self._fifo)

    def add(self, req: Request, front: bool = False) -> None:
        """Queue `req`; `front` puts a preempted request ahead of equals in first-come order."""
        if self.by_priority:
            heapq.heappush(self._heap, (req.priority, req.arrival, next(self._order), req))
        elif front:
            self._fifo.appendleft(req)
        else:
            self._fifo.append(req)

    def waiting(self) -> list[Request]:
        return [e[3] for e in self._heap] + list(self._fifo)

    def schedule(self, now: float) -> ScheduledStep | None:
        """Choose the work of the step that starts at `now`, or None when there is nothing the
        replica can do now."""
        step = self._compose(now)
        if step is None and self._chat_prefill_stalled:
            # The engine's next (empty, instant) step reserves no waiting chat, so batch moves.
            step = self._compose(now)
        return step

    def _compose(self, now: float) -> ScheduledStep | None:
        step = ScheduledStep()
        self._step_budget = self._plug_in_budget(now)
        budget = self._schedule_running(step, self.budget)
        if budget is not None:
            self._schedule_waiting(step, budget)
        self._chat_prefill_stalled = self._chat_reserved and not any(
            r.cls != "batch" for r, _ in step.prefills
        )
        if not step.decodes and not step.prefills:
            return None
        step.target_bound = self._step_budget is not None and self._step_budget.target_bound
        step.batch = StepBatch(
            tuple(PrefillChunk(n, r.num_computed) for r, n in step.prefills),
            len(step.decodes),
            sum(r.prompt_tokens + r.output_tokens for r in step.decodes),
        )
        if self._credit.settling:
            self._credit.ran(self.batch_target.model.step_seconds(step.batch) * self._step_scale)
        return step

    def _plug_in_budget(self, now: float) -> StepBudget | None:
        """This step's budget for batch prefill, after chat's reservation (None: stock)."""
        target = self.batch_target
        self._chat_reserved = False
        if target is None:
            return None
        waiting = sorted(self._heap) if self.by_priority else self._fifo
        fixed, reserved = chat_reservation(
            map(_in_engine, self.running),
            (_in_engine(e[3] if self.by_priority else e) for e in waiting)
            if not self._chat_prefill_stalled
            else (),
            self.budget,
            self.threshold or self.budget,
            self.max_seqs - len(self.running),
        )
        self._chat_reserved = bool(fixed.prefills)
        room = batch_room(self.budget, reserved, fixed, target.paused)
        chat = any_chat(
            [*map(_in_engine, self.running),
             *(_in_engine(e[3] if self.by_priority else e) for e in waiting)]
        )  # fmt: skip
        self._step_scale = target.applied_scale(self.scale.at(now))
        target_s = self._credit.step_target_s(target, chat) / self._step_scale
        return StepBudget(
            target.model, target_s, room, fixed, self.block_size, target.min_chunk_tokens
        )

    def _chunk(self, req: Request, remaining: int, budget: int) -> int:
        n = remaining
        if self.chunked and n > 1:
            if 0 < self.threshold < n:
                n = self.threshold
            if 0 < req.chunk_cap < n:
                n = req.chunk_cap
        n = min(n, budget)
        if self._step_budget is not None and req.cls == "batch" and remaining > 1:
            prefix = req.prompt_tokens + req.output_tokens - remaining
            n = self._step_budget.grant(BatchPrefill(prefix, remaining), limit=n)
        return n

    def _schedule_running(self, step: ScheduledStep, budget: int) -> int | None:
        """Schedule running requests; returns the budget left, or None when the step preempted."""
        kv, running, preempted = self.kv, self.running, False
        block = kv.block_size
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            remaining = req.prompt_tokens + req.output_tokens - req.num_computed
            # The common case, kept cheap: a decode whose token fits the blocks it already holds.
            if remaining == 1 and req.output_tokens and req.num_computed < req.held_blocks * block:
                step.decodes.append(req)
                budget -= 1
                i += 1
                continue
            n = self._chunk(req, remaining, budget)
            if n == 0:  # a batch prefill the plug-in gives nothing this step
                i += 1
                continue
            while not kv.can_allocate(req, n):
                victim = self._victim()
                running.remove(victim)
                given_back = step.unschedule(victim)
                if given_back:
                    budget += given_back
                    i -= 1
                self._preempt(victim)
                preempted = True
                if victim is req:
                    return None
            kv.allocate(req, n)
            self._place(step, req, n)
            budget -= n
            i += 1
        return None if preempted else budget

    def _schedule_waiting(self, step: ScheduledStep, budget: int) -> None:
        kv, running = self.kv, self.running
        while budget > 0 and len(running) < self.max_seqs and (self._heap or self._fifo):
            req = self._heap[0][3] if self.by_priority else self._fifo[0]
            hits = kv.lookup(req) if req.num_computed == 0 else []
            remaining = req.num_tokens - req.num_computed - len(hits) * kv.block_size
            if not self.chunked and remaining > budget:
                break
            n = self._chunk(req, remaining, budget)
            if n == 0 or not kv.can_allocate(req, n, hits):
                break
            if self.by_priority:
                heapq.heappop(self._heap)
            else:
                self._fifo.popleft()
            kv.allocate(req, n, hits)
            if hits and req.cls == "chat" and self.chat_cache_horizon_s is not None:
                self.chat_cache.taken(hits)
            if req.cached_tokens is None:  # the first admission's hits, not a recompute's
                req.cached_tokens = len(hits) * kv.block_size
            running.append(req)
            self._place(step, req, n)
            budget -= n

    @staticmethod
    def _place(step: ScheduledStep, req: Request, n: int) -> None:
        # One token that completes an already-sampled sequence is a decode, whatever led here.
        if n == 1 and req.output_tokens and req.num_computed + 1 == req.num_tokens:
            step.decodes.append(req)
        else:
            step.prefills.append((req, n))

    def abort(self, reqs: list[Request], step: ScheduledStep | None) -> None:
        """Take `reqs` out of the engine (and out of the step in flight), freeing their KV."""
        gone = {id(r) for r in reqs}
        for req in reqs:
            if step is not None:
                step.unschedule(req)
            self.kv.free(req, self._evicts_first(req))
        self.running = [r for r in self.running if id(r) not in gone]
        self._heap = [e for e in self._heap if id(e[3]) not in gone]
        heapq.heapify(self._heap)
        self._fifo = deque(r for r in self._fifo if id(r) not in gone)

    def _evicts_first(self, req: Request) -> bool:
        """Whether `req`'s freed blocks go before every other cached block: a finished batch
        request's, while the plug-in steers (`serving/engine_site/batch_eviction.py`)."""
        return req.cls == "batch" and self.batch_target is not None

    def _victim(self) -> Request:
        if self.by_priority:
            return max(self.running, key=lambda r: (r.priority, r.arrival))
        return self.running[-1]

    def _preempt(self, req: Request) -> None:
        self.kv.free(req)
        req.num_computed = 0
        self.preemptions += 1
        self.add(req, front=True)

    def complete(self, step: ScheduledStep, now: float) -> StepOutcome:
        """Apply a step that ended at `now`: advance KV, sample tokens, retire finished requests."""
        out = StepOutcome()
        kv, b = self.kv, self.kv.block_size
        caching = kv.prefix_caching
        gaps, finished = out.chat_gaps, out.finished
        for req in step.decodes:
            computed = req.num_computed + 1
            req.num_computed = computed
            if caching and computed % b == 0:
                kv.register_full_blocks(req, computed - 1)
            times = req.token_times
            if req.cls == "chat":
                gaps.append(now - times[-1])
            times.append(now)
            req.output_tokens += 1
            if req.output_tokens >= req.max_output:
                finished.append(req)
        for req, n in step.prefills:
            before = req.num_computed
            req.num_computed = before + n
            if caching and before // b != req.num_computed // b:
                kv.register_full_blocks(req, before)
            if req.num_computed < req.num_tokens:
                continue
            if not req.token_times:
                out.first_tokens.append(req)
            elif req.cls == "chat":
                gaps.append(now - req.token_times[-1])
            req.token_times.append(now)
            req.output_tokens += 1
            if req.output_tokens >= req.max_output:
                finished.append(req)
        if finished:
            counting = self.chat_cache_horizon_s is not None
            for req in finished:
                keys = req.block_keys if counting and req.cls == "chat" else ()
                kv.free(req, self._evicts_first(req))
                if keys:
                    refs = kv.refs
                    self.chat_cache.left((k for k in keys if refs.get(k) == 0), now)
            self.running = [r for r in self.running if r.output_tokens < r.max_output]
        return out


def _in_engine(req: Request) -> InEngine:
    total = req.prompt_tokens + req.output_tokens
    return InEngine(total - req.num_computed, req.num_computed, req.cls == "batch")
