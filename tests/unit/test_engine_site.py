"""The replica start-up hook that swaps vLLM's shared-memory spin for a nap (serving/engine_site)."""

import os
import subprocess
import sys
from pathlib import Path

from serving.engine_config import EngineConfig
from serving.launcher import ENGINE_SITE, SHM_NAP_ENV, engine_env

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


def test_replica_env_puts_the_hook_first_only_when_asked() -> None:
    base = {"name": "x", "model": {"path": "local:tiny", "served_name": "t"}}
    plain = EngineConfig.model_validate(base | {"env": {"OMP_NUM_THREADS": 1}})
    assert engine_env(plain, {"PYTHONPATH": "/a"}) == {"OMP_NUM_THREADS": "1"}
    napping = EngineConfig.model_validate(base | {"env": {SHM_NAP_ENV: 200}})
    env = engine_env(napping, {"PYTHONPATH": "/a"})
    assert env["PYTHONPATH"] == os.pathsep.join([str(ENGINE_SITE), "/a"])
    assert env[SHM_NAP_ENV] == "200"
