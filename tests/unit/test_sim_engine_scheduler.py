"""vLLM-like continuous batching of one replica (simulator/engine_scheduler.py)."""

from __future__ import annotations

from simulator.config import EngineParams
from simulator.engine_scheduler import EngineScheduler
from simulator.entities import BATCH_PRIORITY, CHAT_PRIORITY, Request, Segment
from simulator.kv_cache import KVCache


def engine(**overrides) -> EngineScheduler:
    params = EngineParams(**{"kv_capacity_tokens": 100_000, **overrides})
    kv = KVCache(params.kv_capacity_tokens, params.block_size, params.enable_prefix_caching)
    return EngineScheduler(params, kv)


def request(rid: str, prompt: int, output: int = 3, cls: str = "chat", t: float = 0.0) -> Request:
    return Request(
        request_id=rid,
        cls=cls,
        stage="chat" if cls == "chat" else "whole",
        priority=CHAT_PRIORITY if cls == "chat" else BATCH_PRIORITY,
        arrival=t,
        segments=(Segment(("content", rid), prompt),),
        max_output=output,
        output_key=("out", rid),
    )


def step(eng: EngineScheduler, now: float):
    scheduled = eng.schedule(now)
    assert scheduled is not None
    return scheduled, eng.complete(scheduled, now)


def test_the_step_budget_caps_tokens_and_long_prompts_are_chunked():
    eng = engine(max_num_batched_tokens=100)
    eng.add(request("a", 250))
    chunks = []
    for t in range(3):
        s, _ = step(eng, float(t))
        chunks.append([(c.tokens, c.prefix_tokens) for c in s.batch.prefills])
    assert chunks == [[(100, 0)], [(100, 100)], [(50, 200)]]


def test_decodes_come_first_and_prefill_takes_what_is_left_of_the_budget():
    eng = engine(max_num_batched_tokens=64)
    eng.add(request("a", 10, output=50))
    step(eng, 1.0)  # prefill of a, first token
    eng.add(request("b", 500))
    s, _ = step(eng, 2.0)
    assert s.batch.decode_seqs == 1
    assert s.batch.decode_context_tokens == 11
    assert [(c.tokens, c.prefix_tokens) for c in s.batch.prefills] == [(63, 0)]
    assert s.batch.total_tokens == 64


def test_every_decoding_sequence_gets_one_token_at_the_end_of_each_step():
    eng = engine()
    a = request("a", 20, output=3)
    eng.add(a)
    _, first = step(eng, 0.5)
    assert first.first_tokens == [a]
    _, out = step(eng, 0.75)
    assert out.chat_gaps == [0.25]
    _, out = step(eng, 1.25)
    assert a.token_times == [0.5, 0.75, 1.25]
    assert out.finished == [a]
    assert eng.running == [] and eng.kv.used_blocks == 0


def test_without_chunked_prefill_a_whole_prompt_runs_in_one_step():
    eng = engine(enable_chunked_prefill=False, max_num_batched_tokens=2048, max_model_len=90_000)
    eng.add(request("doc", 80_000))
    s, out = step(eng, 1.0)
    assert [c.tokens for c in s.batch.prefills] == [80_000]
    assert len(out.first_tokens) == 1


def test_long_prefill_threshold_and_the_policy_chunk_cap_limit_one_request():
    eng = engine(max_num_batched_tokens=1000, long_prefill_token_threshold=300)
    doc = request("doc", 5000, cls="batch")
    eng.add(doc)
    s, _ = step(eng, 1.0)
    assert [c.tokens for c in s.batch.prefills] == [300]
    doc.chunk_cap = 128
    s, _ = step(eng, 2.0)
    assert [c.tokens for c in s.batch.prefills] == [128]


def test_priority_policy_admits_waiting_chat_before_earlier_batch():
    eng = engine(max_num_batched_tokens=100)
    eng.add(request("doc", 100, cls="batch", t=0.0))
    eng.add(request("chat", 100, t=5.0))
    s, _ = step(eng, 1.0)
    assert [r.request_id for r, _ in s.prefills] == ["chat"]


def test_fcfs_policy_admits_in_arrival_order():
    eng = engine(max_num_batched_tokens=100, scheduling_policy="fcfs")
    eng.add(request("doc", 100, cls="batch", t=0.0))
    eng.add(request("chat", 100, t=5.0))
    s, _ = step(eng, 1.0)
    assert [r.request_id for r, _ in s.prefills] == ["doc"]


def test_max_num_seqs_bounds_the_running_set():
    eng = engine(max_num_seqs=2)
    for i in range(3):
        eng.add(request(f"r{i}", 10, output=5))
    step(eng, 1.0)
    assert len(eng.running) == 2 and eng.num_waiting == 1


def test_kv_exhaustion_preempts_the_lowest_priority_latest_request_which_recomputes():
    # 8 blocks of 16 tokens; batch holds 3 and 4, chat needs more as it decodes
    eng = engine(kv_capacity_tokens=128, max_num_batched_tokens=512, enable_prefix_caching=False)
    early = request("early", 40, output=100, cls="batch", t=0.0)
    late = request("late", 60, output=100, cls="batch", t=1.0)
    for r in (early, late):
        eng.add(r)
    step(eng, 1.0)
    chat = request("chat", 16, output=100, t=2.0)
    eng.add(chat)
    t = 2.0
    while eng.preemptions == 0:
        t += 1.0
        step(eng, t)
    assert late.num_computed == 0 and late in eng.waiting()
    assert early in eng.running and chat in eng.running
    assert len(late.token_times) > 0  # its streamed tokens stay streamed; it recomputes the rest


def test_a_step_that_preempts_admits_nothing_new():
    eng = engine(kv_capacity_tokens=64, max_num_batched_tokens=512, enable_prefix_caching=False)
    a = request("a", 32, output=100, cls="batch", t=0.0)
    b = request("b", 32, output=100, cls="batch", t=1.0)
    eng.add(a)
    eng.add(b)
    step(eng, 1.0)  # both hold 2 blocks: memory is full
    eng.add(request("chat", 5, t=2.0))
    s, _ = step(eng, 2.0)  # a's second token needs a third block: b is preempted
    assert eng.preemptions == 1
    assert [r.request_id for r in s.decodes] == ["a"] and s.prefills == []


def test_prefix_hits_skip_prefill_and_are_recorded_once():
    eng = engine(max_num_batched_tokens=4096)
    shared = (Segment("system", 1000),)
    first = Request("a", "chat", "chat", 0, 0.0, shared + (Segment("q1", 50),), 2, "o1")
    eng.add(first)
    step(eng, 1.0)
    second = Request("b", "chat", "chat", 0, 1.0, shared + (Segment("q2", 50),), 2, "o2")
    eng.add(second)
    s, _ = step(eng, 2.0)
    chunk = next(c for c in s.batch.prefills)
    assert second.cached_tokens == 992  # 62 full blocks of the system prompt
    assert (chunk.tokens, chunk.prefix_tokens) == (1050 - 992, 992)


def test_abort_removes_requests_from_queue_step_and_memory():
    eng = engine(max_num_batched_tokens=100)
    a, b = request("a", 50, output=10), request("b", 500, cls="batch")
    eng.add(a)
    eng.add(b)
    s = eng.schedule(0.0)
    eng.abort([b], s)
    assert [r for r, _ in s.prefills] == [a]
    assert b not in eng.running and b not in eng.waiting()
    eng.complete(s, 1.0)
    assert eng.kv.used_blocks == eng.kv.blocks_for(a.num_computed + 1)


def test_chats_cache_working_set_is_what_finished_chats_left_until_a_chat_hits_it():
    """The simulated plug-in counts what the real one does (scheduler/chat_cache.py)."""
    eng = engine(max_num_batched_tokens=4096)
    history = (Segment("system", 480), Segment("turn 1", 320))
    assert eng.chat_cache_tokens(0.0) is None, "no horizon from a controller: nothing counted"
    eng.chat_cache_horizon_s = 60.0
    first = Request("a", "chat", "chat", 0, 0.0, history, 2, "o1")
    eng.add(first)
    step(eng, 1.0)
    step(eng, 2.0)  # its second token: done, its 50 full blocks left in the cache
    assert eng.chat_cache_tokens(2.0) == 800
    doc = request("doc", 640, output=1, cls="batch")
    eng.add(doc)
    step(eng, 3.0)
    assert eng.chat_cache_tokens(3.0) == 800, "a finished document is not chat's"
    turn = Request("b", "chat", "chat", 0, 30.0, history + (Segment("turn 2", 40),), 2, "o2")
    eng.add(turn)
    step(eng, 31.0)
    assert eng.chat_cache_tokens(31.0) == 0, "the next turn holds the whole history again"
    step(eng, 32.0)
    assert eng.chat_cache_tokens(32.0) == 832
    assert eng.chat_cache_tokens(92.5) == 0, "left more than the horizon ago"
