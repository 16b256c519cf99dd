"""The soak's processes as /proc shows them: trees, resident memory, and stopping what is left.

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
import time
from collections.abc import Iterable
from pathlib import Path

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


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state first), or None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _parents() -> dict[int, tuple[int, str]]:
    """Every process's parent and state."""
    out = {}
    for d in Path("/proc").glob("[0-9]*"):
        fields = _stat(int(d.name))
        if fields is not None:
            out[int(d.name)] = (int(fields[1]), fields[0])
    return out


def descendants(pid: int) -> set[int]:
    """Every live (not zombie) process below `pid`, at any depth."""
    parents = _parents()
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, (parent, _) in parents.items() if parent in frontier} - found
        found |= frontier
    return {p for p in found if parents[p][1] != "Z"}


def alive(pids: Iterable[int]) -> set[int]:
    return {p for p in pids if (f := _stat(p)) is not None and f[0] != "Z"}


def command(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:300]


def rss_kib(pid: int) -> int | None:
    """VmRSS of `pid` in KiB; None once it is gone (or a kernel thread, which has none)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def reap_orphans() -> None:
    """Collect the exit status of reparented children that have ended, except those a Popen
    object waits for (`popen_child`)."""
    mine = os.getpid()
    for pid, (parent, state) in _parents().items():
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
    """Wait up to `timeout_s` for `pids` to end; returns those still alive then."""
    pids = set(pids)
    deadline = time.monotonic() + timeout_s
    while (left := alive(pids)) and time.monotonic() < deadline:
        reap_orphans()
        time.sleep(0.25)
    return left
