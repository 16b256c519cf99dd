"""The engine plug-in: vLLM's v1 scheduler with a per-class, position-aware batch step budget.

Selected with `scheduler-cls` in an engine config (`BudgetScheduler` where vLLM schedules
synchronously, as on CPU; `AsyncBudgetScheduler` where it schedules asynchronously, as on GPU); it
runs inside the engine-core process, which finds this package on the replica's PYTHONPATH.

The invariant it serves: **chat is never cut, and no step carries more batch prefill than fits the
batch step target beside this step's real chat load.** Stock vLLM serves its running list before
its waiting queue, whatever the priorities, so a batch prefill already running takes the step
budget ahead of a chat prompt that arrives after it, and a long batch prompt starves new chats for
its whole prefill. Every step, before vLLM schedules anything, the plug-in

1. reserves the step's tokens for what is never cut: every decode (chat and batch: one token
   each), the running chat prefills, then the waiting chat prompts in priority order while seats
   last (chat prompts may use the engine's whole step budget);
2. prices that fixed part with the controller's latency model, and gives each batch prefill, in
   the order vLLM reaches it, the largest chunk at its real prefix position that keeps the step
   within the target and the reserved room (`scheduler.step_budget.StepBudget.grant`). Under a
   document with a mean step target the step's target is that mean plus what earlier steps left
   unused below it, never past the batch step target (`scheduler.step_budget.StepCredit`).

The cap is applied where vLLM 0.32 sizes a request's chunk after every other cap,
`Scheduler._reserve_prefill_lookahead`, called for running and waiting requests alike. A batch
request granted 0 is skipped (running) or ends the waiting pass (waiting): under priority
scheduling every waiting chat is ahead of every waiting batch request, so nothing chat is lost.

A step that schedules nothing because the plug-in held back every request there is (no chat in
the engine) waits on the engine core's input queue instead of returning at once, so the engine
core does not loop at full speed while batch is paused; `idle_hold` states what ends the wait.

While a controller is in charge, a finished batch request's KV blocks are reused before any
block chat may hit again (`batch_eviction`), and the status counts chat's prefix-cache working set
over the horizon the control document names (`chat_blocks`, `scheduler.chat_cache`).

Without a control document the plug-in only observes (stock scheduling, status still written);
see `control_channel` for expiry and rejection. Any exception inside the plug-in falls back to stock
behaviour for that step and is logged once per place: the engine never dies because of it.

vLLM private names this depends on (checked by the canary in `tests/integration/test_budget_scheduler.py`):
`Scheduler.schedule`, `Scheduler._reserve_prefill_lookahead(request, num_computed_tokens,
num_new_tokens)`, `Scheduler.update_from_output(scheduler_output, model_runner_output)`,
`Scheduler._free_request_blocks(request)` (and the KV pool's, listed in `batch_eviction`),
`Scheduler.running`, `.waiting` (iterable in policy order), `.requests`, `.block_size`,
`.get_num_unfinished_requests()`,
`.max_num_scheduled_tokens`, `.max_num_running_reqs`, `.policy`,
`.scheduler_config.long_prefill_token_threshold`, `.connector`, `.parallel_config.data_parallel_size`
(and the engine core's, listed in `idle_hold`); `Request.request_id`, `.priority`,
`.num_tokens`, `.num_computed_tokens`, `.num_output_tokens`, `.arrival_time`, `.is_finished()`;
`SchedulerOutput.num_scheduled_tokens`, `.total_num_scheduled_tokens`.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from scheduler import step_budget
from scheduler.chat_cache import ChatCacheSet
from scheduler.step import PrefillChunk, StepBatch
from scheduler.step_budget import (
    BatchPrefill,
    BatchStepTarget,
    InEngine,
    StepBudget,
    StepCredit,
    is_batch,
)
from scheduler.step_scale import StepTimeScale
from serving.engine_site import batch_eviction, chat_blocks, idle_hold
from serving.engine_site.control_channel import ControlChannel, Directive
from serving.engine_site.control_files import CONTROL_DIR_ENV, CONTROL_FILE, STATUS_FILE
from serving.engine_site.engine_status import EngineStatus, StepRecord
from serving.engine_site.step_log import STEP_LOG_ENV, StepLog

try:  # inside the engine, log through vLLM's logger so lines land in the replica's log
    from vllm.logger import init_logger

    _logger = init_logger("vllm.nightshift")
    _info, _warn = _logger.info, _logger.warning
except ImportError:  # pragma: no cover - only outside an engine venv
    import logging

    _logger = logging.getLogger("nightshift.engine_site")
    _info, _warn = _logger.info, _logger.warning


class _Plugin:
    """The plug-in's state beside one scheduler: channel, status, this step's budget.

    `scale` is the control document's latency model priced with this engine's own steps
    (`scheduler.step_scale`: the tail of its error over the recent steps that carried a batch
    chunk, forgotten after `SAMPLE_LIFE_S` so that a scale set too high cannot hold batch for good).
    Under a document with `tail_scale` (a fixed target) batch chunks are sized so that the *scaled*
    prediction fits the target: a target of T ms means batch steps of at most about T ms here.
    Under one without (a controller's), chunks are sized to the model as sent: the controller
    corrects the model by the measured/modelled ratio of the batch steps the status reports, and
    a second, faster correction inside the engine would fight it (one slow batch step sets the
    tail of a handful, and no chunk fits until that evidence expires).
    """

    def __init__(self, sched) -> None:
        folder = os.environ.get(CONTROL_DIR_ENV)
        self.logged: set[str] = set()
        self.channel = ControlChannel(Path(folder) / CONTROL_FILE, _info) if folder else None
        self.status = EngineStatus(Path(folder) / STATUS_FILE if folder else None)
        self.directive: Directive | None = None
        self.budget: StepBudget | None = None
        self.credit = StepCredit()
        self.pending: deque[tuple[float, StepRecord]] = deque()
        self.last_update = 0.0
        self.step_started = 0.0
        self.scale = StepTimeScale()
        self.applied_scale = 1.0
        """The scale this step's budget was sized with (1 under a document without `tail_scale`)."""
        self.last_token: dict[str, float] = {}
        self.held_back = False
        """Whether this step's budget granted a batch prefill nothing."""
        self.target_bound = False
        """Whether this step's target held a batch prefill back (`StepBudget.target_bound`)."""
        self.chat_reserved = False
        """Whether this step's budget reserved a chat prompt's prefill (batch then gets no room)."""
        self.chat_prefill_stalled = False
        """Whether the last step reserved chat prefill and vLLM scheduled none: the next step
        leaves the waiting chat prompts out of its reservation (`chat_reservation`)."""
        self.chat_cache = ChatCacheSet(sched.block_size)
        self.engine: object | None = None
        self.input_arrived: Callable[[float], bool] | None = None
        self.engine_looked_up = False
        self.last_hold: str | None = None
        """What ended the last step's hold (`idle_hold`), None when it did not hold."""
        self.max_hold_s = idle_hold.MAX_HOLD_S
        log = os.environ.get(STEP_LOG_ENV)
        self.step_log = StepLog(log) if log else None
        if log:
            _info("nightshift plug-in: recording every step to %s", log)
        if folder is None:
            _warn("nightshift plug-in: %s not set, so no control document: stock scheduling",
                  CONTROL_DIR_ENV)  # fmt: skip
        elif sched.policy.name != "PRIORITY":
            _warn("nightshift plug-in: scheduling-policy is %s, not priority: a waiting batch "
                  "request may be ahead of chat", sched.policy.name)  # fmt: skip
        _info("nightshift plug-in loaded (control folder %s)", folder)

    def once(self, where: str, exc: BaseException) -> None:
        """Log a failure at `where` the first time it happens; the step goes on as stock vLLM."""
        self.status.errors += 1
        if where not in self.logged:
            self.logged.add(where)
            _warn("nightshift plug-in: %s failed (%r); stock behaviour for such steps", where, exc)

    def control_fields(self) -> dict:
        d, ch = self.directive, self.channel
        return {
            "state": d.state if d else "inert",
            "control_seq": d.seq if d else None,
            "batch_step_target_ms": 1000 * d.target_s if d else None,
            "mean_step_target_ms": 1000 * d.mean_target_s if d and d.mean_target_s else None,
            "rejected": ch.rejected if ch else 0,
            "last_rejection": ch.last_rejection if ch else None,
            "chat_cache_tokens": self.chat_cache.tokens(time.monotonic(), self.cache_horizon()),
            "model_scale": self.applied_scale,
        }

    def cache_horizon(self) -> float | None:
        """How far back chat's prefix-cache working set is counted now (None: not counted)."""
        return self.directive.chat_cache_horizon_s if self.directive is not None else None

    # -- before vLLM schedules: the chat reservation and this step's budget --------------------

    def begin_step(self, sched) -> None:
        self.step_started = time.monotonic()
        self.budget = None
        self.held_back = self.target_bound = self.chat_reserved = False
        self.directive = self.channel.directive() if self.channel else None
        d = self.directive
        if d is None:
            return
        fixed, reserved = chat_reservation(sched, waiting=not self.chat_prefill_stalled)
        self.chat_reserved = bool(fixed.prefills)
        room = step_budget.batch_room(
            sched.max_num_scheduled_tokens, reserved, fixed, paused=not d.sizing
        )
        # Whether chat is in the engine matters only with an idle or a mean target; skip the
        # scan without.
        chat = (d.idle_target_s is None and d.mean_target_s is None) or step_budget.any_chat(
            map(_in_engine, [*sched.running, *sched.waiting])
        )
        target = BatchStepTarget(d.target_s, d.model, idle_target_s=d.idle_target_s,
                                 tail_scale=d.tail_scale, mean_target_s=d.mean_target_s)  # fmt: skip
        self.applied_scale = target.applied_scale(self.scale.at(self.step_started))
        self.budget = StepBudget(d.model, self.credit.step_target_s(target, chat)
                                 / self.applied_scale, room, fixed, sched.block_size,
                                 d.min_chunk_tokens)  # fmt: skip

    def cap(self, request, num_computed_tokens: int, num_new_tokens: int) -> int:
        """The chunk vLLM may schedule for `request`: its own for chat and decodes, the grant
        for a batch prefill."""
        left = request.num_tokens - num_computed_tokens
        if self.budget is None or left <= 1 or not is_batch(request.priority):
            return num_new_tokens
        granted = self.budget.grant(BatchPrefill(num_computed_tokens, left), limit=num_new_tokens)
        self.held_back |= granted == 0
        self.target_bound = self.budget.target_bound
        return granted

    # -- a step that held back everything: wait for something to change (`idle_hold`) ---------

    def hold_if_idle(self, sched, output) -> None:
        """Block while this step scheduled nothing only because the plug-in held back every
        request in the engine; the wait is taken out of the step's time."""
        self.last_hold = None
        if not self.held_back or output.total_num_scheduled_tokens or self.channel is None:
            return
        if _has_connector(sched) or sched.parallel_config.data_parallel_size > 1:
            return  # remote KV or another rank can change the step without engine input
        if any(not is_batch(r.priority) and not r.is_finished() for r in sched.requests.values()):
            return
        if not self.engine_looked_up:
            self.look_up_engine(sched)
        if self.input_arrived is None or not idle_hold.nothing_in_flight(self.engine):
            return
        channel, status, seen = self.channel, self.status, idle_hold.grant_key(self.directive)

        def poll() -> bool:
            self.directive = channel.directive()
            status.maybe_write(time.monotonic(), self.control_fields)
            return idle_hold.grant_key(self.directive) != seen

        started = time.monotonic()
        self.last_hold = idle_hold.hold(
            started + self.max_hold_s,
            lambda: min(channel.next_poll, status.next_write_at),
            self.input_arrived,
            poll,
            time.monotonic,
        )
        self.step_started += time.monotonic() - started

    def look_up_engine(self, sched) -> None:
        self.engine_looked_up = True
        self.engine = idle_hold.stepping_engine(sched)
        if self.engine is None:
            _info("nightshift plug-in: no engine core found stepping this scheduler; steps that "
                  "hold back every request are not held")  # fmt: skip
            return
        self.input_arrived = idle_hold.queue_waiter(self.engine.input_queue)
        _info("nightshift plug-in: a step holding back every request waits on the engine "
              "core's input queue")  # fmt: skip

    # -- after: what was scheduled, what it cost, what chat saw --------------------------------

    def scheduled(self, sched, output) -> None:
        rec = StepRecord(scheduled_at=time.time())
        chunks, decodes, context = [], 0, 0
        for rid, n in output.num_scheduled_tokens.items():
            req = sched.requests[rid]
            before = req.num_computed_tokens - n
            batch = is_batch(req.priority)
            if req.num_tokens - before <= 1:
                decodes, context = decodes + 1, context + before
                rec.batch_decode += n if batch else 0
                rec.chat_decode += 0 if batch else n
            else:
                chunks.append(PrefillChunk(n, before))
                rec.batch_prefill += n if batch else 0
                rec.chat_prefill += 0 if batch else n
        rec.step = StepBatch(tuple(chunks), decodes, context)
        self.chat_prefill_stalled = self.chat_reserved and not rec.chat_prefill
        rec.target_bound = self.target_bound
        if self.cache_horizon() is not None:
            self.chat_cache.taken(chat_blocks.taken_by_new_chat(sched, output))
        if self.directive is not None:
            rec.model_s = self.directive.model.step_seconds(rec.step)
            rec.predicted_s = rec.model_s * self.applied_scale
        self.credit.ran(rec.predicted_s)
        self.pending.append((self.step_started, rec))

    def log_step(self, step: StepBatch, seconds: float) -> None:
        """Record the step; a log that fails (disk full) ends, the status and chat gaps go on."""
        prefills = [(c.tokens, c.prefix_tokens) for c in step.prefills]
        try:
            self.step_log.record(prefills, step.decode_seqs, step.decode_context_tokens, seconds)
        except (OSError, ValueError) as exc:
            self.step_log = None
            self.once("step log", exc)

    def chat_counts(self, sched, output) -> list[tuple[object, int]]:
        reqs = (sched.requests.get(rid) for rid in output.num_scheduled_tokens)
        return [
            (r, r.num_output_tokens) for r in reqs if r is not None and not is_batch(r.priority)
        ]

    def updated(self, sched, chat_before: list[tuple[object, int]]) -> None:
        now, wall = time.monotonic(), time.time()
        if self.pending:
            started, rec = self.pending.popleft()
            # From the start of this step's scheduling, or from the last output where steps
            # overlap (the asynchronous scheduler plans step n+1 while step n runs).
            seconds = now - max(started, self.last_update)
            self.status.step(rec, seconds)
            if rec.model_s and rec.batch_prefill:
                self.scale.observe(now, seconds, rec.model_s)
            if self.step_log is not None and rec.step is not None and _has_work(rec.step):
                self.log_step(rec.step, seconds)
        self.last_update = now
        for req, count in chat_before:
            if req.num_output_tokens <= count:
                continue
            last = self.last_token.get(req.request_id)
            if last is None:
                self.status.chat_ttft.observe(max(0.0, wall - req.arrival_time))
            else:
                self.status.chat_itl.observe(now - last)
            self.last_token[req.request_id] = now
            if req.is_finished():
                del self.last_token[req.request_id]
                self.status.chat_e2e.observe(max(0.0, wall - req.arrival_time))
                self.status.chat_answer_tokens.observe(req.num_output_tokens)
        drained = sched.get_num_unfinished_requests() == 0
        if self.status.maybe_write(now, self.control_fields, drained):
            for rid in [r for r in self.last_token if r not in sched.requests]:
                del self.last_token[rid]


def _has_connector(sched) -> bool:
    return sched.connector is not None or getattr(sched, "ec_connector", None) is not None


def _has_work(step: StepBatch) -> bool:
    """vLLM also runs steps that schedule no token (requests waiting on KV or finishing); they
    time the loop, not the model, and are no sample of it."""
    return bool(step.prefills or step.decode_seqs)


def chat_reservation(sched, waiting: bool = True) -> tuple[StepBatch, int]:
    """`scheduler.step_budget.chat_reservation` over this vLLM scheduler's queues (its waiting
    queue left out unless `waiting`)."""
    step_tokens = sched.max_num_scheduled_tokens
    seats = sched.max_num_running_reqs - len(sched.running)
    return step_budget.chat_reservation(
        map(_in_engine, sched.running),
        map(_in_engine, sched.waiting if waiting else ()),
        step_tokens,
        sched.scheduler_config.long_prefill_token_threshold or step_tokens,
        seats,
    )


def _in_engine(req) -> InEngine:
    computed = req.num_computed_tokens
    return InEngine(req.num_tokens - computed, computed, is_batch(req.priority))


class BudgetSchedulerMixin:
    """The overrides; everything else is vLLM's. Put before the vLLM class in the bases."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._nightshift = _Plugin(self)

    def schedule(self, *args, **kwargs):
        plugin = self._nightshift
        try:
            plugin.begin_step(self)
        except Exception as exc:  # noqa: BLE001 - never let the plug-in stop the engine
            plugin.budget = None
            plugin.once("step budget", exc)
        output = super().schedule(*args, **kwargs)
        plugin.budget = None
        try:
            plugin.hold_if_idle(self, output)
        except Exception as exc:  # noqa: BLE001
            plugin.once("idle hold", exc)
        try:
            plugin.scheduled(self, output)
        except Exception as exc:  # noqa: BLE001
            plugin.once("step record", exc)
        return output

    def _reserve_prefill_lookahead(self, request, num_computed_tokens, num_new_tokens):
        n = super()._reserve_prefill_lookahead(request, num_computed_tokens, num_new_tokens)
        plugin = self._nightshift
        if plugin.budget is None or n <= 0:
            return n
        try:
            return min(n, plugin.cap(request, num_computed_tokens, n))
        except Exception as exc:  # noqa: BLE001
            plugin.budget = None
            plugin.once("chunk cap", exc)
            return n

    def update_from_output(self, scheduler_output, model_runner_output):
        plugin = self._nightshift
        try:
            chat_before = plugin.chat_counts(self, scheduler_output)
        except Exception as exc:  # noqa: BLE001
            chat_before = []
            plugin.once("chat tokens", exc)
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        try:
            plugin.updated(self, chat_before)
        except Exception as exc:  # noqa: BLE001
            plugin.once("status", exc)
        return outputs

    def _free_request_blocks(self, request):
        plugin, blocks = self._nightshift, []
        batch = is_batch(request.priority)
        if plugin.directive is not None and (batch or plugin.cache_horizon() is not None):
            try:
                blocks = batch_eviction.request_blocks(self, request)
            except Exception as exc:  # noqa: BLE001
                plugin.once("freed blocks", exc)
        super()._free_request_blocks(request)
        if blocks and batch:
            try:
                batch_eviction.evict_first(self, blocks)
            except Exception as exc:  # noqa: BLE001
                plugin.once("batch eviction order", exc)
        elif blocks:
            try:
                plugin.chat_cache.left(chat_blocks.left_cached(blocks), time.monotonic())
            except Exception as exc:  # noqa: BLE001
                plugin.once("chat cache", exc)


try:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
except ImportError:  # pragma: no cover - the control plane imports this module without vLLM
    pass
else:

    class BudgetScheduler(BudgetSchedulerMixin, Scheduler):
        """vLLM's synchronous v1 scheduler with the batch step budget (CPU replicas)."""

    class AsyncBudgetScheduler(BudgetSchedulerMixin, AsyncScheduler):
        """vLLM's asynchronous v1 scheduler with the batch step budget (GPU replicas)."""
