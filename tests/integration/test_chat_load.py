"""Chat load on a real cpu-tiny replica: complete records, planned sizes, prefix-cache reuse."""

from __future__ import annotations

import pytest

from bench.chat_load import ChatLoadSpec, run_chat_load
from bench.chat_results import write_run
from bench.chat_sessions import ChatShape
from serving.engine_config import load_engine_config
from serving.tokenizer import tokenizer_for
from tests.replicas import TINY

pytestmark = pytest.mark.engine

BLOCK_TOKENS = 128  # vLLM's default KV block on CPU; only full blocks are cached
SHAPE = ChatShape(
    system_prompt_tokens=5 * BLOCK_TOKENS,
    retrieved_chunks=2,
    chunk_tokens=32,
    documents=4,
    chunks_per_document=4,
    question_tokens_min=8,
    question_tokens_max=16,
    output_tokens_median=8,
    output_tokens_sigma=0.3,
    max_tokens=16,
    turns=3,
    fixed_turns=True,
    think_time_s=0.3,
)


async def test_a_short_run_records_every_request_and_reuses_the_shared_prefix(
    tiny_replica, tmp_path
) -> None:
    config = load_engine_config(TINY)
    spec = ChatLoadSpec(
        shape=SHAPE,
        rate=3.0,
        duration_s=3.0,
        seed=0,
        grace_s=30.0,
        context_limit=int(config.flag("max-model-len")),
    )
    replicas = [(tiny_replica.name, tiny_replica.base_url)]
    result = await run_chat_load(
        replicas, tiny_replica.served_model, tokenizer_for(config), spec, "it-chat"
    )
    req = result.summary["requests"]
    assert req["sent"] >= 4 and req["ok"] == req["sent"] == len(result.records)
    for turn in result.turns:
        r = turn.record
        assert r.output_tokens == turn.plan.output_tokens
        # One gap per streamed chunk: a lagging API server merges several steps into one chunk
        # (on a starved host a whole short answer arrives as one).
        assert len(r.gaps) <= r.output_tokens - 1
        assert r.ttft_s is not None and 0 < r.ttft_s <= r.e2e_s
        # Sizes are planned with the served tokenizer and the model's template: exact.
        assert abs(r.prompt_tokens - turn.planned_prompt_tokens) <= 2
    assert sum(len(t.record.gaps) for t in result.turns) > 0  # the client records gaps
    later = [t for t in result.turns if t.plan.turn > 0]
    assert later, "some session came back within the run"
    for turn in later:
        assert turn.history_turns == turn.plan.turn
        assert turn.record.cached_tokens >= 4 * BLOCK_TOKENS  # the system prompt at least
    assert result.summary["prefix_cache_hit_share"] > 0.5
    write_run(tmp_path / "it-chat", result, engine_config=config.name)
    from warehouse.run_files import read_table

    rows = read_table(tmp_path / "it-chat", "requests", run_id="it-chat")
    assert rows.num_rows == req["sent"]
    assert sum(rows.column("cached_tokens").to_pylist()) > 0
