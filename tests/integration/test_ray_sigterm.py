"""SIGTERM to a command's driver after Ray started (from another thread, as in a Prefect task):
the driver gets `Terminated` where it is, as it gets KeyboardInterrupt on Ctrl-C, and its clean-up
runs. Ray's failure-signal handler, which `ray.init` installs, printed a native stack trace and
aborted the process instead."""

from __future__ import annotations

import subprocess
import sys

DRIVER = """
import os, signal, threading, time
from pipelines.errors import Terminated
from pipelines.ray_session import open_ray, stop_on_sigterm
stop_on_sigterm()
opener = threading.Thread(target=open_ray)
opener.start()
opener.join()
threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
try:
    time.sleep(30)
except Terminated:
    print("clean-up ran", flush=True)
    raise SystemExit(143)
"""


def test_sigterm_after_ray_init_stops_the_driver_like_ctrl_c() -> None:
    done = subprocess.run(
        [sys.executable, "-c", DRIVER], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 143, done.stderr[-3000:]
    assert "clean-up ran" in done.stdout
    assert "SIGTERM received" not in done.stderr  # Ray's handler's stack trace
