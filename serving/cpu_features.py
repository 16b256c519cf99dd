"""What the host CPU can do natively, where it changes what a CPU replica's figures mean.

`cpu-small` runs in bfloat16, which is fast on CPUs with native bf16 matrix instructions
(AVX-512 BF16, AMX) and slow everywhere else: there the matmuls take a fallback path, several
times slower than float32 (a 512 × 768 × 3072 matmul on one AVX2 core: 260 ms in bf16, 39 ms in
float32). Latency figures, the fitted model in `engine_configs/fits/` and the README's benchmark
then describe another machine, so the launcher says so before the replica starts, and the demo
and the test suite run such a config's float32 twin (`<name>-fp32.yaml` beside it) instead.

`NIGHTSHIFT_CPUINFO` names another file to read the flags from: a copy of another host's
`/proc/cpuinfo` rehearses here what would run there.
"""

from __future__ import annotations

import os
from pathlib import Path

from serving.engine_config import EngineConfig

CPUINFO = Path("/proc/cpuinfo")
CPUINFO_ENV = "NIGHTSHIFT_CPUINFO"
NATIVE_BF16 = frozenset({"avx512_bf16", "amx_bf16"})
BF16_NAMES = frozenset({"bfloat16", "bf16"})


def cpu_flags(cpuinfo: Path | None = None) -> frozenset[str] | None:
    """The instruction-set flags of the first CPU in `cpuinfo` (default: `NIGHTSHIFT_CPUINFO`,
    else /proc/cpuinfo); None where it cannot be read."""
    if cpuinfo is None:
        cpuinfo = Path(os.environ.get(CPUINFO_ENV) or CPUINFO)
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return None


def lacks_native_bf16(flags: frozenset[str] | None) -> bool:
    """True only when the flags are known and name no native bf16 instructions."""
    return flags is not None and not flags & NATIVE_BF16


def bf16_warning(config: EngineConfig, flags: frozenset[str] | None) -> str | None:
    """A warning when `config` runs a CPU replica in bfloat16 on a CPU without native bf16, else
    None (GPU replicas, other dtypes, or flags unknown)."""
    if config.hardware.kind != "cpu" or not lacks_native_bf16(flags):
        return None
    if str(config.flag("dtype", "")).lower() not in BF16_NAMES:
        return None
    return (
        f"{config.name} runs dtype bfloat16, but this CPU has no native bf16 instructions "
        f"(none of {', '.join(sorted(NATIVE_BF16))} in {CPUINFO}): its matmuls take a slow "
        "path, several times slower than float32, and its latencies will not match the fitted "
        "model or the README's figures. For this host, use its float32 twin "
        "(`engine_configs/cpu-small-fp32.yaml` for cpu-small), or copy the config with "
        "`dtype: float32` under `vllm:` and fit a model for it with `nightshift calibrate`."
    )


def float32_name(name: str) -> str:
    """The name of config `name`'s float32 twin."""
    return f"{name}-fp32"


def float32_twin(config_path: Path, flags: frozenset[str] | None) -> Path:
    """The config to run on a CPU with `flags`: `config_path`, or where the CPU lacks native bf16
    its float32 twin `<stem>-fp32.yaml` beside it, if there is one. The twin names its own
    latency fit (`latency_fit:`), so the controller prices the steps the twin really runs."""
    twin = config_path.with_name(float32_name(config_path.stem) + config_path.suffix)
    return twin if lacks_native_bf16(flags) and twin.is_file() else config_path
