"""A throwaway Prometheus server on loopback, scraping given targets every second.

Tests that read replicas through Prometheus need the real server (its rate() extrapolation and
histogram_quantile are what production sees), but must never leave one running: the server lives in
its own process group, tied to the test process, and is stopped when the `with` block exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx
import yaml

from tests.replicas import free_port_block

INSTALL_HINT = "install it with `make prometheus` (Debian's `prometheus` package)"


class PrometheusStartError(RuntimeError):
    """The server did not become ready; the message carries its log's tail."""


def prometheus_binary() -> str | None:
    """Path of the `prometheus` executable, or None when it is not installed."""
    return shutil.which("prometheus")


def write_config(path: Path, jobs: Mapping[str, Sequence[str]], interval_s: float = 1.0) -> Path:
    """prometheus.yml with one static scrape job per entry of `jobs` (name -> `host:port` targets).

    The scrape timeout equals the interval because Prometheus rejects a timeout longer than it."""
    interval = f"{interval_s:g}s"
    config = {
        "global": {"scrape_interval": interval, "scrape_timeout": interval},
        "scrape_configs": [
            {"job_name": name, "static_configs": [{"targets": list(targets)}]}
            for name, targets in jobs.items()
        ],
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@contextlib.contextmanager
def prometheus_server(
    workdir: Path,
    jobs: Mapping[str, Sequence[str]],
    interval_s: float = 1.0,
    ready_timeout_s: float = 30.0,
) -> Iterator[str]:
    """Run Prometheus scraping `jobs` with its data under `workdir`; yields its base URL."""
    binary = prometheus_binary()
    if binary is None:
        raise PrometheusStartError(f"`prometheus` is not on PATH; {INSTALL_HINT}")
    workdir.mkdir(parents=True, exist_ok=True)
    config = write_config(workdir / "prometheus.yml", jobs, interval_s)
    port = free_port_block(1)
    log = workdir / "prometheus.log"
    argv = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent if _on_main_thread() else None,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(proc, url, log, ready_timeout_s)
        yield url
    finally:
        _stop(proc)


def _wait_ready(proc: subprocess.Popen, url: str, log: Path, timeout_s: float) -> None:
    """Poll `/-/ready`; fail fast with the log's tail when the server exits (bad config, port)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PrometheusStartError(
                f"prometheus exited with status {proc.returncode}; log:\n{_tail(log)}"
            )
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/-/ready", timeout=1.0).status_code == 200:
                return
        time.sleep(0.2)
    raise PrometheusStartError(f"prometheus not ready within {timeout_s:.0f} s; log:\n{_tail(log)}")


def _stop(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the server's group, SIGKILL it if it has not exited after `grace_s`."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _on_main_thread() -> bool:
    """The parent-death signal fires when the forking *thread* exits: ask for it only from the
    main thread, which lives as long as the test process."""
    return threading.current_thread() is threading.main_thread()


def _die_with_parent() -> None:
    """In the child, before exec: a killed test run takes its Prometheus with it (Linux prctl)."""
    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(log unreadable: {exc})"
