"""Chat's blocks in vLLM's prefix cache, counted for the controller's KV guard.

The working set itself is `scheduler.chat_cache.ChatCacheSet`; this module only names vLLM's
blocks for it: the blocks a finished chat request left cached (no request holds them, their
content kept for a hit), and the blocks a newly scheduled chat request holds (its prefix hits
among them), which chat has taken back.

Like the batch eviction order, this sees a finished request's blocks where vLLM frees them at once
(`_free_request_blocks` with no deferral, every synchronous scheduler); a free deferred behind an
in-flight GPU step is not counted, which errs towards less room kept for chat.

vLLM private names this depends on (checked by the canary): `KVCacheBlock.block_id`, `.ref_cnt`,
`.is_null`, `.block_hash`; `SchedulerOutput.scheduled_new_reqs` with `.req_id` and `.block_ids`
(one list of block ids per KV cache group).
"""

from __future__ import annotations

from collections.abc import Iterator

from scheduler.step_budget import is_batch


def left_cached(blocks: list) -> list[int]:
    """Ids of those of a freed request's `blocks` that now sit in the cache, held by nobody."""
    return [b.block_id for b in blocks if b.ref_cnt == 0 and not b.is_null
            and b.block_hash is not None]  # fmt: skip


def taken_by_new_chat(sched, output) -> Iterator[int]:
    """Ids of the blocks held by the chat requests this step schedules for the first time."""
    for new in output.scheduled_new_reqs:
        req = sched.requests.get(new.req_id)
        if req is not None and not is_batch(req.priority):
            for group in new.block_ids:
                yield from group
