"""The state of one simulated run and the few actions events share: submit, admit, control, finish.

Chat sessions stick to one replica (their history is cached there), new sessions and trace requests
go to the least-loaded replica. Batch work enters only through the dispatcher, under the caps the
admission policy last decided for each replica; until a first decision exists, batch waits. At the
end of the run, batch in flight is cancelled and chat in flight drains, as a load generator waits
for the answers it is owed: no chat request is cut off just because the clock ran out.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from scheduler.admission import AdmissionPolicy, Decision
from scheduler.step import StepTimeModel
from scheduler.step_budget import BatchStepTarget
from simulator.config import SimConfig
from simulator.dispatcher import BatchDispatcher
from simulator.entities import Request
from simulator.events import (
    BacklogArrival,
    ControlTick,
    EngineArrival,
    Event,
    SessionStart,
    StepEnd,
    TraceArrival,
    TurnSubmit,
)
from simulator.recorder import Recorder
from simulator.replica import Replica
from simulator.trace import TraceRow, read_trace, scale_trace
from simulator.workloads import ChatSession, ChatSessions

PolicyFactory = Callable[[str], AdmissionPolicy]
"""Builds the admission policy of one replica, given the replica's name."""


class Simulation:
    """Replicas, workloads, dispatcher, policies and records of one run, at virtual time `now`."""

    def __init__(
        self,
        cfg: SimConfig,
        model: StepTimeModel,
        policy_factory: PolicyFactory,
        trace: list[TraceRow] | None = None,
    ) -> None:
        self.cfg = cfg
        self.now = 0.0
        window = cfg.control.observe_window_s or cfg.control.interval_s
        per_window = math.ceil(window / cfg.control.interval_s - 1e-9)
        self.replicas = [
            Replica(f"{cfg.name}-{i}", cfg.engine, model, per_window, cfg.seed)
            for i in range(cfg.replicas)
        ]
        self.by_name = {r.name: r for r in self.replicas}
        self.policies = {r.name: policy_factory(r.name) for r in self.replicas}
        self.sessions = ChatSessions(cfg.chat, cfg.seed)
        if trace is None and cfg.chat.trace:
            trace = scale_trace(read_trace(cfg.chat.trace), speedup=cfg.chat.trace_speedup)
        self.trace = trace or []
        self.dispatcher = BatchDispatcher(cfg.batch, list(self.by_name))
        self.recorder = Recorder(cfg.run_id)
        self.session_of: dict[str, ChatSession] = {}
        self.accepting = True
        self.chat_in_flight = 0
        self.arriving: dict[str, Request] = {}
        """Requests submitted and not yet past the API server (`request_overhead_s`)."""
        self.batch_prefill_by_window: dict[int, int] = {}
        """Batch prompt tokens prefilled per SLO window (index `t // slo.window_s`), finished
        requests or not: the batch work a window carried, which completed requests alone
        undercount in a run shorter than a document takes."""

    def initial_events(self) -> list[Event]:
        # The first decision comes before anything else at t=0, so batch never runs uncapped.
        events: list[Event] = [ControlTick(0.0)]
        if self.cfg.batch.docs:
            events.append(BacklogArrival(self.cfg.batch.start_s))
        if self.cfg.chat.rate > 0:
            events.append(SessionStart(self.sessions.session_gap_s()))
        if self.trace:
            events.append(TraceArrival(self.trace[0].t_s, 0))
        return events

    def least_loaded(self) -> int:
        """Index of the replica with the fewest requests in its engine."""
        loads = [len(r.engine.running) + r.engine.num_waiting for r in self.replicas]
        return loads.index(min(loads))

    def submit(self, req: Request, replica: Replica) -> list[Event]:
        """Send `req` to `replica`: it reaches the engine `request_overhead_s` later."""
        reason = replica.reject_reason(req)
        if reason is not None:
            req.replica = replica.name
            self.recorder.finish(req, self.now, status="error", error=reason)
            return self._after(req, ok=False)
        if req.cls == "chat":
            self.chat_in_flight += 1
        overhead = replica.params.request_overhead_s
        if overhead > 0:
            req.replica = replica.name
            self.arriving[req.request_id] = req
            return [EngineArrival(self.now + overhead, req, replica)]
        return self.enter(req, replica)

    def enter(self, req: Request, replica: Replica) -> list[Event]:
        """Hand `req` to `replica`'s engine, waking the replica if it was idle."""
        self.arriving.pop(req.request_id, None)
        replica.submit(req)
        return [] if replica.busy else self._start(replica)

    def _start(self, replica: Replica) -> list[Event]:
        end = replica.start_step(self.now)
        return [] if end is None else [StepEnd(end, replica)]

    def end_step(self, replica: Replica) -> list[Event]:
        """Apply `replica`'s finished step, then start its next one (with any newly admitted work)."""
        step = replica.step
        outcome = replica.end_step(self.now)
        batch_prefill = sum(n for r, n in step.prefills if r.cls == "batch")
        if batch_prefill:
            w = int(self.now // self.cfg.slo.window_s)
            self.batch_prefill_by_window[w] = self.batch_prefill_by_window.get(w, 0) + batch_prefill
        follow: list[Event] = []
        for req in outcome.finished:
            self.recorder.finish(req, self.now)
            if req.cls == "chat":
                self.chat_in_flight -= 1
            follow.extend(self._after(req, ok=True))
        if any(r.cls == "batch" for r in outcome.first_tokens):
            follow.extend(self.admit_batch(replica))  # its prefill left the prefill budget
        follow.extend(self._start(replica))
        return follow

    def _after(self, req: Request, ok: bool) -> list[Event]:
        if req.cls == "batch":
            self.dispatcher.finished(req, self.now, ok)
            return self.admit_batch(self.by_name[req.replica])
        session = self.session_of.pop(req.request_id, None)
        if session is None or not ok or session.turns_left <= 0:
            return []
        self.sessions.record_answer(session, req)
        return [TurnSubmit(self.now + self.sessions.think_time_s(session), session)]

    def admit_batch(self, replica: Replica) -> list[Event]:
        """Submit whatever batch work `replica`'s current caps allow."""
        follow: list[Event] = []
        if not self.accepting:
            return follow
        for req in self.dispatcher.admit(replica.name, self.now):
            follow.extend(self.submit(req, replica))
        return follow

    def control(self) -> list[Event]:
        """Observe every replica, ask its policy, apply the decision and admit under it."""
        follow: list[Event] = []
        for replica in self.replicas:
            engine = replica.engine
            kv = replica.kv
            obs = replica.sensor.observe(
                self.now, replica.name, kv.usage, engine.running, engine.waiting(),
                kv.num_blocks * kv.block_size, plug_in_ratio(replica),
                engine.chat_cache_tokens(self.now),
            )  # fmt: skip
            decision = self.policies[replica.name].decide(obs)
            self.recorder.decision(obs, decision)
            self.dispatcher.set_decision(replica.name, decision)
            engine.batch_target = plug_in_target(decision, replica.model)
            engine.chat_cache_horizon_s = decision.chat_cache_horizon_s
            follow.extend(self.admit_batch(replica))
        return follow

    def end_intake(self) -> None:
        """The run's duration is over: no more arrivals or decisions, and batch work in flight is
        cancelled (the nightly job stops at its deadline) while chat in flight may finish."""
        self.accepting = False
        for replica in self.replicas:
            engine = replica.engine
            batch = [r for r in engine.running + engine.waiting() if r.cls == "batch"]
            engine.abort(batch, replica.step)
            for req in batch:
                self.recorder.finish(req, self.now, status="cancelled")

    def close(self) -> None:
        """Record every request still in an engine, or on its way to one, as cancelled at the
        end of the run."""
        for replica in self.replicas:
            for req in replica.engine.running + replica.engine.waiting():
                self.recorder.finish(req, self.now, status="cancelled")
        for req in self.arriving.values():
            self.recorder.finish(req, self.now, status="cancelled")


def plug_in_ratio(replica) -> float | None:
    """The measured over modelled step time a replica's plug-in reports over its steps that
    carried a batch chunk: the replica's `step_time_ratio` times its steps' mean spread (None
    while the engine runs stock)."""
    if replica.engine.batch_target is None:
        return None
    return replica.params.step_time_ratio * replica.spread.mean


def plug_in_target(decision: Decision, model: StepTimeModel) -> BatchStepTarget | None:
    """What the replica's engine plug-in applies under `decision`: its batch step target, priced
    with the replica's own step model (the fit the controller sends); None leaves the engine stock,
    as a policy that writes no control document does."""
    if decision.batch_step_target_ms is None:
        return None
    idle, mean = decision.idle_step_target_ms, decision.mean_step_target_ms
    return BatchStepTarget(
        decision.batch_step_target_ms / 1000,
        model,
        paused=decision.pause,
        idle_target_s=None if idle is None else idle / 1000,
        tail_scale=decision.tail_scale,
        mean_target_s=None if mean is None else mean / 1000,
    )
