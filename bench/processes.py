"""What /proc shows of this host's processes: trees, groups, sessions, memory, listening sockets.

Reading only: nothing here signals or reaps a process, so a test can use it beside the
`subprocess.Popen` objects that wait for their own children (`bench.soak_processes` adds the
soak's reaping and stopping on top). A zombie counts as gone everywhere: it has exited and holds
nothing but its process-table entry.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state first), or None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def parents() -> dict[int, tuple[int, str]]:
    """Every process's parent and state."""
    out = {}
    for d in Path("/proc").glob("[0-9]*"):
        fields = _stat(int(d.name))
        if fields is not None:
            out[int(d.name)] = (int(fields[1]), fields[0])
    return out


def descendants(pid: int) -> set[int]:
    """Every live process below `pid`, at any depth (children of children included)."""
    table = parents()
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, (parent, _) in table.items() if parent in frontier} - found
        found |= frontier
    return {p for p in found if table[p][1] != "Z"}


def group_members(pgid: int) -> set[int]:
    """Every live process of process group `pgid`."""
    return _members(2, pgid)


def session_members(sid: int) -> set[int]:
    """Every live process of session `sid`: a process group and the groups its members made
    (Ray's raylet starts each worker in a process group of its own, in the same session)."""
    return _members(3, sid)


def _members(field: int, value: int) -> set[int]:
    """Live processes whose /proc stat field `field` (after the name) equals `value`."""
    members = set()
    for d in Path("/proc").glob("[0-9]*"):
        fields = _stat(int(d.name))
        if fields is not None and int(fields[field]) == value and fields[0] != "Z":
            members.add(int(d.name))
    return members


def alive(pids: Iterable[int]) -> set[int]:
    """Those of `pids` still running."""
    return {p for p in pids if (f := _stat(p)) is not None and f[0] != "Z"}


def command(pid: int) -> str:
    """The command line of `pid`, at most 300 characters; "?" once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:300]


def rss_kib(pid: int) -> int | None:
    """VmRSS of `pid` in KiB; None once it is gone (or a kernel thread, which has none)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def wait_gone(
    pids: Iterable[int], timeout_s: float, while_waiting: Callable[[], None] = lambda: None
) -> set[int]:
    """Wait up to `timeout_s` for `pids` to end, calling `while_waiting` at each look; returns
    those still alive then."""
    pids = set(pids)
    deadline = time.monotonic() + timeout_s
    while (left := alive(pids)) and time.monotonic() < deadline:
        while_waiting()
        time.sleep(0.25)
    return left


def listening_address(port: int, owners: set[int] | None = None) -> str | None:
    """The IPv4 address a TCP socket of this host listens on at `port`, from /proc/net/tcp; with
    `owners`, only a socket one of those processes holds (another process may listen on the same
    port at another address: Ray does, on the node's address)."""
    inodes = None if owners is None else _socket_inodes(owners)
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, inode = fields[1], fields[3], fields[9]
        addr, hexport = local.split(":")
        if state == "0A" and int(hexport, 16) == port and (inodes is None or inode in inodes):
            return ".".join(str(int(addr[i : i + 2], 16)) for i in (6, 4, 2, 0))
    return None


def _socket_inodes(pids: set[int]) -> set[str]:
    found = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                found.add(target[8:-1])
    return found
