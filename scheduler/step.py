"""What one engine step carries, and the interface every step-time model offers.

An engine step under continuous batching mixes prefill chunks (each at some prefix position of its
prompt) with one decode token for each running sequence. Its duration is what every decoding chat user
waits for between two tokens, so the planner, the simulator and the controller all reason in terms of
`StepBatch` and ask a `StepTimeModel` how long it takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    """`tokens` prompt tokens prefilled in this step, starting after `prefix_tokens` already in KV."""

    tokens: int
    prefix_tokens: int = 0


@dataclass(frozen=True, slots=True)
class StepBatch:
    """One engine step: prefill chunks plus `decode_seqs` decode tokens over `decode_context_tokens`
    total context (the sum of the KV lengths the decoding sequences attend over)."""

    prefills: tuple[PrefillChunk, ...] = ()
    decode_seqs: int = 0
    decode_context_tokens: int = 0

    @property
    def prefill_tokens(self) -> int:
        return sum(c.tokens for c in self.prefills)

    @property
    def total_tokens(self) -> int:
        """Tokens the step schedules, the quantity `max_num_batched_tokens` budgets."""
        return self.prefill_tokens + self.decode_seqs


class StepTimeModel(Protocol):
    """Anything that predicts the wall time of one engine step."""

    def step_seconds(self, batch: StepBatch) -> float:
        """Predicted duration of `batch`, in seconds."""
        ...
