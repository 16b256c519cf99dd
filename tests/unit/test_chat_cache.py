"""Chat's prefix-cache working set: blocks chat left cached within the horizon, not taken back."""

from __future__ import annotations

from scheduler.chat_cache import ChatCacheSet


def test_blocks_left_within_the_horizon_count_until_chat_holds_them_again():
    cache = ChatCacheSet()
    cache.left([1, 2, 3], t=0.0)
    cache.left([4, 5], t=30.0)
    assert cache.blocks(t=40.0, horizon_s=60.0) == 5
    cache.taken([2, 9])  # a hit on 2; 9 was never left by chat
    assert cache.blocks(t=40.0, horizon_s=60.0) == 4
    assert cache.blocks(t=61.0, horizon_s=60.0) == 2, "1 and 3 were left too long ago"


def test_a_block_left_again_counts_from_its_last_leaving():
    cache = ChatCacheSet()
    cache.left([1, 2], t=0.0)
    cache.left([1], t=50.0)  # the shared prefix, left again by the next chat
    assert cache.blocks(t=70.0, horizon_s=60.0) == 1
    assert cache.blocks(t=111.0, horizon_s=60.0) == 0


def test_a_horizon_of_zero_keeps_nothing():
    cache = ChatCacheSet()
    cache.left([1], t=10.0)
    assert cache.blocks(t=10.5, horizon_s=0.0) == 0
