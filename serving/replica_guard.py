"""The leader of a replica's process group when the replica belongs to its caller (a run, a
bench, a test): it starts the engine as its child and stops the whole group when the caller dies.

The kernel's parent-death signal alone was not enough. It reaches one process, the engine's API
server, which must then stop its engine core. Early in start-up that chain has gaps: the API server
binds its port and forks the engine core (which inherits the listening socket) before its own
shutdown path knows about the core, and a SIGTERM in that window ended the API server and left the
core running with parent 1, holding the port, the cores and the memory. This guard does not depend
on vLLM's shutdown: on its caller's death, or on SIGTERM/SIGINT, it signals the whole group
(SIGTERM, then SIGKILL after `GRACE_S`); when the engine exits by itself, whatever it left in the
group goes with it. It also checks its parent after asking for the signal, which closes the window
between fork and `prctl` in which a caller's death would go unnoticed.

    python -m serving.replica_guard PARENT_PID ENGINE_ARGV...
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time

GRACE_S = 10.0
POLL_S = 0.5


STARTER_ENV = "NIGHTSHIFT_STARTER_PID"
"""Set by a starter that execs this process (the Makefile's demo targets) to its own pid."""


def starter_pid() -> int:
    """The process that started this one: `NIGHTSHIFT_STARTER_PID` where the starter set it, so a
    starter killed before this process first looked is noticed; else the parent as it is now."""
    value = os.environ.get(STARTER_ENV, "")
    return int(value) if value.isdigit() else os.getppid()


def die_with_parent(parent_pid: int | None = None) -> None:
    """In a child before exec (or at its start): SIGTERM this process when its parent dies.

    With `parent_pid`, a parent already gone by the time the signal is asked for (the child was
    reparented) ends the child at once."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def stop_group(engine: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """SIGTERM the guard's group, wait for the engine up to `grace_s`, then SIGKILL the group."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the guard outlives the group's SIGTERM
    with contextlib.suppress(ProcessLookupError):
        os.killpg(0, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        engine.wait(timeout=grace_s)
    os.killpg(0, signal.SIGKILL)  # the guard too: nothing of the group is left


def main(argv: list[str]) -> int:
    parent = int(argv[0])
    die_with_parent(parent)
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.append(True))
    engine = subprocess.Popen(argv[1:])
    while engine.poll() is None:
        if stopping or os.getppid() != parent:
            stop_group(engine)
        time.sleep(POLL_S)
    stop_group(engine, grace_s=0.0)  # the engine exited: anything it left in the group goes too
    return engine.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
