"""The process's heap set aside from the cyclic collector while a latency measurement runs.

The chat load stamps each streamed token when its own event loop reads it, so anything that stops
the process stops the clock's reader: a full collection of the bench process (Ray's driver, the
tokenizer, pyarrow, the records of the scenarios before) takes tenths of a second on a small
host, and a chat prompt in flight across it reads that much more TTFT than the engine gave it.
Objects that outlive start-up are almost never garbage, so while a load runs they are frozen
(`gc.freeze`: moved to a generation the collector never scans) and its full collections cost in
proportion to what the load itself made. The engine's processes do the same after start-up.

What is frozen is never collected, so the heap is collected first: garbage cycles left by the
work before (a finished pipeline's executor, holding its Ray actors and their CPUs) must not be
carried through the load, or the next pipeline waits for resources nothing will free. Frozen
unreferenced cycles are the cost: an object alive on entry that becomes cyclic garbage during the
load is freed only after it (freeing by reference count is unaffected).

Invariant: inside `frozen_heap()` every object the process held on entry is frozen, and none was
unreachable then; on the last exit (entries nest, and loads may overlap) the collector sees them
all again, so nothing frozen here outlives the measurement.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Collect, then freeze the heap for the duration of the block; see the module docstring."""
    global _depth
    with _lock:
        if _depth == 0:  # nested: the outer block measures, and a full collection would stall it
            gc.collect()
        gc.freeze()  # on a nested entry, what the outer block has made since is frozen too
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                gc.unfreeze()
