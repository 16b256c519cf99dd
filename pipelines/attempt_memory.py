"""What a failed pipeline attempt leaves in the driver's memory, given back before the next.

The flow retries the pipeline in the same process (a Gate lost mid-night, say). The failed
attempt's datasets, corpus table and executor are unreachable then but sit in reference cycles (an
exception's traceback holds the frames that hold them), which Python frees only when its cycle
collector next runs a full pass; and memory that is freed stays in the process: Arrow's allocator
and glibc's heap keep their free pages for reuse. Unless both are given back, the driver carries
the failed attempt's peak on top of the retry's for the rest of the night. Collecting the cycles
drops their Ray object references too, so the object store can free the attempt's blocks.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging

log = logging.getLogger(__name__)


def release_unreferenced() -> None:
    """Collect every unreachable object now, then hand free pages back to the OS. Costs a full
    collection (well under a second for a driver's heap), so it runs once per attempt."""
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
