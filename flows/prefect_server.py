"""Prefect's temporary API server, tied to the process that starts it.

Without `PREFECT_API_URL`, Prefect runs a flow against a temporary server it starts as a child
process (uvicorn) and stops from an `atexit` hook. A command that dies without running its exit
hooks (kill -9, or SIGTERM, whose default action skips them) left that server running with parent
1, one per killed run. `tie_temporary_server()` asks the kernel to SIGTERM the server when its
parent dies, as the launcher does for replicas (`serving.launcher`).

It also starts the server in a session of its own. A Ctrl-C at a terminal signals the whole
foreground process group: the server, in that group, stopped at once, and the run, which must
record its flow as crashed before it exits, retried that call against the dead server for minutes
while Ray stayed up. Out of the group, the server outlives the Ctrl-C by the few seconds the run
needs, and dies with it.
"""

from __future__ import annotations

import functools
import subprocess
import threading

from serving.launcher import die_with_parent


def tie_temporary_server() -> None:
    """Make Prefect's temporary server die with this process. Call it from the main thread before
    the first flow runs (the parent-death signal follows the thread that started the child, and
    the main thread lives as long as the process); elsewhere it does nothing. Idempotent."""
    from prefect.server.api import server

    cls = server.SubprocessASGIServer
    if threading.current_thread() is not threading.main_thread() or getattr(cls, "_tied", False):
        return
    start_child = cls._run_uvicorn_command

    @functools.wraps(start_child)
    def tied(self):
        popen = server.subprocess.Popen
        server.subprocess = _WithPopen(
            functools.partial(popen, preexec_fn=die_with_parent, start_new_session=True)
        )
        try:
            return start_child(self)
        finally:
            server.subprocess = subprocess

    cls._run_uvicorn_command = tied
    cls._tied = True


class _WithPopen:
    """The `subprocess` module as Prefect's server module sees it, with `Popen` replaced."""

    def __init__(self, popen) -> None:
        self.Popen = popen

    def __getattr__(self, name: str):
        return getattr(subprocess, name)
