"""The processes of the soak's night: its replica, its Prometheus, chat load and run attempts.

`Night` owns them and is the one place that starts or stops any of them, so every path out of the
soak (the end of the night, an error, Ctrl-C, SIGTERM) goes through `close()`, which stops each in
turn and then whatever is left below this process (`bench.soak_processes`). Chat load and every
`nightshift run` attempt are subprocesses in process groups of their own: a Ctrl-C at the
terminal reaches the soak alone, which then stops them in order. A run attempt is the same command
every time, with the same `--run-id`, so each one resumes the night where the last one stopped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import processes
from bench import soak_processes as procs
from bench.prometheus_server import PrometheusServer
from bench.soak_report import parse_run_summary
from serving.engine_config import EngineConfig
from serving.launcher import Replica, ReplicaSet
from serving.paths import REPO_ROOT


@dataclass
class Attempt:
    """One `nightshift run` attempt."""

    number: int
    why: str
    proc: subprocess.Popen
    log: Path
    started: float
    ended: float | None = None
    rc: int | None = None
    summary: dict | None = None

    def row(self, t0: float) -> dict:
        return {
            "attempt": self.number,
            "why": self.why,
            "pid": self.proc.pid,
            "started_s": round(self.started - t0, 1),
            "ended_s": None if self.ended is None else round(self.ended - t0, 1),
            "rc": self.rc,
            "summary": self.summary,
            "log": str(self.log),
        }


@dataclass
class Night:
    out: Path
    config: EngineConfig
    config_path: Path
    run_id: str
    run_options: list[str] = field(default_factory=list)
    """Options every run attempt gets beside the night's own (`--itl-slo-ms`, ...)."""
    replicas: ReplicaSet | None = None
    replica: Replica | None = None
    prometheus: PrometheusServer | None = None
    chat: subprocess.Popen | None = None
    attempts: list[Attempt] = field(default_factory=list)
    corpus: Path | None = None
    deadline_hhmm: str = ""

    @property
    def results(self) -> Path:
        return self.out / "results"

    @property
    def run_dir(self) -> Path:
        return self.results / "runs" / self.run_id

    @property
    def run(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def _env(self) -> dict[str, str]:
        return {**os.environ, "PREFECT_HOME": str(self.out / "prefect")}

    def start_replica(self, port: int) -> Replica:
        """The night's replica on `port`, tied to this process (it dies with the soak)."""
        self.replicas = self.replicas or ReplicaSet(self.results / "engines")
        (self.replica,) = self.replicas.up(
            self.config, str(self.config_path), port, tie_to_caller=True
        )
        return self.replica

    def kill_replica(self) -> None:
        """kill -9 of the replica's whole process group, waiting until its port is free."""
        from serving.launcher import port_in_use

        assert self.replica is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.replica.pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (
            processes.alive({self.replica.pid}) or port_in_use(self.replica.host, self.replica.port)
        ):
            procs.reap_orphans()
            time.sleep(0.25)

    def start_prometheus(self) -> str:
        assert self.replica is not None
        instance = f"{self.replica.host}:{self.replica.port}"
        self.prometheus = PrometheusServer(self.out / "prometheus", {"vllm": [instance]})
        url = self.prometheus.start()
        procs.popen_child(self.prometheus.pid)
        if not self.prometheus.wait_scraped(instance):
            raise RuntimeError(f"Prometheus at {url} has not scraped {instance} within 30 s")
        return url

    def start_chat(self, trace: Path, duration_s: float, seed: int) -> None:
        """`nightshift chat-load` replaying `trace` against the replica for `duration_s`, its
        records under `out/chat` with the night's run id (so they join the run's tables)."""
        assert self.replica is not None
        argv = [
            sys.executable, "-m", "flows.cli", "chat-load",
            "--engine-config", str(self.config_path), "--trace", str(trace),
            "--duration", f"{duration_s:.0f}", "--replica-url", self.replica.base_url,
            "--out", str(self.out / "chat"), "--run-id", self.run_id, "--seed", str(seed),
        ]  # fmt: skip
        self.chat = self._spawn(argv, self.out / "logs" / "chat-load.log")

    def start_run(self, why: str) -> Attempt:
        """A `nightshift run` attempt of the night (the same run id: it resumes)."""
        assert self.replica is not None and self.prometheus is not None
        assert self.corpus is not None
        argv = [
            sys.executable, "-m", "flows.cli", "run", "--corpus", str(self.corpus),
            "--engine-config", str(self.config_path), "--replica-url", self.replica.base_url,
            "--policy", "slo", "--prometheus-url", self.prometheus.url,
            "--run-id", self.run_id, "--results", str(self.results),
            "--deadline", self.deadline_hhmm, "--timezone", "UTC", *self.run_options,
        ]  # fmt: skip
        number = len(self.attempts) + 1
        log = self.out / "logs" / f"run-{number}.log"
        attempt = Attempt(number, why, self._spawn(argv, log), log, time.time())
        self.attempts.append(attempt)
        return attempt

    def _spawn(self, argv: list[str], log: Path) -> subprocess.Popen:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as sink:
            proc = subprocess.Popen(
                argv, cwd=REPO_ROOT, env=self._env(), stdout=sink, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, process_group=0,
            )  # fmt: skip
        procs.popen_child(proc.pid)
        return proc

    def run_ended(self) -> bool:
        """Whether the current attempt has ended; records its status and summary line once."""
        attempt = self.run
        if attempt is None:
            return True
        if attempt.ended is None and attempt.proc.poll() is not None:
            attempt.ended, attempt.rc = time.time(), attempt.proc.returncode
            attempt.summary = parse_run_summary(attempt.log.read_text(errors="replace"))
        return attempt.ended is not None

    def stop_run(self, grace_s: float = 60.0) -> None:
        """SIGINT (Prefect and Ray end their way), SIGKILL after `grace_s`."""
        attempt = self.run
        if attempt is None or self.run_ended():
            return
        _interrupt(attempt.proc, grace_s)
        self.run_ended()

    def stop_chat(self, grace_s: float = 30.0) -> None:
        """SIGINT (chat load's first Ctrl-C: it waits for requests in flight and writes its
        records), SIGKILL after `grace_s`."""
        if self.chat is not None and self.chat.poll() is None:
            _interrupt(self.chat, grace_s)

    def close(self) -> list[str]:
        """Stop everything the night started; returns the command lines of processes that were
        still there after each had been stopped in turn (and were then stopped too)."""
        if self.prometheus is not None and self.prometheus.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.prometheus.pid, signal.SIGCONT)  # a stopped one answers nothing
        self.stop_run()
        self.stop_chat()
        if self.replicas is not None and self.replica is not None:
            self.replicas.down([self.replica.name])
        if self.prometheus is not None:
            self.prometheus.stop()
        left = processes.descendants(os.getpid())
        named = [f"{p} {processes.command(p)}" for p in sorted(left)]
        procs.stop_all(left)
        procs.reap_orphans()
        return named


def _interrupt(proc: subprocess.Popen, grace_s: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
