"""Runs at start-up in every Python process of a replica (serving/launcher.py puts this directory
in front of its PYTHONPATH), before vLLM runs.

**AMX tile state.** On an x86 CPU with AMX, vLLM's bf16 CPU attention kernel runs AMX tile
instructions, and Linux grants a process the tile state only once it asks for it
(`arch_prctl(ARCH_REQ_XCOMP_PERM)`). Nothing on vLLM's path asks, so the model's worker dies of
SIGILL on its first prefill of more than a few tokens (seen on a Xeon with `amx_tile`: every bf16
replica died on its warm-up request). Every process of the replica asks at start-up where the CPU
and kernel support it; elsewhere this does nothing.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import os
import sys

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


def _chain() -> None:
    """Run the sitecustomize this one shadows, if the interpreter has one."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


_permit_amx()
_chain()
