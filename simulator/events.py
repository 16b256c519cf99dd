"""The events of a simulated run. Each one acts on the simulation and returns its follow-up events.

Arrivals generate the next arrival themselves, so a run never holds more than one pending arrival
per source: an hour of traffic costs no memory up front. Once the run stops accepting work (its
duration is over and chat in flight drains), arrivals and decisions do nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from simulator.entities import Request
from simulator.replica import Replica
from simulator.workloads import ChatSession, trace_request

if TYPE_CHECKING:
    from simulator.simulation import Simulation


@dataclass(slots=True)
class Event:
    """Something that happens at virtual time `t`."""

    t: float

    def handle(self, sim: Simulation) -> list[Event]:
        raise NotImplementedError


@dataclass(slots=True)
class StepEnd(Event):
    """A replica's engine step finishes: tokens land, requests end, the next step starts."""

    replica: Replica

    def handle(self, sim: Simulation) -> list[Event]:
        return sim.end_step(self.replica)


@dataclass(slots=True)
class EngineArrival(Event):
    """A submitted request reaches its replica's engine, past the API server."""

    request: Request
    replica: Replica

    def handle(self, sim: Simulation) -> list[Event]:
        return sim.enter(self.request, self.replica)


@dataclass(slots=True)
class SessionStart(Event):
    """A new chat user arrives (Poisson) and sends the first turn."""

    def handle(self, sim: Simulation) -> list[Event]:
        if not sim.accepting:
            return []
        session = sim.sessions.new_session()
        session.replica = sim.least_loaded()
        nxt = SessionStart(self.t + sim.sessions.session_gap_s())
        return [nxt, TurnSubmit(self.t, session)]


@dataclass(slots=True)
class TurnSubmit(Event):
    """A chat user sends their next turn, to the replica that holds their history."""

    session: ChatSession

    def handle(self, sim: Simulation) -> list[Event]:
        if not sim.accepting:
            return []
        req = sim.sessions.next_turn(self.session, self.t)
        sim.session_of[req.request_id] = self.session
        return sim.submit(req, sim.replicas[self.session.replica])


@dataclass(slots=True)
class TraceArrival(Event):
    """Row `index` of the replayed trace arrives."""

    index: int

    def handle(self, sim: Simulation) -> list[Event]:
        if not sim.accepting:
            return []
        req = trace_request(sim.trace[self.index], self.index, sim.cfg.chat, self.t)
        follow = sim.submit(req, sim.replicas[sim.least_loaded()])
        nxt = self.index + 1
        if nxt < len(sim.trace):
            follow.append(TraceArrival(sim.trace[nxt].t_s, nxt))
        return follow


@dataclass(slots=True)
class BacklogArrival(Event):
    """The nightly batch backlog appears; admission starts under the current decisions."""

    def handle(self, sim: Simulation) -> list[Event]:
        if not sim.accepting:
            return []
        sim.dispatcher.add_backlog(sim.cfg.batch.docs, sim.cfg.batch.doc_tokens)
        return [e for r in sim.replicas for e in sim.admit_batch(r)]


@dataclass(slots=True)
class ControlTick(Event):
    """The admission policy observes every replica and decides its batch caps."""

    def handle(self, sim: Simulation) -> list[Event]:
        if not sim.accepting:
            return []
        follow = sim.control()
        follow.append(ControlTick(self.t + sim.cfg.control.interval_s))
        return follow
