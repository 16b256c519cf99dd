"""A finished batch request's KV blocks are reused before any block chat may hit again.

vLLM's prefix cache keeps a finished request's full blocks in its free queue and reuses that queue
from the front, least recently used first. A finished batch document's blocks go to the back: its
tens of thousands of tokens of KV, which no request will hit again (every document differs), are
evicted last, after the cached histories of chat sessions whose next turn comes a think time later.
Each such turn then prefills its whole history again, and chat's TTFT pays for batch's memory even
while batch prefills nothing. (In the simulated 70B hour, most windows the controller missed under
steady chat were such re-prefills.)

So while a controller is in charge, the blocks of a finished batch request that no other request
holds move to the front of the free queue, its last block first (the order vLLM gives a request's
own blocks): they stay cached until reused, and are reused before anything chat left behind.

This holds where vLLM frees a finished request's blocks at once (`_free_request_blocks` with no
deferral: every synchronous scheduler, as on CPU). A free deferred behind an in-flight GPU step,
and a preempted request's blocks, keep vLLM's order.

vLLM private names this depends on (checked by the canary): `Scheduler._free_request_blocks(
request)`, `.kv_cache_manager.get_blocks(request_id).blocks`, `.kv_cache_manager.block_pool`
(`.enable_caching`, `.free_block_queue` with `.remove(block)` and `.prepend_n(blocks)`);
`KVCacheBlock.ref_cnt`, `.is_null`, `.prev_free_block`.
"""

from __future__ import annotations


def request_blocks(sched, request) -> list:
    """`request`'s KV blocks, every cache group, in prompt order; [] without prefix caching (then
    vLLM already reuses freed blocks first)."""
    manager = sched.kv_cache_manager
    if not manager.block_pool.enable_caching:
        return []
    return [b for group in manager.get_blocks(request.request_id).blocks for b in group]


def evict_first(sched, blocks: list) -> int:
    """Move those of `blocks` now in the free queue (no request holds them) to its front, the last
    one first; returns how many moved."""
    queue = sched.kv_cache_manager.block_pool.free_block_queue
    free = [b for b in blocks if b.ref_cnt == 0 and not b.is_null and b.prev_free_block is not None]
    for b in free:
        queue.remove(b)
    queue.prepend_n(free[::-1])
    return len(free)
