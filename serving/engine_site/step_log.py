"""Every engine step the plug-in saw, timed inside the engine: the calibration's ground truth.

A step timed from outside (a request's time to first token minus the replica's overhead) also
carries what the request costs apart from the step: the API server taking in and hashing a long
prompt, the prefix-cache lookup, the stream's first message. Those costs grow with the prompt, so
they land on the latency model's per-prefix-token terms and price a small chunk deep in a prompt
as if it paid them every step. Inside the engine the step is known exactly: which chunks at which
prefix positions, how many decodes over how much context, and how long the scheduler waited for
the step's output.

Lines are in the samples-file format (`serving/step_samples.py`), so `nightshift calibrate
--refit` and the fit read them as they are:

    {"prefills": [[tokens, prefix_tokens], ...], "decode_seqs": B,
     "decode_context_tokens": X, "seconds": s, "stalled": false}

The log is written only when asked (`STEP_LOG_ENV`) and stops at `MAX_LINES`, so a replica left
recording cannot fill its disk. Each line is written as its step ends (one `write` of ~80 bytes,
microseconds beside a millisecond step), so a reader sees every step that has finished.
"""

from __future__ import annotations

import json
from pathlib import Path

STEP_LOG_ENV = "NIGHTSHIFT_STEP_LOG"
"""Set to a file path to record every step there (calibration sets it on the replica it starts)."""
MAX_LINES = 200_000
"""About 12 MB of steps: hours of calibration traffic, far more than any fit needs."""


class StepLog:
    """Appends one line per step to `path` until `MAX_LINES`; I/O errors end the log, not the
    engine (the caller logs them once)."""

    def __init__(self, path: str | Path, max_lines: int = MAX_LINES) -> None:
        self.path = Path(path)
        self.max_lines = max_lines
        self.lines = 0
        self._file = open(self.path, "a", buffering=1)  # noqa: SIM115 - lives with the engine

    def record(
        self,
        prefills: list[tuple[int, int]],
        decode_seqs: int,
        decode_context_tokens: int,
        seconds: float,
    ) -> None:
        """One step: its chunks as (tokens, prefix_tokens), its decodes, its measured seconds."""
        if self.lines >= self.max_lines or self._file.closed:
            return
        row = {
            "prefills": [list(c) for c in prefills],
            "decode_seqs": decode_seqs,
            "decode_context_tokens": decode_context_tokens,
            "seconds": seconds,
            "stalled": False,
        }
        self._file.write(json.dumps(row, separators=(",", ":")) + "\n")
        self.lines += 1
        if self.lines == self.max_lines:
            self._file.close()

    def close(self) -> None:
        self._file.close()
