"""The plug-in's side of the control document: poll the file, keep the last valid one, decide.

Runs inside the engine-core process, on the scheduler's thread, once per step; it touches the file
system at most every `poll_s` (a `stat`, and a read only when the file changed), so a step pays
nothing measurable for it.

What the plug-in does follows from what the channel has seen, never from guesses:
- no valid document ever: `None`, the plug-in is inert and the engine is stock vLLM;
- a valid document before its `expires_at`: apply it;
- past `expires_at`, or the file gone or unreadable after a valid one: pause batch prefill, since
  a controller was in charge and went silent;
- an invalid or stale document (bad JSON, unknown key, wrong type, `seq` not above the last,
  over `MAX_BYTES`, not a regular file, already past its `expires_at`): it is rejected with its
  reason (counted, logged once per distinct reason) and the previous valid document stays in force
  until it expires. An expired document is still taken when none was ever applied, so that a
  controller whose documents all arrive late (its clock behind this host's) pauses batch prefill
  rather than leaving stock scheduling on.

The file is read at most `MAX_BYTES + 1` bytes at a time and only when it is a regular file, opened
without blocking: whatever is put in the folder (a huge file, a FIFO), the step goes on.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scheduler import control_document
from scheduler.control_document import MAX_BYTES, ControlDocument, ControlDocumentError
from scheduler.latency_model import LatencyModel

DEFAULT_POLL_S = 0.025


@dataclass(frozen=True, slots=True)
class Directive:
    """What the plug-in applies this step."""

    state: str
    """`active` (sizing to the target), `paused` (by the document), `expired` or `lost` (the
    controller went silent); every state but `active` grants batch prefill nothing."""
    seq: int
    target_s: float
    model: LatencyModel
    min_chunk_tokens: int
    idle_target_s: float | None = None
    """Target of steps with no chat in the engine (`scheduler.step_budget.BatchStepTarget`)."""
    mean_target_s: float | None = None
    """Mean step time batch keeps to beside chat (`scheduler.step_budget.StepCredit`)."""
    chat_cache_horizon_s: float | None = None
    """How far back chat's prefix-cache working set is counted (None: it is not)."""
    tail_scale: bool = True
    """Whether chunks are sized to the model scaled by the tail of this engine's own error."""

    @property
    def sizing(self) -> bool:
        return self.state == "active"


class ControlChannel:
    """Reads `path` (written atomically by the controller) and says what to apply."""

    def __init__(
        self,
        path: str | Path,
        log: Callable[[str], None],
        poll_s: float = DEFAULT_POLL_S,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path)
        self.poll_s = poll_s
        self._log = log
        self._wall, self._monotonic = wall, monotonic
        self._next_poll = 0.0
        self._seen: tuple[int, int, int] | None = None
        self._doc: ControlDocument | None = None
        self._lost = False
        self.rejected = 0
        self.last_rejection: str | None = None
        self._reasons_logged: set[str] = set()

    @property
    def next_poll(self) -> float:
        """Monotonic time of the next look at the file: nothing read can change before it."""
        return self._next_poll

    def directive(self) -> Directive | None:
        """What to apply now; None while no valid document was ever read (stock behaviour)."""
        now = self._monotonic()
        if now >= self._next_poll:
            self._next_poll = now + self.poll_s
            self._poll()
        doc = self._doc
        if doc is None:
            return None
        if self._lost:
            state = "lost"
        elif doc.expired(self._wall()):
            state = "expired"
        else:
            state = "paused" if doc.pause else "active"
        idle, mean = doc.idle_step_target_ms, doc.mean_step_target_ms
        return Directive(
            state, doc.seq, doc.batch_step_target_ms / 1000.0, doc.latency_model,
            doc.min_chunk_tokens, None if idle is None else idle / 1000.0,
            None if mean is None else mean / 1000.0, doc.chat_cache_horizon_s, doc.tail_scale,
        )  # fmt: skip

    def _poll(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._lose("control document removed")
            return
        except OSError as exc:
            self._lose(f"control document unreadable: {exc}")
            return
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key == self._seen:
            return
        self._seen = key
        if not stat.S_ISREG(st.st_mode):
            self._reject(f"not a regular file: {self.path} (write documents atomically)")
            return
        if st.st_size > MAX_BYTES:
            self._reject(f"document is {st.st_size} bytes, more than {MAX_BYTES}")
            return
        try:
            text = _read_at_most(self.path, MAX_BYTES + 1)
        except OSError as exc:
            self._lose(f"control document unreadable: {exc}")
            return
        self._accept(text)

    def _accept(self, text: bytes) -> None:
        try:
            doc = control_document.parse(text)
        except ControlDocumentError as exc:
            self._reject(str(exc))
            return
        if self._doc is not None and doc.seq <= self._doc.seq:
            if doc.seq < self._doc.seq or doc != self._doc:
                self._reject(f"stale seq {doc.seq}: last applied is {self._doc.seq}")
            return
        try:
            control_document.check_not_expired(doc, self._wall())
        except ControlDocumentError as exc:
            self._reject(str(exc))
            if self._doc is None:  # a controller is trying to take charge: pause, not stock
                self._doc = doc
            return
        if self._lost or self._doc is None:
            self._log(f"control document seq {doc.seq} applied: target "
                      f"{doc.batch_step_target_ms:g} ms{' (pause)' if doc.pause else ''}")  # fmt: skip
        self._doc, self._lost = doc, False

    def _lose(self, reason: str) -> None:
        self._seen = None
        if self._doc is not None and not self._lost:
            self._lost = True
            self._log(f"{reason} after seq {self._doc.seq}: batch prefill paused")

    def _reject(self, reason: str) -> None:
        self.rejected += 1
        self.last_rejection = reason
        kind = reason.split(":")[0]
        if kind not in self._reasons_logged:
            self._reasons_logged.add(kind)
            self._log(f"control document rejected ({reason}); previous one kept")


def _read_at_most(path: Path, limit: int) -> bytes:
    """Up to `limit` bytes of `path`, opened without blocking (a FIFO put there reads empty)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        chunks, left = [], limit
        while left > 0 and (chunk := os.read(fd, left)):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
