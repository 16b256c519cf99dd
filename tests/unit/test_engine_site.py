"""The replica start-up hook (serving/engine_site), which asks for AMX tile state, and the
environment a replica starts with."""

import os
import subprocess
import sys

import pytest

from serving.engine_config import EngineConfig
from serving.launcher import CPU_ENGINE_ENV, ENGINE_SITE, engine_env


def test_replica_env_puts_the_hook_first() -> None:
    base = {"name": "x", "model": {"path": "local:tiny", "served_name": "t"}}
    plain = EngineConfig.model_validate(base | {"env": {"OMP_NUM_THREADS": 1}})
    env = engine_env(plain, {"PYTHONPATH": "/a"})
    assert env == {
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ENGINE_SITE), "/a"]),
        **CPU_ENGINE_ENV,
    }
    assert engine_env(EngineConfig.model_validate(base), {})["PYTHONPATH"] == str(ENGINE_SITE)


@pytest.mark.parametrize("name", ["VLLM_USE_AOT_COMPILE", "VLLM_ENABLE_V1_MULTIPROCESSING"])
def test_a_cpu_replica_gets_the_platform_defaults_unless_told_otherwise(name: str) -> None:
    """No AOT compile (its cache does not load back) and the worker inside the engine core, on
    the CPU only; a config or the caller's environment that names the variable wins."""
    base = {"name": "x", "model": {"path": "local:tiny", "served_name": "t"}}
    cpu = EngineConfig.model_validate(base)
    assert engine_env(cpu, {})[name] == "0"
    assert name not in engine_env(cpu, {name: "1"})
    chosen = EngineConfig.model_validate(base | {"env": {name: "1"}})
    assert engine_env(chosen, {})[name] == "1"
    gpu = EngineConfig.model_validate(base | {"hardware": {"kind": "gpu"}})
    assert name not in engine_env(gpu, {})


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
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
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
