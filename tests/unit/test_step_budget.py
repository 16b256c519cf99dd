"""The plug-in's per-step sizing: chat never cut, position-aware, within room and block size."""

from __future__ import annotations

import pytest

from scheduler.latency_model import LatencyModel
from scheduler.step import PrefillChunk, StepBatch
from scheduler.step_budget import (
    BatchPrefill,
    BatchStepTarget,
    StepBudget,
    StepCredit,
    batch_room,
    is_batch,
    size_batch_prefills,
)

# 5 ms floor, 0.05 ms per token, attention and prefix re-reads that grow with position.
MODEL = LatencyModel(
    s_per_token=5e-5,
    s_weight_read=0.005,
    s_per_attention_unit=2e-10,
    s_per_chunk_prefix_token=2e-7,
    s_per_decode_seq=1e-4,
)
CHAT = StepBatch((PrefillChunk(128, 0),), decode_seqs=8, decode_context_tokens=8000)


def grant(prefix: int, remaining: int = 100_000, target_ms: float = 40, room: int = 4096, **kw):
    return size_batch_prefills(
        MODEL, target_ms / 1000, room, CHAT, [BatchPrefill(prefix, remaining)], **kw
    )[0]


def test_the_same_target_gives_a_smaller_chunk_deep_in_a_long_prompt():
    assert 0 < grant(78_000) < grant(0)


def test_zero_when_the_target_is_below_chats_own_step():
    chat_alone = MODEL.step_seconds(CHAT) * 1000
    assert grant(0, target_ms=chat_alone * 0.99) == 0
    assert grant(0, target_ms=chat_alone * 1.5) > 0


def test_grants_are_block_multiples_within_room_and_never_past_the_prompt():
    assert grant(0) % 16 == 0
    assert grant(0, room=100) == 96
    assert grant(0, room=0) == 0
    assert grant(0, remaining=37) == 37, "the chunk that ends a prefill may be any size"
    assert grant(0, remaining=37, room=20) == 16


def test_the_step_with_every_grant_stays_within_the_target():
    budget = StepBudget(MODEL, 0.040, 4096, CHAT)
    grants = [budget.grant(BatchPrefill(p, 50_000)) for p in (0, 20_000, 60_000)]
    assert grants[0] > 0
    assert budget.seconds() <= 0.040
    assert sum(grants) == budget.granted_tokens
    assert budget.batch().prefills[0] == CHAT.prefills[0], "chat's chunk is kept whole"


def test_a_chunk_below_the_minimum_waits_unless_it_ends_the_prefill():
    tight = MODEL.step_seconds(CHAT) * 1000 + 1.5  # room for ~30 tokens
    small = grant(0, target_ms=tight)
    assert 0 < small < 64
    assert grant(0, target_ms=tight, min_chunk_tokens=64) == 0
    assert grant(0, remaining=small, target_ms=tight, min_chunk_tokens=64) == small


def test_the_engines_own_cap_limits_a_grant():
    budget = StepBudget(MODEL, 1.0, 4096, StepBatch())
    assert budget.grant(BatchPrefill(0, 10_000), limit=200) == 192
    assert budget.grant(BatchPrefill(0, 150), limit=150) == 150


def test_the_budget_says_whether_its_target_held_a_grant_back():
    """Only a step the target shortened ran at the target; room, caps and block rounding do not
    count, and neither does a step with no batch prefill in it."""

    def bound(target_s: float, prefill: BatchPrefill, room: int = 4096, limit=None) -> bool:
        budget = StepBudget(MODEL, target_s, room, CHAT)
        budget.grant(prefill, limit=limit)
        return budget.target_bound

    deep = BatchPrefill(78_000, 2_000)
    assert bound(0.040, deep)
    assert bound(MODEL.step_seconds(CHAT) * 0.99, deep), "a grant of 0 under the target is bound"
    assert not bound(10.0, deep), "the whole rest fits"
    assert not bound(10.0, BatchPrefill(0, 10_000), room=100), "room binds, whole blocks"
    assert not bound(10.0, BatchPrefill(0, 10_000), limit=200), "the engine's cap binds"
    assert not StepBudget(MODEL, 0.001, 4096, CHAT).target_bound


@pytest.mark.parametrize("priority,batch", [(0, False), (1, True), (10, True)])
def test_priority_above_chat_is_batch(priority, batch):
    assert is_batch(priority) is batch


def test_with_no_chat_in_the_engine_a_step_runs_to_the_idle_target():
    target = BatchStepTarget(0.010, MODEL, idle_target_s=0.200)
    assert target.step_target_s(chat_in_engine=True) == 0.010
    assert target.step_target_s(chat_in_engine=False) == 0.200
    assert BatchStepTarget(0.010, MODEL).step_target_s(chat_in_engine=False) == 0.010
    assert BatchStepTarget(0.050, MODEL, idle_target_s=0.020).step_target_s(False) == 0.050
    alone = StepBatch((), 0, 0)
    deep = [BatchPrefill(78_000, 2_000)]
    tight = size_batch_prefills(MODEL, target.step_target_s(True), 512, alone, deep)[0]
    idle = size_batch_prefills(MODEL, target.step_target_s(False), 512, alone, deep)[0]
    assert tight == 0 < idle, "deep in a prompt only the idle target buys a chunk"


def test_a_step_that_carries_a_chat_prompt_leaves_batch_no_room():
    """A chat prompt's own step is chat's: its first token waits for at most one step the target
    bounds, as its later tokens do."""
    decodes = StepBatch((), decode_seqs=8, decode_context_tokens=8000)
    assert batch_room(512, 8, decodes) == 504
    assert batch_room(512, 136, CHAT) == 0
    assert batch_room(512, 8, decodes, paused=True) == 0
    assert batch_room(512, 600, decodes) == 0


DECODES = StepBatch((), decode_seqs=8, decode_context_tokens=8000)


def _credit_steps(target: BatchStepTarget, steps: int, prefix: int = 78_000):
    """Steps of chat's decodes beside one document deep in its prefill, each sized as the plug-in
    sizes it under `target` with a credit; the grants and the steps' predicted seconds."""
    credit, grants, seconds = StepCredit(), [], []
    for _ in range(steps):
        budget = StepBudget(MODEL, credit.step_target_s(target, True), 4096, DECODES)
        grants.append(budget.grant(BatchPrefill(prefix, 2_000)))
        seconds.append(budget.seconds())
        credit.ran(seconds[-1])
        assert 0 <= credit.seconds <= target.target_s - target.mean_target_s
    return grants, seconds


def test_a_mean_target_under_one_block_moves_a_deep_document_on_what_steps_leave():
    """Deep in a prompt one block costs more than the mean leaves beside chat's decodes: held to
    the mean at every step the document stalls; with the credit it moves in a longer step, no
    step past the target and the steps' mean within the mean plus one step's overrun."""
    decodes_s = MODEL.step_seconds(DECODES)
    block_s = MODEL.step_seconds(StepBatch((PrefillChunk(16, 78_000),), 8, 8000)) - decodes_s
    mean = decodes_s + block_s / 3
    target = BatchStepTarget(decodes_s + 2 * block_s, MODEL, mean_target_s=mean)
    assert grant(78_000, target_ms=1000 * mean, room=4096) == 0, "held to the mean: a stall"
    grants, seconds = _credit_steps(target, 300)
    assert sum(grants) > 0 and max(seconds) <= target.target_s
    assert sum(seconds) / len(seconds) <= mean + (target.target_s - mean) / len(seconds)
    assert sum(1 for g in grants if g) >= len(grants) // 4, "a block every few steps"


def test_without_a_mean_or_without_chat_the_credit_changes_nothing():
    plain = BatchStepTarget(0.040, MODEL, idle_target_s=0.080)
    credit = StepCredit()
    assert credit.step_target_s(plain, True) == 0.040 and not credit.settling
    credit.ran(0.001)
    assert credit.seconds == 0
    meant = BatchStepTarget(0.040, MODEL, idle_target_s=0.080, mean_target_s=0.020)
    assert credit.step_target_s(meant, False) == 0.080, "it runs to the idle target"
    credit.ran(0.001)
    assert credit.seconds == 0, "a step with no chat in the engine earns nothing"
    for _ in range(2):
        credit.step_target_s(meant, True)
        credit.ran(0.001)
    assert credit.seconds == pytest.approx(0.020), "earned up to target - mean, no more"
    assert credit.step_target_s(meant, True) == pytest.approx(0.040)
    credit.ran(0.100)
    assert credit.seconds == 0, "a step chat alone made long is not batch's debt"
