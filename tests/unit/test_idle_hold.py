"""The hold of a step that held back every request (serving/engine_site/idle_hold.py), on a fake
clock: what ends it, and that it never waits past a control poll or its deadline."""

from __future__ import annotations

import queue

from scheduler.latency_model import LatencyModel
from serving.engine_site import idle_hold
from serving.engine_site.control_channel import Directive

POLL_S = 0.025


class World:
    """A fake clock with a control channel polled every POLL_S and engine input that lands at
    `input_at`; the directive changes at the first poll at or after `change_at`."""

    def __init__(self, input_at: float = float("inf"), change_at: float = float("inf")) -> None:
        self.now = 0.0
        self.next_poll = POLL_S
        self.input_at, self.change_at = input_at, change_at
        self.waits: list[tuple[float, float]] = []
        self.polls_due: list[float] = []
        """The channel's next poll when each wait began."""
        self.polls: list[float] = []

    def clock(self) -> float:
        return self.now

    def arrived(self, timeout_s: float) -> bool:
        self.waits.append((self.now, timeout_s))
        self.polls_due.append(self.next_poll)
        if self.input_at <= self.now + timeout_s:
            self.now = max(self.now, self.input_at)
            return True
        self.now += timeout_s
        return False

    def changed(self) -> bool:
        if self.now < self.next_poll:
            return False
        self.polls.append(self.now)
        self.next_poll = self.now + POLL_S
        return self.now >= self.change_at

    def hold(self, deadline: float) -> str:
        return idle_hold.hold(deadline, lambda: self.next_poll, self.arrived, self.changed,
                              self.clock)  # fmt: skip


def test_engine_input_ends_the_hold_when_it_lands():
    w = World(input_at=0.0613)
    assert w.hold(deadline=1.0) == idle_hold.INPUT
    assert w.now == 0.0613


def test_input_already_there_ends_it_at_once():
    w = World(input_at=0.0)
    assert w.hold(deadline=1.0) == idle_hold.INPUT
    assert w.now == 0.0 and len(w.waits) == 1


def test_a_changed_directive_ends_it_at_the_first_poll_that_sees_it():
    w = World(change_at=0.06)
    assert w.hold(deadline=1.0) == idle_hold.CONTROL
    assert w.now == w.polls[-1] and 0.06 <= w.now < 0.06 + POLL_S + 1e-9


def test_no_wait_runs_past_the_next_poll_or_the_deadline():
    w = World()
    assert w.hold(deadline=0.31) == idle_hold.DUE
    assert w.now == 0.31
    for (start, timeout), poll_due in zip(w.waits, w.polls_due, strict=True):
        assert start + timeout <= min(0.31, poll_due) + 1e-9
    assert len(w.polls) == 12, "the channel was polled at every interval"


def test_a_deadline_already_past_does_not_wait():
    w = World()
    w.now = 2.0
    assert w.hold(deadline=1.0) == idle_hold.DUE
    assert w.waits == []


def test_an_overdue_poll_is_polled_without_a_negative_wait():
    w = World(change_at=0.0)
    w.now, w.next_poll = 0.5, 0.1
    assert w.hold(deadline=1.0) == idle_hold.CONTROL
    assert w.waits == [(0.5, 0.0)]


def test_the_queue_waiter_sees_input_without_taking_it():
    q: queue.Queue = queue.Queue()
    arrived = idle_hold.queue_waiter(q)
    assert arrived(0.0) is False
    q.put_nowait(("ADD", "chat"))
    assert arrived(60.0) is True, "input already queued returns at once"
    assert q.get_nowait() == ("ADD", "chat")


def directive(state: str, seq: int, target_ms: float = 20.0) -> Directive:
    return Directive(state, seq, target_ms / 1000, LatencyModel(), 0)


def test_a_hold_watches_only_what_could_grant_batch_something():
    held = {idle_hold.grant_key(directive(s, q)) for s in ("paused", "expired", "lost")
            for q in (1, 2)}  # fmt: skip
    assert len(held) == 1, "a renewed, expired or lost pause still grants nothing"
    active = idle_hold.grant_key(directive("active", 1))
    assert active not in held, "batch released"
    assert idle_hold.grant_key(directive("active", 2, 40.0)) != active, "a new target"
    assert idle_hold.grant_key(None) not in held | {active}, "stock"


class Engine:
    """Stands where vLLM's engine core does: it owns the scheduler and the input queue and calls
    `schedule` from its own method."""

    def __init__(self, scheduler) -> None:
        self.scheduler = scheduler
        self.input_queue: queue.Queue = queue.Queue()
        self.batch_queue = None

    def step(self):
        return self.scheduler.schedule()


class Scheduler:
    def schedule(self):
        return idle_hold.stepping_engine(self)


def test_the_engine_stepping_a_scheduler_is_found_on_the_call_stack():
    sched = Scheduler()
    engine = Engine(sched)
    assert engine.step() is engine
    assert sched.schedule() is None, "called by hand, there is no engine core"
    assert Engine(Scheduler()).step() is not engine


def test_a_step_in_flight_is_never_held_up():
    engine = Engine(Scheduler())
    assert idle_hold.nothing_in_flight(engine)
    engine.batch_queue = [object()]
    assert not idle_hold.nothing_in_flight(engine)
