"""The soak's hold on its processes: orphans reparented to it, reaped, and stopped at its end.

The soak makes itself a child subreaper (Linux `PR_SET_CHILD_SUBREAPER`): a process it started,
at any depth, whose parent dies (a `nightshift run` killed with -9 leaves Ray's agents behind for a
minute or two) is reparented to the soak rather than to init. So `descendants(os.getpid())` is
always everything the night started and has not ended, and the soak can stop all of it at its end.
Reparented processes become its children: `reap_orphans` collects their exit statuses, skipping
the children whose `subprocess.Popen` objects wait for their own.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from collections.abc import Iterable

from bench import processes
from bench.processes import alive, parents

PR_SET_CHILD_SUBREAPER = 36
_WAITED_BY_POPEN: set[int] = set()
"""Children whose `subprocess.Popen` reads their exit status: `reap_orphans` leaves them alone
(a status collected elsewhere reads as 0 to Popen)."""


def popen_child(pid: int) -> int:
    """Mark `pid` as a child whose Popen object waits for it; returns it."""
    _WAITED_BY_POPEN.add(pid)
    return pid


def become_subreaper() -> bool:
    """Ask the kernel to reparent orphaned descendants to this process; False where it refuses."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def reap_orphans() -> None:
    """Collect the exit status of reparented children that have ended, except those a Popen
    object waits for (`popen_child`)."""
    mine = os.getpid()
    for pid, (parent, state) in parents().items():
        if parent == mine and state == "Z" and pid not in _WAITED_BY_POPEN:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)


def stop_all(pids: Iterable[int], grace_s: float = 10.0) -> set[int]:
    """SIGCONT and SIGTERM each of `pids` (a stopped process cannot act on SIGTERM), SIGKILL what
    is still there after `grace_s`; returns those that needed SIGKILL."""
    pids = alive(pids)
    for pid in pids:
        for sig in (signal.SIGCONT, signal.SIGTERM):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
    left = wait_gone(pids, grace_s)
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    wait_gone(left, 5.0)
    return left


def wait_gone(pids: Iterable[int], timeout_s: float) -> set[int]:
    """`bench.processes.wait_gone`, reaping orphans while it waits (their zombies would
    otherwise never read as gone to the soak, their parent)."""
    return processes.wait_gone(pids, timeout_s, while_waiting=reap_orphans)
