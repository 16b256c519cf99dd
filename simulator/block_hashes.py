"""Content keys of full KV blocks, the simulated counterpart of vLLM's chained block hashes.

vLLM hashes every full block together with the hash of the block before it, so a block's hash names
the whole prefix that ends with it. Here the key of a block ending at position `e` inside segment `j`
is `hash((chain_j, key_j, e - start_j))`, where `chain_j` names the complete segments before `j`: the
same prefix gives the same key, a different one (almost surely) another, and computing it needs no
walk over earlier blocks. Key lists of a segment are memoized because every chat turn repeats the
same system prompt, user context and history.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.entities import Segment


@dataclass(slots=True)
class RequestHashes:
    """The block keys of one request: its prompt's, precomputed, and its output's, on demand."""

    prompt_keys: list[int]
    chain_after_prompt: int
    prompt_tokens: int
    output_key: object
    block_size: int

    def key(self, block: int) -> int:
        """Key of block number `block` (0-based) of the request's prompt + output."""
        if block < len(self.prompt_keys):
            return self.prompt_keys[block]
        end = (block + 1) * self.block_size
        return hash((self.chain_after_prompt, self.output_key, end - self.prompt_tokens))


class BlockHasher:
    """Computes `RequestHashes`, remembering the key lists of recently seen segments."""

    def __init__(self, block_size: int, memo_limit: int = 4096) -> None:
        self.block_size = block_size
        self.memo_limit = memo_limit
        self._memo: dict[tuple, list[int]] = {}

    def for_request(self, segments: tuple[Segment, ...], output_key: object) -> RequestHashes:
        keys: list[int] = []
        chain, start = 0, 0
        for seg in segments:
            keys.extend(self._segment_keys(chain, start, seg))
            chain = hash((chain, seg.key, seg.length))
            start += seg.length
        return RequestHashes(keys, chain, start, output_key, self.block_size)

    def _segment_keys(self, chain: int, start: int, seg: Segment) -> list[int]:
        memo_key = (chain, seg.key, seg.length)
        keys = self._memo.get(memo_key)
        if keys is None:
            if len(self._memo) >= self.memo_limit:
                self._memo.clear()  # cheaper than LRU bookkeeping; hot segments come back at once
            b = self.block_size
            first_end = (start // b + 1) * b
            keys = [
                hash((chain, seg.key, e - start))
                for e in range(first_end, start + seg.length + 1, b)
            ]
            self._memo[memo_key] = keys
        return keys
