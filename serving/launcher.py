"""Start, watch and stop vLLM replicas as child processes, one process group each.

Each replica runs the engine's interpreter (`.venv-engine`) in a process group of its own, so
stopping it means signalling one group: the API server, its engine core and any worker it spawned
go together and nothing is left orphaned. Replicas are recorded in `<state_dir>/replicas.json` the
moment they start, so `nightshift engine down` can stop replicas that a crashed or interrupted `up`
left behind.

A group, not a session: Linux schedules every session as a group of its own (autogroup), and an
engine in a session of its own starved everything outside it on a small host. An engine core with
a worker process busy-waits for it with `sched_yield`, which yields only within its own group;
while the worker ran a long step, both cores stayed with the engine, and the chat clients, the
batch workers and the engine's own callers waited, measured here up to 1.9 s at a time (even at
nice -15). In the caller's session the yield reaches them, and those stalls are gone. (A CPU
replica now keeps its worker in the engine core, `CPU_ENGINE_ENV`; a tensor-parallel one cannot.)
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from serving import cpu_features, local_models
from serving.engine_config import EngineConfig, render_flags
from serving.engine_site.control_files import CONTROL_DIR_ENV
from serving.paths import DEFAULT_PORT, engine_python
from serving.replica_guard import die_with_parent

ENGINE_MODULE = "vllm.entrypoints.openai.api_server"
GUARD_MODULE = "serving.replica_guard"
"""Leads the group of a replica tied to its caller (its docstring says why)."""
ENGINE_SITE = Path(__file__).resolve().parent / "engine_site"
LOG_TAIL_LINES = 40
CPU_ENGINE_ENV = {"VLLM_USE_AOT_COMPILE": "0", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
"""Two defaults for vLLM 0.32 on the CPU platform, each where the config and the caller set none.

`VLLM_USE_AOT_COMPILE=0`: the platform saves an AOT-compiled model that it cannot load back (its
log: "Compiling model again due to a load failure ... 'function' object has no attribute
'finalize_loading'"), so every start traced and compiled the model again. Without AOT compile the
engine keeps its older compile cache, which does load: the same compiled model, started sooner.

`VLLM_ENABLE_V1_MULTIPROCESSING=0`: otherwise the platform runs the model in a worker process of
its own beside the engine core, even in a world of one, and hands every step across a shared-memory
queue whose waiting side spins. Set to 0, a one-process world keeps its worker inside the engine
core: one vLLM import fewer per start and no cross-process handoff per step. The API server still
runs the engine core as a process of its own (beyond the CPU platform the variable concerns only
the offline `LLM` class), and a tensor-parallel world keeps its worker processes."""


class SlowHostWarning(UserWarning):
    """The host will run this replica far slower than its engine config was measured at."""


class EngineStartError(RuntimeError):
    """A replica that could not start; the message carries the reason and the log's tail."""


@dataclass
class Replica:
    """One running engine process group."""

    name: str
    config: str
    served_model: str
    host: str
    port: int
    pid: int
    log: str
    started_at: float

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def control_dir(self) -> Path:
        """The replica's control folder: its control document and the plug-in's status."""
        return Path(self.log).with_suffix("")


def model_location(config: EngineConfig) -> str:
    """The path the engine loads: a built local model, or the configured path or hub id."""
    if config.model.local_name:
        return str(local_models.resolve(config.model.local_name))
    return config.model.path


def engine_env(config: EngineConfig, base: Mapping[str, str]) -> dict[str, str]:
    """What a replica's environment adds to `base`: the config's `env`, and `engine_site/` in
    front of PYTHONPATH, so that every process of the replica runs its start-up hook before vLLM
    does (that directory's sitecustomize.py asks for AMX tile state). A CPU replica also gets
    `CPU_ENGINE_ENV` where neither the config nor `base` sets those names."""
    env = dict(config.env)
    if config.hardware.kind == "cpu":
        env |= {k: v for k, v in CPU_ENGINE_ENV.items() if k not in env and k not in base}
    rest = env.get("PYTHONPATH", base.get("PYTHONPATH", ""))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ENGINE_SITE), rest) if p)
    return env


def engine_argv(config: EngineConfig, port: int, host: str = "127.0.0.1") -> list[str]:
    """The exact command line of one replica."""
    return [
        str(engine_python()),
        "-m",
        ENGINE_MODULE,
        "--model",
        model_location(config),
        "--served-model-name",
        config.model.served_name,
        "--host",
        host,
        "--port",
        str(port),
        *render_flags(config.vllm),
        *plugin_flags(config),
    ]


PLUGIN_PACKAGE = "serving.engine_site."
CONTROL_MIDDLEWARE = "serving.engine_site.control_route.control_route"


def uses_plugin(config: EngineConfig) -> bool:
    """Whether the config's `scheduler-cls` is the engine plug-in."""
    return str(config.flag("scheduler-cls", "")).startswith(PLUGIN_PACKAGE)


def plugin_flags(config: EngineConfig) -> list[str]:
    """The control route on the replica's own port, for a config that selects the plug-in."""
    return ["--middleware", CONTROL_MIDDLEWARE] if uses_plugin(config) else []


class NoFreePort(RuntimeError):
    """No run of free ports in the searched range; the message says which option picks one."""


def free_port(start: int = DEFAULT_PORT, count: int = 1, host: str = "127.0.0.1") -> int:
    """The first port from `start` with `count` consecutive free ports (for `count` replicas)."""
    for port in range(start, start + 1000):
        if not any(port_in_use(host, p) for p in range(port, port + count)):
            return port
    raise NoFreePort(f"no {count} free port(s) in {start}..{start + 999}; choose one with --port")


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


class ReplicaSet:
    """The replicas recorded under one state folder (default `results/engines`)."""

    def __init__(self, state_dir: str | Path = "results/engines") -> None:
        self.state_dir = Path(state_dir)
        self.state_file = self.state_dir / "replicas.json"

    def load(self) -> list[Replica]:
        if not self.state_file.exists():
            return []
        return [Replica(**r) for r in json.loads(self.state_file.read_text())]

    def _save(self, replicas: list[Replica]) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps([asdict(r) for r in replicas], indent=2))
        tmp.replace(self.state_file)

    def up(
        self,
        config: EngineConfig,
        config_path: str,
        port: int,
        count: int = 1,
        host: str = "127.0.0.1",
        timeout_s: float = 300.0,
        tie_to_caller: bool = False,
        extra_env: Mapping[str, str] | None = None,
    ) -> list[Replica]:
        """Start `count` replicas on consecutive ports and wait until all answer /health.

        Any failure stops every replica this call started, then raises EngineStartError. With
        `tie_to_caller` each replica's group is led by `serving.replica_guard`, which stops the
        whole group if this process dies without cleaning up (killed, crashed), at any stage of
        the replica's start-up: replicas a run or a test owns never outlive it."""
        ports = [port + i for i in range(count)]
        busy = [p for p in ports if port_in_use(host, p)]
        if busy:
            raise EngineStartError(
                f"port {busy[0]} on {host} is already in use (another replica? see "
                "`nightshift engine status`); choose a free one with --port"
            )
        argv = {p: engine_argv(config, p, host) for p in ports}  # fails early on a missing model
        if message := cpu_features.bf16_warning(config, cpu_features.cpu_flags()):
            warnings.warn(message, SlowHostWarning, stacklevel=2)
        started: list[Replica] = []
        try:
            for p in ports:
                started.append(
                    self._spawn(config, config_path, argv[p], host, p, tie_to_caller, extra_env)
                )
            key = serving_key(config, {**os.environ, **engine_env(config, os.environ),
                                       **(extra_env or {})})  # fmt: skip
            for r in started:
                wait_healthy(r, timeout_s)
                warm_up(r, int(config.flag("max-num-batched-tokens", 512)), key)
        except BaseException:
            self.down([r.name for r in started])
            raise
        return started

    def _spawn(
        self,
        config: EngineConfig,
        config_path: str,
        argv: list[str],
        host: str,
        port: int,
        tie_to_caller: bool = False,
        extra_env: Mapping[str, str] | None = None,
    ) -> Replica:
        name = f"{config.name}-{port}"
        log = self.state_dir / f"{name}.log"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        control = fresh_control_dir(log.with_suffix(""))
        if tie_to_caller:
            argv = [sys.executable, "-m", GUARD_MODULE, str(os.getpid()), *argv]
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={
                    **os.environ,
                    **engine_env(config, os.environ),
                    **(extra_env or {}),
                    CONTROL_DIR_ENV: str(control),
                },
                process_group=0,
                preexec_fn=(
                    functools.partial(die_with_parent, os.getpid())
                    if tie_to_caller and _on_main_thread()
                    else None
                ),
            )
        replica = Replica(
            name, config_path, config.model.served_name, host, port, proc.pid, str(log), time.time()
        )
        self._save([r for r in self.load() if r.name != name] + [replica])
        return replica

    def status(self) -> list[tuple[Replica, str]]:
        """Each recorded replica with `healthy`, `starting` (alive, not answering) or `dead`."""
        return [(r, _state(r)) for r in self.load()]

    def down(self, names: list[str] | None = None, grace_s: float = 20.0) -> list[Replica]:
        """Stop the named replicas (all when None): SIGTERM to the group, SIGKILL after `grace_s`."""
        replicas = self.load()
        chosen = [r for r in replicas if names is None or r.name in names]
        for r in chosen:
            _signal_group(r.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(_group_alive(r.pid) for r in chosen) and time.monotonic() < deadline:
            time.sleep(0.2)
        for r in chosen:
            _signal_group(r.pid, signal.SIGKILL)
            _reap(r.pid)
        self._save([r for r in replicas if r not in chosen])
        return chosen

    @contextlib.contextmanager
    def running(
        self,
        config: EngineConfig,
        config_path: str,
        port: int,
        count: int = 1,
        timeout_s: float = 300.0,
        extra_env: Mapping[str, str] | None = None,
    ) -> Iterator[list[Replica]]:
        """Replicas that exist for the duration of a `with` block, stopped on any exit."""
        replicas = self.up(
            config,
            config_path,
            port,
            count,
            timeout_s=timeout_s,
            tie_to_caller=True,
            extra_env=extra_env,
        )
        try:
            yield replicas
        finally:
            self.down([r.name for r in replicas])


def fresh_control_dir(path: Path) -> Path:
    """The control folder of a replica about to start, private to this user (0700) and emptied:
    a control document left by an earlier replica of the same name would put a controller that
    is gone in charge of this one (expired, it would pause batch from the first step)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    for leftover in path.iterdir():
        if leftover.is_file():
            leftover.unlink()
    return path


def _on_main_thread() -> bool:
    """The kernel's parent-death signal fires when the *thread* that started the child exits, so
    it is only safe to ask for from the main thread, which lives as long as the process."""
    import threading

    return threading.current_thread() is threading.main_thread()


def wait_healthy(replica: Replica, timeout_s: float) -> None:
    """Poll /health until it answers 200; fail fast with the log's tail if the engine dies."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _group_alive(replica.pid):
            raise EngineStartError(
                f"replica {replica.name} exited during start-up; last lines of {replica.log}:\n"
                + log_tail(replica.log)
            )
        if _healthy(replica):
            return
        time.sleep(1.0)
    raise EngineStartError(
        f"replica {replica.name} did not answer {replica.base_url}/health within {timeout_s:.0f} s;"
        f" last lines of {replica.log}:\n" + log_tail(replica.log)
    )


def serving_key(config: EngineConfig, env: Mapping[str, str]) -> str | None:
    """The API key a replica of `config` serves behind: its `api-key` flag, else the
    `VLLM_API_KEY` of the environment it is started with (vLLM's own order)."""
    key = config.flag("api-key")
    return str(key) if key else env.get("VLLM_API_KEY") or None


def warm_up(replica: Replica, step_tokens: int, api_key: str | None = None) -> None:
    """Run a short and a budget-sized request so first-use compilation is not billed to the
    first real request (on the CPU engine it shows as a TTFT of hundreds of milliseconds). A
    replica behind a key is warmed up with it (without, it answers 401 and stays cold)."""
    words = max(8, step_tokens // 2)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    for prompt, n in (("warm up", 4), (" ".join(["warm"] * words), 16)):
        try:
            httpx.post(
                f"{replica.base_url}/v1/completions",
                headers=headers,
                timeout=120.0,
                json={
                    "model": replica.served_model,
                    "prompt": prompt,
                    "max_tokens": n,
                    "ignore_eos": True,
                },
            )
        except httpx.HTTPError:
            return  # warm-up is best effort; a replica that cannot answer fails its first request


def log_tail(path: str, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(log unreadable: {exc})"


def _healthy(replica: Replica) -> bool:
    try:
        return httpx.get(f"{replica.base_url}/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def _state(replica: Replica) -> str:
    if not _group_alive(replica.pid):
        return "dead"
    return "healthy" if _healthy(replica) else "starting"


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    """True while any process of the group lives (zombies of our own children are reaped first)."""
    _reap(pgid)
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _has_live_member(pgid)


def _has_live_member(pgid: int) -> bool:
    """killpg(0) succeeds on zombies; look at /proc so a reaped-but-unwaited leader is not 'alive'."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
