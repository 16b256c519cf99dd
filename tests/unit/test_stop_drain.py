from __future__ import annotations

from pipelines.stop_drain import StopDrain


def test_not_settled_while_the_gate_runs_or_holds_a_seat() -> None:
    drain = StopDrain()
    drain.reported_outcomes(["a"])
    assert not drain.settled(lambda: None)
    assert drain.waiting_for is None


def test_waits_for_every_granted_document_then_settles() -> None:
    drain = StopDrain()
    drain.reported_outcomes(["a"])
    asked = []

    def gate():
        asked.append(1)
        return ["a", "b", "c"]

    assert not drain.settled(gate)
    drain.reported_outcomes(["b", "x"])  # x: never granted, stopped
    assert not drain.settled(gate)
    drain.reported_outcomes(["c"])
    assert drain.settled(gate)
    assert len(asked) == 1  # the Gate grants nothing more once stopped: asked once


def test_settled_at_once_when_nothing_was_granted_or_all_reported() -> None:
    assert StopDrain().settled(lambda: [])
    drain = StopDrain()
    drain.reported_outcomes(["a", "b"])
    assert drain.settled(lambda: ["b", "a"])
