"""Chat's prefix-cache working set: the KV blocks chat left cached within a horizon.

A chat session's next turn starts with its whole history, which hits the prefix cache only if
the blocks its last turn left there survive until the turn comes back, a think time later. A
batch document holds its KV for minutes, and every block it holds is one a chat history no longer
keeps: a history evicted is prefilled again within chat's own step budget, and every chat arriving
behind it waits for that (chat prompts are served in arrival order). Evicting batch's finished
blocks first (`serving/engine_site/batch_eviction.py`) does not help while the document is still
in flight.

So the KV guard keeps room for chat's working set (Denning's): the blocks chat requests left in the
cache (unreferenced, content kept) within the last `horizon_s` seconds and that no chat request has
taken back since. A block taken back is held again and counted in KV usage; one left earlier than
the horizon is a history whose session, by the operator's horizon, is not coming back soon.
Invariant: with the guard, chat sessions returning within the horizon find what chat alone's cache
would have kept for them.

Pure and clock-free: keys name a block (vLLM's block id, the simulator's content key); times are
passed in. Entries older than the horizon are dropped when counted, so a horizon that later grows
counts only from then on.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable


class ChatCacheSet:
    """Blocks chat left in the prefix cache, oldest first, with when each was left last."""

    def __init__(self, block_size: int = 1) -> None:
        self.block_size = block_size
        self._left: OrderedDict[Hashable, float] = OrderedDict()

    def left(self, keys: Iterable[Hashable], t: float) -> None:
        """Chat left `keys` cached at `t` (a finished chat request's blocks no request holds)."""
        left = self._left
        for key in keys:
            left[key] = t
            left.move_to_end(key)

    def taken(self, keys: Iterable[Hashable]) -> None:
        """A chat request holds `keys` again (a prefix hit): they are in KV usage from now on."""
        left = self._left
        for key in keys:
            left.pop(key, None)

    def blocks(self, t: float, horizon_s: float) -> int:
        """How many blocks chat left within `horizon_s` before `t` and has not taken back."""
        left, oldest = self._left, t - horizon_s
        while left and next(iter(left.values())) < oldest:
            left.popitem(last=False)
        return len(left)

    def tokens(self, t: float, horizon_s: float | None) -> int | None:
        """The working set at `t` in tokens; None without a horizon (nothing is counted)."""
        return None if horizon_s is None else self.blocks(t, horizon_s) * self.block_size
