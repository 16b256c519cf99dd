"""The engine core's wait while the plug-in holds back everything in the engine.

vLLM's engine core steps as long as its scheduler has requests (`EngineCore.step`: schedule,
execute, update, then a 1 ms sleep when nothing ran), whatever a step schedules. When the plug-in
grants batch prefill nothing (the controller paused batch, its document expired or was lost, or no
chunk fits the target) and no chat is in the engine, every step is empty and the loop goes round
as fast as it can: each round a schedule, an empty model step (a round trip to the worker
process, where the model runs in one) and a stats message to the API server, CPU taken from the
host's chat work (tokenizing, detokenizing) exactly while the controller is protecting chat.

So such a step *holds*: before it returns its empty schedule, it blocks on the engine core's own
input queue (a `queue.Queue` that vLLM's input thread fills with every new request, abort,
utility call and shutdown wake-up, so only the core loop waits, never the socket) until one of:

- a message arrives in that queue: a chat (or anything else) wakes it at once;
- the control channel, polled at its own interval throughout, says something that could change
  the grants: batch released (a document that sizes), or a new document while sizing. A pause
  renewed, or one that expires or is lost, still grants nothing and does not wake it;
- `MAX_HOLD_S` passed: a safety net for a way of changing the step this module does not know.

While it holds, the status document goes on being written when due (with the channel's state),
so a reader sees the plug-in as it is; the engine's own stats to the API server are not sent,
and they cannot change without a step.

Invariant: **a hold ends no later than the first moment something that could change the next
step may have happened** -- engine input, or a directive under which batch could be granted
something new -- and never later than `MAX_HOLD_S`. Nothing else can make a held-back step
schedule work: with no chat in the engine and nothing scheduled, the plug-in's grants depend only
on the directive (the step-time scale learns from steps with work only). A chat arriving during a
hold waits for the queue's notify, one empty round and vLLM's 1 ms sleep before it is scheduled.

Why the bound is longer than a status interval: where the model runs in a worker process, every
message the engine core sends it keeps the worker polling its shared-memory queue for the next
second (vLLM's reader busy-loops for 1 s after each read before it parks); a hold ended every
second would keep it polling for good. The wait is left out of the step's measured time: it is no
engine work.

vLLM private names this depends on: the engine core that calls `schedule` is found on the call
stack as the object whose `.scheduler` is the plug-in's scheduler and whose `.input_queue` is a
`queue.Queue` (`EngineCoreProc`); its `.batch_queue`, when it has one, must be empty (a step in
flight under asynchronous scheduling is never held up). Where none is found (a scheduler driven by
hand, or a vLLM that moved these), steps are not held and vLLM loops as before.
"""

from __future__ import annotations

import queue
import sys
from collections.abc import Callable

INPUT = "input"
CONTROL = "control"
DUE = "due"
MAX_HOLD_S = 5.0
"""The longest hold: as long as vLLM's own idle shared-memory reader goes without re-checking its
queue (`shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS`), the delay vLLM accepts for a lost wake-up."""


def grant_key(directive) -> tuple | None:
    """What a held-back step's grants depend on in a `control_channel.Directive`: the document
    while it sizes; nothing while batch is held (paused, expired, lost: 0 whatever the document);
    None is stock (no document)."""
    if directive is None:
        return None
    return ("sizing", directive.seq) if directive.sizing else ("held",)


def hold(
    deadline: float,
    next_poll: Callable[[], float],
    input_arrived: Callable[[float], bool],
    poll: Callable[[], bool],
    clock: Callable[[], float],
) -> str:
    """Block until engine input, a poll that says the step may change, or `deadline`; which one
    ended it.

    `input_arrived(timeout_s)` waits up to `timeout_s` for input and says whether there is some;
    `poll()` does what is due (the control channel reads its file only once its poll is due, the
    status is written when due, both at `next_poll()` at the earliest) and says whether the
    directive changed what batch could be granted. Waits are sliced at `next_poll()`, so a new
    document is seen one channel poll interval after it lands, as without a hold."""
    while True:
        now = clock()
        if now >= deadline:
            return DUE
        if input_arrived(max(0.0, min(deadline, next_poll()) - now)):
            return INPUT
        if poll():
            return CONTROL


def queue_waiter(q: queue.Queue) -> Callable[[float], bool]:
    """`input_arrived` for a `queue.Queue`: woken by `put`'s notify, takes nothing out."""

    def arrived(timeout_s: float) -> bool:
        with q.not_empty:
            if not q.queue and timeout_s > 0:
                q.not_empty.wait(timeout_s)
            return bool(q.queue)

    return arrived


def stepping_engine(sched) -> object | None:
    """The engine core on the call stack that steps `sched`, or None (see the module docstring)."""
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if getattr(owner, "scheduler", None) is sched and isinstance(
            getattr(owner, "input_queue", None), queue.Queue
        ):
            return owner
        frame = frame.f_back
    return None


def nothing_in_flight(engine) -> bool:
    """Whether `engine` has no step in flight (asynchronous scheduling keeps a batch queue)."""
    return not getattr(engine, "batch_queue", None)
