"""Runs at start-up in every Python process of a replica (serving/launcher.py puts this directory
in front of its PYTHONPATH), before vLLM runs: two fixes to the processes vLLM starts.

**AMX tile state.** On an x86 CPU with AMX, vLLM's bf16 CPU attention kernel runs AMX tile
instructions, and Linux grants a process the tile state only once it asks for it
(`arch_prctl(ARCH_REQ_XCOMP_PERM)`). Nothing on vLLM's path asks, so the model's worker dies of
SIGILL on its first prefill of more than a few tokens (seen on a Xeon with `amx_tile`: every bf16
replica died on its warm-up request). Every process of the replica asks at start-up where the CPU
and kernel support it; elsewhere this does nothing.

**The shared-memory nap** (only when the engine config sets `NIGHTSHIFT_SHM_WAIT_NAP_US`).

vLLM's engine core and its CPU worker are two processes that pass every step through a
shared-memory queue. A reader waiting on that queue spins on `sched_yield()` for a second after
each message before it parks on a socket, so while a replica is busy both processes keep a core at
100% even when one of them is only waiting for the other. On a GPU host those are spare cores; on a
CPU replica they are the cores the model, the API server and the batch clients need, and the
engine's compute loses them whenever a third process wakes up: on a two-core host under load the
engine core process used 81% of a core, most of it waiting, and 21% once it napped. Setting the
variable replaces that yield with a sleep of that many microseconds, which frees the core at the
price of at most that much latency per message.

This reaches into a private vLLM module; when the module no longer has the name it patches, it
says so in the replica's log and leaves vLLM as it is.
"""

from __future__ import annotations

import ctypes
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import time

TARGET = "vllm.distributed.device_communicators.shm_broadcast"
ENV = "NIGHTSHIFT_SHM_WAIT_NAP_US"

SYS_ARCH_PRCTL = 158  # x86_64
ARCH_GET_XCOMP_SUPP = 0x1021
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18


def _permit_amx() -> None:
    """Ask Linux for this process's AMX tile state where the CPU and kernel support it. Quiet where
    they do not (another CPU, a kernel before 5.16); a refusal is logged, since vLLM's bf16
    attention will then die of SIGILL and the engine config's float32 twin is the way out."""
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    supported = ctypes.c_uint64(0)
    if libc.syscall(SYS_ARCH_PRCTL, ARCH_GET_XCOMP_SUPP, ctypes.byref(supported)) != 0:
        return
    if not supported.value >> XFEATURE_XTILEDATA & 1:
        return
    if libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0:
        reason = os.strerror(ctypes.get_errno())
        print(
            f"nightshift: Linux refused AMX tile state ({reason}); bf16 attention will die of "
            "SIGILL on this CPU: use the engine config's -fp32 twin",
            file=sys.stderr,
        )


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when `TARGET` is imported, lets the normal finders load it and then
    swaps its yield for a nap."""

    def __init__(self, nap_s: float) -> None:
        self.nap_s = nap_s

    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        load, nap_s = spec.loader.exec_module, self.nap_s

        def exec_module(module) -> None:
            load(module)
            if not callable(getattr(module, "sched_yield", None)):
                print(f"nightshift: {TARGET} has no sched_yield; left as it is", file=sys.stderr)
                return
            module.sched_yield = lambda: time.sleep(nap_s)
            print(f"nightshift: {TARGET} waits nap {nap_s * 1e6:.0f} us", file=sys.stderr)

        spec.loader.exec_module = exec_module
        return spec


def _install() -> None:
    raw = os.environ.get(ENV)
    if not raw:
        return
    try:
        nap_us = float(raw)
    except ValueError:
        print(
            f"nightshift: {ENV}={raw!r} is not a number of microseconds; ignored", file=sys.stderr
        )
        return
    if nap_us > 0:
        sys.meta_path.insert(0, _PatchOnImport(nap_us / 1e6))


def _chain() -> None:
    """Run the sitecustomize this one shadows, if the interpreter has one."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


_permit_amx()
_install()
_chain()
