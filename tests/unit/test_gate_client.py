"""The worker's handle on the Gate: what the Gate raises arrives as itself, not as Ray's wrapper."""

from __future__ import annotations

import pytest
from ray.exceptions import RayActorError, RayTaskError

from pipelines.errors import RunStopped
from pipelines.gate_client import RayGateClient
from tests.unit.test_summarize import Pool, job

COLOURED_TRACEBACK = (
    "\x1b[36mray::GateActor.acquire()\x1b[39m\nTraceback (most recent call last):\n"
)


class _Method:
    def __init__(self, raises: BaseException) -> None:
        self._raises = raises

    def remote(self, *args):
        async def call():
            raise self._raises

        return call()


class _Handle:
    """Stands in for the actor handle: every method's call raises `raises` when awaited, as an
    awaited ObjectRef raises the remote error."""

    def __init__(self, raises: BaseException) -> None:
        self._raises = raises

    def __getattr__(self, name: str) -> _Method:
        return _Method(self._raises)


def _from_the_gate(cause: Exception) -> Exception:
    """The error as Ray delivers it to the caller: a class both RayTaskError and the cause's."""
    return RayTaskError("acquire", COLOURED_TRACEBACK, cause).as_instanceof_cause()


async def test_an_error_the_gate_raised_comes_back_with_its_own_message() -> None:
    cause = RuntimeError("every replica has been marked down for 300 s (down_grace_s 300)")
    gate = RayGateClient(_Handle(_from_the_gate(cause)))
    with pytest.raises(RuntimeError) as raised:
        await gate.acquire("d1", 100, 10)
    assert str(raised.value) == str(cause) and not isinstance(raised.value, RayTaskError)
    assert isinstance(raised.value.__cause__, RayTaskError)  # Ray's traceback stays chained


async def test_run_stopped_keeps_its_type_through_every_call() -> None:
    gate = RayGateClient(_Handle(_from_the_gate(RunStopped("run stopped: deadline"))), holder="w1")
    for call in (
        gate.acquire("d1", 100, 10),
        gate.release("p1", {}, []),
        gate.mark_down("r0"),
        gate.aborted(),
        gate.prefilled("p1", 64),
    ):
        with pytest.raises(RunStopped, match="^run stopped: deadline$"):
            await call


async def test_a_dead_gate_still_raises_rays_actor_error() -> None:
    gate = RayGateClient(_Handle(RayActorError()))
    with pytest.raises(RayActorError):
        await gate.acquire("d1", 100, 10)


async def test_a_document_failed_at_the_gate_records_the_gates_message_only() -> None:
    """The reason a user reads in the documents table: no traceback, no terminal colours."""
    gate = RayGateClient(_Handle(_from_the_gate(TimeoutError("no seat within 3600 s"))))
    out = await job(gate, Pool()).summarize("d1", list(range(100)))
    assert (out.status, out.reason) == ("failed", "no batch seat: no seat within 3600 s")
