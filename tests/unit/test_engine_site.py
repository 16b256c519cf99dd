"""The replica start-up hook (serving/engine_site): AMX tile state asked for, and vLLM's
shared-memory spin swapped for a nap when asked."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from serving.engine_config import EngineConfig
from serving.launcher import CPU_ENGINE_ENV, ENGINE_SITE, SHM_NAP_ENV, engine_env

PROBE = """
import time
import vllm.distributed.device_communicators.shm_broadcast as m
t = time.perf_counter()
for _ in range(20):
    m.sched_yield()
print(m.sched_yield.__name__, round((time.perf_counter() - t) / 20 * 1e6))
"""


def fake_vllm(root: Path) -> Path:
    """A stand-in for the one vLLM module the hook patches, with the name it patches."""
    pkg = root / "vllm" / "distributed" / "device_communicators"
    pkg.mkdir(parents=True)
    for d in (root / "vllm", root / "vllm" / "distributed", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "shm_broadcast.py").write_text("import os\n\ndef sched_yield():\n    os.sched_yield()\n")
    return root


def probe(root: Path, nap_us: str | None) -> tuple[str, int, str]:
    env = {k: v for k, v in os.environ.items() if k != SHM_NAP_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(ENGINE_SITE), str(root)])
    if nap_us is not None:
        env[SHM_NAP_ENV] = nap_us
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    name, micros = done.stdout.split()
    return name, int(micros), done.stderr


def test_nap_replaces_the_spin_when_asked(tmp_path: Path) -> None:
    name, micros, log = probe(fake_vllm(tmp_path), "2000")
    assert name == "<lambda>" and micros >= 1500
    assert "waits nap 2000 us" in log


def test_without_the_variable_vllm_is_left_alone(tmp_path: Path) -> None:
    name, _, log = probe(fake_vllm(tmp_path), None)
    assert name == "sched_yield" and log == ""


def test_a_bad_value_is_named_and_ignored(tmp_path: Path) -> None:
    name, _, log = probe(fake_vllm(tmp_path), "fast")
    assert name == "sched_yield" and "'fast' is not a number of microseconds" in log


def test_a_module_without_the_name_is_reported_not_broken(tmp_path: Path) -> None:
    root = fake_vllm(tmp_path)
    target = root / "vllm" / "distributed" / "device_communicators" / "shm_broadcast.py"
    target.write_text("def sched_yield():\n    pass\n\nsched_yield = None\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ENGINE_SITE), str(root)])}
    env[SHM_NAP_ENV] = "200"
    done = subprocess.run(
        [sys.executable, "-c", "import vllm.distributed.device_communicators.shm_broadcast"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and "has no sched_yield; left as it is" in done.stderr


def test_replica_env_puts_the_hook_first() -> None:
    base = {"name": "x", "model": {"path": "local:tiny", "served_name": "t"}}
    plain = EngineConfig.model_validate(base | {"env": {"OMP_NUM_THREADS": 1}})
    env = engine_env(plain, {"PYTHONPATH": "/a"})
    assert env == {
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ENGINE_SITE), "/a"]),
        **CPU_ENGINE_ENV,
    }
    napping = EngineConfig.model_validate(base | {"env": {SHM_NAP_ENV: 200}})
    env = engine_env(napping, {})
    assert env["PYTHONPATH"] == str(ENGINE_SITE)
    assert env[SHM_NAP_ENV] == "200"


def test_a_cpu_replica_skips_the_compile_cache_it_cannot_load_unless_told_otherwise() -> None:
    base = {"name": "x", "model": {"path": "local:tiny", "served_name": "t"}}
    cpu = EngineConfig.model_validate(base)
    assert engine_env(cpu, {})["VLLM_USE_AOT_COMPILE"] == "0"
    assert "VLLM_USE_AOT_COMPILE" not in engine_env(cpu, {"VLLM_USE_AOT_COMPILE": "1"})
    chosen = EngineConfig.model_validate(base | {"env": {"VLLM_USE_AOT_COMPILE": "1"}})
    assert engine_env(chosen, {})["VLLM_USE_AOT_COMPILE"] == "1"
    gpu = EngineConfig.model_validate(base | {"hardware": {"kind": "gpu"}})
    assert "VLLM_USE_AOT_COMPILE" not in engine_env(gpu, {})


AMX_PERMITTED = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
supported, permitted = ctypes.c_uint64(0), ctypes.c_uint64(0)
assert libc.syscall(158, 0x1021, ctypes.byref(supported)) == 0  # ARCH_GET_XCOMP_SUPP
assert libc.syscall(158, 0x1022, ctypes.byref(permitted)) == 0  # ARCH_GET_XCOMP_PERM
print(supported.value >> 18 & 1, permitted.value >> 18 & 1)  # XFEATURE_XTILEDATA
"""


def amx_tile_state(with_hook: bool) -> tuple[int, int]:
    """(supported, permitted) of the AMX tile state in a fresh process, with or without the hook."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", SHM_NAP_ENV)}
    if with_hook:
        env["PYTHONPATH"] = str(ENGINE_SITE)
    done = subprocess.run(
        [sys.executable, "-c", AMX_PERMITTED], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"no AMX state queries on this kernel: {done.stderr.strip()[-200:]}")
    supported, permitted = map(int, done.stdout.split())
    return supported, permitted


@pytest.mark.skipif(
    sys.platform != "linux" or os.uname().machine != "x86_64", reason="x86-64 Linux only"
)
def test_every_replica_process_holds_amx_tile_state_where_the_cpu_has_it() -> None:
    supported, permitted = amx_tile_state(with_hook=True)
    if not supported:
        pytest.skip("this CPU has no AMX tiles: nothing to ask for")
    assert permitted == 1
    assert amx_tile_state(with_hook=False) == (1, 0)  # a process that does not ask has none
