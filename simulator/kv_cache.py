"""Paged KV memory with prefix caching by content keys of full blocks (vLLM's block manager).

Blocks come in three states: free (hold nothing), referenced (held by running requests, counted in
KV usage), and cached-but-unreferenced (hold a finished prefix that a later request may reuse, and
are reclaimed least-recently-used first when memory runs short). Only full blocks are cached; a
request's partial last block stays private to it. Freed requests release their blocks tail first so
that eviction eats the ends of prefixes before their shared beginnings, as vLLM does.

Where vLLM keeps one free queue for empty and reusable blocks alike, this pool hands out empty blocks
before evicting reusable ones; the difference only ever raises the hit rate a little.
"""

from __future__ import annotations

from collections import OrderedDict

from simulator.block_hashes import BlockHasher, RequestHashes
from simulator.entities import Request


class KVCache:
    """Block pool of one replica. All sizes are in blocks of `block_size` tokens."""

    def __init__(self, capacity_tokens: int, block_size: int, prefix_caching: bool) -> None:
        self.block_size = block_size
        self.num_blocks = capacity_tokens // block_size
        self.prefix_caching = prefix_caching
        self.free_blocks = self.num_blocks
        self.refs: dict[int, int] = {}
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self.hasher = BlockHasher(block_size)

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self.free_blocks - len(self.evictable)

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by requests, what `vllm:kv_cache_usage_perc` reports."""
        return self.used_blocks / self.num_blocks

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def lookup(self, req: Request) -> list[int]:
        """Keys of the cached blocks that start `req`'s tokens, stopping at the first miss.

        The last token is always recomputed (its logits are needed), so a full hit stops one block
        short, as in vLLM."""
        if not self.prefix_caching:
            return []
        hashes = self._hashes(req)
        refs, limit = self.refs, (req.num_tokens - 1) // self.block_size
        hits: list[int] = []
        for key in hashes.prompt_keys[:limit]:
            if key not in refs:
                return hits
            hits.append(key)
        for block in range(len(hits), limit):  # into the output, when a preempted request returns
            key = hashes.key(block)
            if key not in refs:
                break
            hits.append(key)
        return hits

    def _hashes(self, req: Request) -> RequestHashes:
        if req.hashes is None:
            req.hashes = self.hasher.for_request(req.segments, req.output_key)
        return req.hashes

    def can_allocate(self, req: Request, new_tokens: int, hits: list[int] = ()) -> bool:
        """Whether `new_tokens` more tokens (after `hits` cached blocks) fit in memory now."""
        held = req.held_blocks + len(hits)
        need = self.blocks_for(req.num_computed + len(hits) * self.block_size + new_tokens) - held
        if need <= 0:
            return True
        reclaimable = len(self.evictable) - sum(1 for k in hits if self.refs[k] == 0)
        return need <= self.free_blocks + reclaimable

    def allocate(self, req: Request, new_tokens: int, hits: list[int] = ()) -> None:
        """Take the cached `hits` and enough blocks for `new_tokens`; call `can_allocate` first."""
        if hits:
            self._take_hits(req, hits)
        need = self.blocks_for(req.num_computed + new_tokens) - req.held_blocks
        if need <= 0:
            return
        from_free = min(need, self.free_blocks)
        self.free_blocks -= from_free
        for _ in range(need - from_free):
            key, _ = self.evictable.popitem(last=False)
            del self.refs[key]
        req.held_blocks += need
        req.private_blocks += need

    def _take_hits(self, req: Request, hits: list[int]) -> None:
        refs, evictable = self.refs, self.evictable
        for key in hits:
            if refs[key] == 0:
                del evictable[key]
            refs[key] += 1
        req.block_keys.extend(hits)
        req.held_blocks += len(hits)
        req.num_computed += len(hits) * self.block_size

    def register_full_blocks(self, req: Request, computed_before: int) -> None:
        """Publish the blocks `req` filled since `computed_before`, so later requests can hit them."""
        if not self.prefix_caching:
            return
        b = self.block_size
        first, last = computed_before // b, req.num_computed // b
        if first == last:
            return
        hashes = self._hashes(req)
        in_prompt = hashes.prompt_keys[first:last]
        keys = in_prompt + [hashes.key(k) for k in range(first + len(in_prompt), last)]
        refs, mine = self.refs, req.block_keys
        for key in keys:
            if key in refs:
                continue  # computed twice concurrently: our copy stays private, as a duplicate
            refs[key] = 1
            mine.append(key)
            req.private_blocks -= 1

    def free(self, req: Request, evict_first: bool = False) -> None:
        """Release everything `req` holds; its full blocks stay reusable until evicted, after
        every block freed before them or, with `evict_first`, before all of them (the engine
        plug-in's order for a finished batch request, `serving/engine_site/batch_eviction.py`)."""
        refs, evictable = self.refs, self.evictable
        for key in req.block_keys if evict_first else reversed(req.block_keys):
            n = refs[key] - 1
            refs[key] = n
            if n == 0:
                evictable[key] = None
                if evict_first:  # head first, so that the prompt's tail ends up evicted first
                    evictable.move_to_end(key, last=False)
        self.free_blocks += req.private_blocks
        req.block_keys = []
        req.held_blocks = req.private_blocks = 0
