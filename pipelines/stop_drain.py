"""Ending a stopped night without waiting for documents that can only end `stopped`.

Once the Gate stops (the night's deadline, or `stop_after_s`), it grants nothing more, so a
document it never granted a seat ends `stopped` and writes nothing: it is left for the next run.
Ray Data still runs each such document through a summarizer to learn that, one task per
document, which with ~15,000 left took over five minutes past the deadline. The driver needs only
the outcomes of the documents the Gate did grant (finished, failed, or cut between sections); once
it has those, the rest are counted as stopped and the night ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


class StopDrain:
    """The outcomes a driver has had this attempt, and, once the Gate has stopped and nothing is
    held, those it still waits for.

    Invariant: `settled()` is true only when every document the Gate ever granted a seat has
    reported, so no document that could end done or failed is cut off."""

    def __init__(self) -> None:
        self.reported: set[str] = set()
        self.waiting_for: set[str] | None = None
        """None until the Gate has answered with its granted documents."""

    def reported_outcomes(self, doc_ids: Iterable[str]) -> None:
        ids = set(doc_ids)
        self.reported |= ids
        if self.waiting_for is not None:
            self.waiting_for -= ids

    def settled(self, granted_once_stopped: Callable[[], list[str] | None]) -> bool:
        """Whether the night has no outcome left but `stopped`. `granted_once_stopped` is the
        Gate's `settled_docs` (None while it still runs or holds a seat); it is asked until it
        answers, then never again (it grants nothing more once stopped)."""
        if self.waiting_for is None:
            granted = granted_once_stopped()
            if granted is None:
                return False
            self.waiting_for = set(granted) - self.reported
        return not self.waiting_for
