"""What the work before a run left in the driver's process, given back before the run starts.

A process may run several nights, or attempts of one: the flow retries the pipeline in the same
process (a Gate lost mid-night, say), and a benchmark runs one night per scenario. What the work
before left sits in reference cycles (an exception's traceback holds the frames that hold a failed
attempt's datasets, corpus table and executor; a night stopped early leaves Ray Data's actor pool
reachable only from such cycles), which Python frees only when its cycle collector next runs a
full pass. Until then the pool's actors live and hold their Ray CPUs, so the next night's first
task waits for whenever a collection next runs; and the memory, once freed, stays in the process:
Arrow's allocator and glibc's heap keep their free pages for reuse. Unless both are given back, a
night waits on its predecessor's actors and carries its peak on top of its own.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging

log = logging.getLogger(__name__)


def release_unreferenced() -> None:
    """Collect every unreachable object now (Ray ends the actors whose last handle goes), then
    hand free pages back to the OS. Costs a full collection (well under a second for a driver's
    heap), so it runs once per run."""
    gc.collect()
    try:
        import pyarrow as pa

        pa.default_memory_pool().release_unused()
    except Exception:  # noqa: BLE001 - an allocator without the call keeps its pages, no more
        log.debug("Arrow's memory pool kept its free pages", exc_info=True)
    _malloc_trim()


def _malloc_trim() -> None:
    """glibc's `malloc_trim(0)`: return the heap's free pages; absent elsewhere, a no-op."""
    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
