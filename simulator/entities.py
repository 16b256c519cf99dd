"""The things a simulated replica works on: requests, and the content their tokens stand for.

A simulated prompt has no token ids, only an identity for its content: a tuple of `Segment`s (the
shared system prompt, a user's retrieved context, one turn of history, a document section). Two
prompts that start with the same segments share those tokens, which is all prefix caching needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

CHAT_PRIORITY = 0
"""vLLM priority of chat requests: lower runs first and is preempted last."""
BATCH_PRIORITY = 1
"""vLLM priority of batch requests, always behind chat (docs/design.md §1)."""


@dataclass(frozen=True, slots=True)
class Segment:
    """`length` tokens of content named `key`; equal keys mean equal tokens."""

    key: object
    length: int


@dataclass(slots=True, eq=False)
class Request:
    """One request on its way through a replica; engine state lives beside its description.

    `num_computed` counts tokens whose KV is in the cache. The engine schedules
    `num_tokens - num_computed` tokens for it (a prefill chunk, or one decode token) and samples a
    new output token whenever it catches up with `num_tokens`, as vLLM's scheduler does.
    """

    request_id: str
    cls: Literal["chat", "batch"]
    stage: Literal["chat", "map", "reduce", "whole"]
    priority: int
    arrival: float
    segments: tuple[Segment, ...]
    max_output: int
    output_key: object
    doc_id: str | None = None
    replica: str = ""
    num_computed: int = 0
    output_tokens: int = 0
    cached_tokens: int | None = None  # prefix-cache hit of the first admission; None until then
    chunk_cap: int = 0  # largest prefill chunk per step the admission policy allows; 0: none
    prompt_tokens: int = 0
    held_blocks: int = 0  # KV blocks held: the shared ones in block_keys plus private_blocks
    private_blocks: int = 0  # blocks no other request can hit (partial, or duplicates)
    block_keys: list[int] = field(default_factory=list, repr=False)  # cached blocks, prefix order
    token_times: list[float] = field(
        default_factory=list, repr=False
    )  # arrival of each output token
    hashes: object = field(default=None, repr=False)  # RequestHashes, computed on first need

    def __post_init__(self) -> None:
        self.prompt_tokens = sum(s.length for s in self.segments)

    @property
    def num_tokens(self) -> int:
        """Prompt plus the output sampled so far: what a recompute after preemption must prefill."""
        return self.prompt_tokens + self.output_tokens

    @property
    def total_tokens(self) -> int:
        """The most tokens this request can ever hold in KV."""
        return self.prompt_tokens + self.max_output
