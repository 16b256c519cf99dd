"""Paged KV blocks with prefix caching by content keys of full blocks (simulator/kv_cache.py)."""

from __future__ import annotations

from simulator.block_hashes import BlockHasher
from simulator.entities import Request, Segment
from simulator.kv_cache import KVCache

B = 16


def req(*segments: tuple[object, int], output: int = 4, rid: str = "r") -> Request:
    return Request(
        request_id=rid,
        cls="chat",
        stage="chat",
        priority=0,
        arrival=0.0,
        segments=tuple(Segment(k, n) for k, n in segments),
        max_output=output,
        output_key=("out", rid),
    )


def prefill(kv: KVCache, r: Request) -> None:
    """Admit `r` with its prefix hits and compute its whole prompt, publishing full blocks."""
    hits = kv.lookup(r)
    n = r.num_tokens - len(hits) * B
    assert kv.can_allocate(r, n, hits)
    kv.allocate(r, n, hits)
    before = r.num_computed
    r.num_computed += n
    kv.register_full_blocks(r, before)


def test_equal_prefixes_share_keys_and_different_ones_do_not():
    hasher = BlockHasher(B)
    a = hasher.for_request((Segment("sys", 40), Segment("u1", 40)), "o")
    b = hasher.for_request((Segment("sys", 40), Segment("u2", 40)), "o")
    assert len(a.prompt_keys) == 80 // B
    # blocks 0 and 1 lie inside the system prompt; block 2 straddles into the user part
    assert a.prompt_keys[:2] == b.prompt_keys[:2]
    assert all(x != y for x, y in zip(a.prompt_keys[2:], b.prompt_keys[2:], strict=True))


def test_a_key_names_the_whole_prefix_not_just_the_block():
    hasher = BlockHasher(B)
    one = hasher.for_request((Segment("a", 16), Segment("x", 16)), "o")
    two = hasher.for_request((Segment("b", 16), Segment("x", 16)), "o")
    assert one.prompt_keys[1] != two.prompt_keys[1]  # same block content, different prefix


def test_output_blocks_match_the_next_turn_that_resends_them():
    hasher = BlockHasher(B)
    turn1 = hasher.for_request((Segment("sys", 20), Segment("q1", 10)), "a1")
    turn2 = hasher.for_request((Segment("sys", 20), Segment("q1", 10), Segment("a1", 50)), "a2")
    # blocks ending inside the first answer (positions 32, 48, 64, 80) are the same content
    assert [turn1.key(k) for k in range(1, 5)] == turn2.prompt_keys[1:5]


def test_second_request_hits_the_first_ones_full_blocks():
    kv = KVCache(10_000, B, prefix_caching=True)
    first = req(("sys", 100), ("q", 20), rid="a")
    prefill(kv, first)
    second = req(("sys", 100), ("q2", 20), rid="b")
    hits = kv.lookup(second)
    assert len(hits) == 100 // B  # the 6 full blocks of the system prompt
    kv.allocate(second, second.num_tokens - len(hits) * B, hits)
    assert second.num_computed == len(hits) * B


def test_a_full_hit_still_recomputes_the_last_token():
    kv = KVCache(10_000, B, prefix_caching=True)
    prefill(kv, req(("doc", 64), rid="a"))
    again = req(("doc", 64), rid="b")
    assert len(kv.lookup(again)) == 3  # 4 full blocks cached, the last one is recomputed


def test_lookup_stops_at_the_first_miss():
    kv = KVCache(10_000, B, prefix_caching=True)
    r = req(("p", 64), rid="a")
    prefill(kv, r)
    evicted = r.hashes.prompt_keys[1]
    kv.free(r)
    del kv.evictable[evicted]
    del kv.refs[evicted]
    kv.free_blocks += 1
    assert len(kv.lookup(req(("p", 64), ("more", 32), rid="b"))) == 1


def test_without_prefix_caching_nothing_is_shared():
    kv = KVCache(10_000, B, prefix_caching=False)
    prefill(kv, req(("sys", 100), rid="a"))
    assert kv.lookup(req(("sys", 100), ("q", 5), rid="b")) == []
    assert kv.refs == {}


def test_usage_counts_referenced_blocks_and_free_keeps_the_content():
    kv = KVCache(1600, B, prefix_caching=True)
    r = req(("p", 40), rid="a")
    prefill(kv, r)
    assert kv.used_blocks == 3  # 2 full blocks + 1 partial
    assert kv.usage == 3 / 100
    kv.free(r)
    assert kv.used_blocks == 0
    assert len(kv.evictable) == 2  # full blocks stay reusable until evicted
    assert kv.free_blocks == 98


def test_free_releases_tail_blocks_first_so_eviction_keeps_shared_beginnings():
    kv = KVCache(64, B, prefix_caching=True)  # 4 blocks
    r = req(("p", 48), rid="a")
    prefill(kv, r)
    keys = list(r.hashes.prompt_keys)
    kv.free(r)
    assert list(kv.evictable) == keys[::-1]  # LRU first: the tail
    other = req(("z", 40), rid="b")
    kv.allocate(other, 40)  # needs 3 blocks: 1 empty, then 2 evicted
    assert list(kv.evictable) == [keys[0]]


def test_blocks_freed_to_evict_first_go_before_every_cached_block_tail_first():
    """A finished batch document's blocks, under the plug-in: reused before chat's history."""
    kv = KVCache(1600, B, prefix_caching=True)
    chat, doc = req(("history", 48), rid="chat"), req(("doc", 48), rid="doc")
    prefill(kv, chat)
    prefill(kv, doc)
    kv.free(chat)
    kv.free(doc, evict_first=True)
    doc_keys, chat_keys = list(doc.hashes.prompt_keys), list(chat.hashes.prompt_keys)
    assert list(kv.evictable) == doc_keys[::-1] + chat_keys[::-1]


def test_can_allocate_counts_hit_blocks_it_would_take_from_the_evictable_pool():
    kv = KVCache(64, B, prefix_caching=True)  # 4 blocks
    owner = req(("p", 48), rid="x")
    prefill(kv, owner)
    assert kv.used_blocks == 3
    kv.free(owner)
    again = req(("p", 48), ("q", 16), rid="y")
    hits = kv.lookup(again)
    assert len(hits) == 3
    # 4 blocks in all, 3 of them hits now evictable: room for exactly one more block
    assert kv.can_allocate(again, 16, hits)
    assert not kv.can_allocate(again, 17, hits)


def test_a_block_computed_twice_stays_private_to_the_second_request():
    kv = KVCache(10_000, B, prefix_caching=True)
    a, b = req(("same", 32), rid="a"), req(("same", 32), rid="b")
    for r in (a, b):  # both admitted before either published its blocks
        kv.allocate(r, 32)
    for r in (a, b):
        r.num_computed = 32
        kv.register_full_blocks(r, 0)
    assert len(a.block_keys) == 2 and a.private_blocks == 0
    assert b.block_keys == [] and b.private_blocks == 2
    kv.free(a)
    kv.free(b)
    assert kv.free_blocks + len(kv.evictable) == kv.num_blocks
