"""SIGTERM to a command's driver after Ray started, whichever thread opened Ray: the driver gets
`Terminated` where it is, as it gets KeyboardInterrupt on Ctrl-C, its clean-up runs and it exits
with the code it chose. Ray took that over three ways: its failure-signal handler printed a
native stack trace and aborted the process; `ray.init` on the main thread put its own
`sys.exit(15)` handler in place of the command's; and a Ray opened from a thread that then ended
(a Prefect task's worker thread) had its GCS and raylet killed with that thread, so the driver
hung 60 s at exit waiting for a GCS that was gone, then Ray ended it with code 1."""

from __future__ import annotations

import subprocess
import sys

import pytest

DRIVER = """
import os, signal, sys, threading, time
import ray
from pipelines.errors import Terminated
from pipelines.ray_session import open_ray, stop_on_sigterm
stop_on_sigterm()
if sys.argv[1] == "thread":
    opener = threading.Thread(target=open_ray)
    opener.start()
    opener.join()  # the thread that started Ray is gone: Ray must not be
else:
    open_ray()
print("ray answers", ray.get(ray.remote(lambda: 42).remote(), timeout=60), flush=True)
threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
try:
    time.sleep(30)
except Terminated:
    print("clean-up ran", flush=True)
    raise SystemExit(143)
"""


@pytest.mark.parametrize("opened_on", ["thread", "main"])
def test_sigterm_after_ray_init_stops_the_driver_like_ctrl_c(opened_on: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, opened_on], capture_output=True, text=True, timeout=120
    )
    assert "ray answers 42" in done.stdout, done.stderr[-3000:]
    assert done.returncode == 143, done.stderr[-3000:]
    assert "clean-up ran" in done.stdout
    assert "SIGTERM received" not in done.stderr  # Ray's handler's stack trace
