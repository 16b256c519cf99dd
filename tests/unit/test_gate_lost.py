"""The message of a run whose Gate died names the error that started it, without Ray's colours."""

from __future__ import annotations

from pipelines.job import _gate_lost_message


class ActorDiedError(Exception):
    pass


class TaskError(Exception):
    """As Ray Data wraps a worker's failed call: a coloured first line, the error in `cause`."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__("\x1b[36mray::MapWorker(MapBatches(Summarize)).submit()\x1b[39m (pid=1)")
        self.cause = cause


def test_the_innermost_error_is_named_with_what_was_kept_and_how_to_resume() -> None:
    try:
        raise TaskError(ActorDiedError("The actor died unexpectedly.\nDetails follow."))
    except TaskError as exc:
        message = _gate_lost_message("night-1", 3, exc)
    assert "(ActorDiedError: The actor died unexpectedly.)" in message
    assert "\x1b" not in message and "Details" not in message
    assert "the 3 documents finished so far are kept" in message
    assert "rerun with --run-id night-1" in message
