"""A Prometheus server on loopback scraping given targets every second, owned by its caller.

The soak's controller reads the replica through a real Prometheus (`--prometheus-url`), whose
rate() extrapolation and histogram_quantile are what production sees, and the soak stops it with
SIGSTOP as one of its faults, so it needs the server's pid. The server runs in a process group of
its own (stopped as one) but in its caller's session (`serving/launcher.py` says why a session of
its own is worse on a small host), and gets SIGTERM from the kernel if its caller dies.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx
import yaml

from serving.launcher import free_port
from serving.replica_guard import die_with_parent

INSTALL_HINT = "install Debian's `prometheus` package (`make prometheus`)"


class PrometheusStartError(RuntimeError):
    """The server did not become ready; the message carries its log's tail."""


def write_config(
    path: Path,
    jobs: Mapping[str, Sequence[str]],
    interval_s: float = 1.0,
    rule_files: Sequence[Path] = (),
) -> Path:
    """prometheus.yml with one static scrape job per entry of `jobs` (name -> `host:port`s), and
    `rule_files` evaluated every interval. The scrape timeout equals the interval: Prometheus
    refuses a longer one."""
    interval = f"{interval_s:g}s"
    config: dict = {"global": {"scrape_interval": interval, "scrape_timeout": interval}}
    if rule_files:
        config["global"]["evaluation_interval"] = interval
        config["rule_files"] = [str(f) for f in rule_files]
    config["scrape_configs"] = [
        {"job_name": name, "static_configs": [{"targets": list(targets)}]}
        for name, targets in jobs.items()
    ]
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class PrometheusServer:
    """`start()` it, read `url` and `pid`, `stop()` it (idempotent, and also when SIGSTOPped)."""

    def __init__(
        self, workdir: Path, jobs: Mapping[str, Sequence[str]], rule_files: Sequence[Path] = ()
    ) -> None:
        self.workdir, self.jobs, self.rule_files = workdir, jobs, tuple(rule_files)
        self.proc: subprocess.Popen | None = None
        self.url = ""

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def start(self, ready_timeout_s: float = 60.0) -> str:
        binary = shutil.which("prometheus")
        if binary is None:
            raise PrometheusStartError(f"`prometheus` is not on PATH; {INSTALL_HINT}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = write_config(
            self.workdir / "prometheus.yml", self.jobs, rule_files=self.rule_files
        )
        port = free_port(9090)
        log = self.workdir / "prometheus.log"
        argv = [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]
        main_thread = threading.current_thread() is threading.main_thread()
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                process_group=0,
                preexec_fn=die_with_parent if main_thread else None,
            )
        self.url = f"http://127.0.0.1:{port}"
        self._wait_ready(log, ready_timeout_s)
        return self.url

    def _wait_ready(self, log: Path, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PrometheusStartError(
                    f"prometheus exited with status {self.proc.returncode}; log:\n{_tail(log)}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/-/ready", timeout=1.0).status_code == 200:
                    return
            time.sleep(0.2)
        self.stop()
        raise PrometheusStartError(f"prometheus not ready in {timeout_s:.0f} s; log:\n{_tail(log)}")

    def wait_scraped(self, instance: str, timeout_s: float = 30.0) -> bool:
        """Whether Prometheus holds an `up` series of `instance` within `timeout_s` (the run
        checks its selectors against them at its start)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                query = {"query": f'up{{instance="{instance}"}}'}
                answer = httpx.get(f"{self.url}/api/v1/query", params=query, timeout=2.0).json()
                if answer["data"]["result"]:
                    return True
            time.sleep(0.5)
        return False

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGCONT (in case a fault left it stopped) and SIGTERM the group, SIGKILL after
        `grace_s`."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig in (signal.SIGCONT, signal.SIGTERM):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(log unreadable: {exc})"
