"""The admission rules the Gate applies per request: batch prefill in flight under the chunk cap
and the prefill budget."""

from __future__ import annotations

from scheduler.admission import prefill_fits, within_prefill_budget


def test_one_prompt_may_always_start_when_nothing_is_prefilling():
    assert prefill_fits(0, 5000, 400, 512)
    assert prefill_fits(0, 5000, 400, None)


def test_below_one_engine_step_the_chunk_caps_the_prefill_in_flight():
    assert prefill_fits(200, 200, 400, 512)  # the engine may pack both into one 400-token step
    assert not prefill_fits(200, 300, 400, 512)  # 500 tokens would make a step over the budget
    assert not prefill_fits(200, 300, 400, None)  # whole prompts: a step holds both


def test_a_chunk_of_whole_engine_steps_is_not_held_back():
    assert prefill_fits(3000, 2048, 2048, 512)  # steps stay 512 tokens, only more of them
    assert not prefill_fits(3000, 2048, 2048, 4096)


def test_the_prefill_budget_holds_a_prompt_until_the_prefill_ahead_drains():
    assert prefill_fits(1000, 1000, 2048, 512, budget_tokens=2048)
    assert not prefill_fits(1500, 1000, 2048, 512, budget_tokens=2048)  # chat would wait too long
    assert prefill_fits(0, 5000, 2048, 512, budget_tokens=2048)  # alone, any prompt may start


def test_within_prefill_budget_without_a_budget_admits_everything():
    assert within_prefill_budget(10**6, 10**6, None)
    assert not within_prefill_budget(1, 10, 10)
