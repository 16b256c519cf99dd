"""The prefill budget the simulated dispatcher checks per request."""

from __future__ import annotations

from scheduler.admission import within_prefill_budget


def test_the_prefill_budget_holds_a_prompt_until_the_prefill_ahead_drains():
    assert within_prefill_budget(1000, 1000, 2048)
    assert not within_prefill_budget(1500, 1000, 2048)  # chat would wait too long
    assert within_prefill_budget(0, 5000, 2048)  # alone, any prompt may start


def test_within_prefill_budget_without_a_budget_admits_everything():
    assert within_prefill_budget(10**6, 10**6, None)
    assert not within_prefill_budget(1, 10, 10)
