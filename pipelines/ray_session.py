"""Which Ray a run's driver uses, and what of it the run stops when it ends.

Ray's rule for `ray.init`: a driver that joins a running cluster (an address, or `RAY_ADDRESS`,
which `ray job submit` sets for its entrypoint) must not pass what belongs to a node (`num_cpus`,
`num_gpus`, `resources`, `labels`, `object_store_memory`, `_system_config`): `ray start` fixed
those when the node started, and Ray refuses them from a joining driver. The run passes none of
them either way, and passes `include_dashboard` only when it starts Ray itself.

A run stops only what it started:

- it joined a cluster: at the end it disconnects its driver. Ray then ends the run's job, and with
  it any actor the job still owns (the Gate, Ray Data's pools) on whatever node it runs; the
  cluster's nodes, and other jobs on them, keep running. A connected driver's `ray.shutdown()`
  never stops a node it did not start.
- it started Ray on this host (no address): that instance stays up for the life of the process,
  for the next run in it (a benchmark runs several back to back), and Ray's exit hook stops it
  with the process.
- its caller had initialized Ray already: the caller's to stop.

Without `RAY_ADDRESS` the driver asks Ray for a new local instance (`address="local"`). Ray's own
default would join whatever `ray start` last ran on this host (its address file under /tmp/ray),
and then refuse the node settings a local start passes; a run started here therefore never
depends on what else ran on the host. Joining a cluster is what `RAY_ADDRESS` (or `auto`) is for.

A Ray started here lives as long as the process, whichever thread opened it. Ray binds the
node's processes (GCS, raylet) to the thread that spawned them (`PR_SET_PDEATHSIG`, which Linux
fires when that thread ends, not the process), so a run opened from a thread that ends, a
Prefect task's worker thread or a caller's own, would have its Ray killed under it, and the
driver would wait 60 s for a GCS that is gone before Ray ends the process. Off the main thread,
the local start is therefore made from a thread kept for the life of the process.

SIGTERM stops the driver as Ctrl-C does (`Terminated`, a KeyboardInterrupt) once a command has
called `stop_on_sigterm()` from its main thread. Two of Ray's handlers would take that over:

- `ray.init` on the main thread installs its own SIGTERM handler (`sys.exit(15)`): no
  KeyboardInterrupt, so a stop would skip the paths that end a run cleanly on Ctrl-C. The
  handler in force before `ray.init` is put back after it.
- Ray's failure-signal handler printed a native stack trace and aborted the process (exit -6)
  without the run's clean-up, so a supervisor's ordinary stop read as a crash. The driver's core
  worker is therefore made without it (`ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER`, which
  Ray reads from the environment when it is imported and from the module when the core worker is
  made; the environment variable alone would depend on being set before any import of Ray).
  Ray's workers and node processes keep theirs.

Ray Client addresses (`ray://...`) are refused: a client's driver runs off the cluster, while the
Gate runs on the driver's node and writes the run's request journal into the run folder there.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from pipelines.errors import Terminated

ADDRESS_ENV = "RAY_ADDRESS"
TASK_EVENTS_KEPT = 1_000
"""Finished tasks whose records the GCS of a Ray the run starts keeps (Ray's default: 100,000).
A night runs a Ray Data task per document, and the GCS holds every task's record until its cap,
so its memory grows until the cap is reached: under the default, through the first hundred
thousand tasks. Nothing in a run reads them; the last thousand are there for `ray list tasks`.
A cluster's nodes set theirs when they start (docs/operations.md, "Ray cluster")."""


class RayAddressError(ValueError):
    """A Ray address the run cannot use; the message says what to use instead."""


def ray_address(environ: Mapping[str, str] | None = None) -> str | None:
    """The address the run's `ray.init` gets: `RAY_ADDRESS`, or None (start Ray here) when it is
    unset or empty. Checked: see `check_ray_address`."""
    environ = os.environ if environ is None else environ
    address = environ.get(ADDRESS_ENV, "").strip() or None
    check_ray_address(address)
    return address


def check_ray_address(address: str | None) -> None:
    if address is not None and address.startswith("ray://"):
        raise RayAddressError(
            f"{ADDRESS_ENV}={address}: Ray Client runs the run's driver off the cluster, but the "
            "Gate runs on the driver's node and writes the run folder's journal there. Submit the "
            "run with `ray job submit` (docs/operations.md, 'Ray cluster'), or run it on a "
            f"cluster node with {ADDRESS_ENV}=HEAD:6379 (the head's GCS address) or auto"
        )


def joins_cluster(address: str | None) -> bool:
    """Whether `ray.init(address=address)` joins a running cluster rather than starting Ray here
    (`local` asks Ray for a new local instance)."""
    return address is not None and address != "local"


def init_kwargs(address: str | None) -> dict:
    """`ray.init`'s arguments for the run's driver: driver settings only when joining a cluster
    (Ray refuses node settings from a joining driver)."""
    kwargs: dict = {
        "address": address if joins_cluster(address) else "local",
        "log_to_driver": False,
        "logging_level": logging.WARNING,
    }
    if not joins_cluster(address):  # node settings: only where this driver starts Ray
        kwargs["include_dashboard"] = False
        kwargs["_system_config"] = {"task_events_max_num_task_in_gcs": TASK_EVENTS_KEPT}
    return kwargs


@dataclass(frozen=True)
class RaySession:
    """The run's hold on Ray: `close()` disconnects the driver only when this session joined a
    running cluster itself (see the module's docstring for why nothing else is stopped)."""

    address: str | None
    connected_here: bool
    """Whether this session called `ray.init` (False: its caller had)."""

    @property
    def disconnects(self) -> bool:
        return self.connected_here and joins_cluster(self.address)

    def close(self) -> None:
        if self.disconnects:
            import ray

            ray.shutdown()


def open_ray(environ: Mapping[str, str] | None = None) -> RaySession:
    """Join the cluster `RAY_ADDRESS` names, or start Ray here without one; an already
    initialized Ray is used as it is."""
    import ray

    if ray.is_initialized():
        return RaySession(address=None, connected_here=False)
    from ray._private import ray_constants

    address = ray_address(environ)
    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True  # this driver's only (docstring)
    kwargs = init_kwargs(address)
    if joins_cluster(address) or _on_main_thread():
        with _sigterm_kept():
            ray.init(**kwargs)
    else:
        _init_on_lasting_thread(kwargs)
    return RaySession(address=address, connected_here=True)


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def _sigterm_kept():
    """Put back the SIGTERM handler `ray.init` replaces on the main thread (docstring)."""
    if not _on_main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _init_on_lasting_thread(kwargs: dict) -> None:
    """`ray.init(**kwargs)` from a daemon thread that then waits for the process to end, so the
    node processes it spawns outlive the caller's thread (docstring); its error is the caller's."""
    import ray

    outcome: list[BaseException | None] = []
    started = threading.Event()

    def owner() -> None:
        try:
            ray.init(**kwargs)
            outcome.append(None)
        except BaseException as exc:  # handed to the caller, who raises it
            outcome.append(exc)
        started.set()
        if outcome[0] is None:
            threading.Event().wait()  # never set: the thread ends with the process

    threading.Thread(target=owner, name="ray-local-node", daemon=True).start()
    started.wait()
    if outcome[0] is not None:
        raise outcome[0]


def stop_on_sigterm() -> None:
    """Make SIGTERM raise `Terminated` in this process, as Ctrl-C raises KeyboardInterrupt, so a
    supervisor's stop runs the same clean-up. Call it from the main thread of a command (Python
    sets signal handlers there only; the flow may open Ray in another); elsewhere a no-op."""
    if _on_main_thread():
        signal.signal(signal.SIGTERM, _terminated)


_SIGTERM_RECEIVED = threading.Event()


def stopped_by_sigterm() -> bool:
    """Whether SIGTERM reached this process through `stop_on_sigterm`'s handler: a command's
    exit code tells a supervisor's stop (143) from Ctrl-C (130) by it."""
    return _SIGTERM_RECEIVED.is_set()


def _terminated(signum, frame) -> None:
    _SIGTERM_RECEIVED.set()
    raise Terminated("SIGTERM")
