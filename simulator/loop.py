"""The discrete-event loop: pop the earliest event, let it act, push what it returns (Vidur style)."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING

from simulator.events import Event

if TYPE_CHECKING:
    from simulator.simulation import Simulation


class EventLoop:
    """A heap of pending events. Events at equal times run in the order they were pushed, so a run
    is deterministic for a seed."""

    def __init__(self, sim: Simulation, initial: list[Event]) -> None:
        self.sim = sim
        self._order = itertools.count()
        self._heap = [(e.t, next(self._order), e) for e in initial]
        heapq.heapify(self._heap)
        self.handled = 0

    def run(self, until: float, stop: Callable[[], bool] | None = None) -> None:
        """Handle events up to time `until`, or until `stop()` holds after one of them."""
        heap, sim, order = self._heap, self.sim, self._order
        push, pop = heapq.heappush, heapq.heappop
        while heap and heap[0][0] <= until:
            if stop is not None and stop():
                return
            t, _, event = pop(heap)
            sim.now = t
            for follow in event.handle(sim):
                push(heap, (follow.t, next(order), follow))
            self.handled += 1
        if stop is None or not stop():
            sim.now = until
