"""Impossible simulator settings fail before any virtual time passes, naming the field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from simulator.config import BatchWorkload, ChatWorkload, ControlParams, EngineParams, SimConfig


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"engine": {"max_num_batched_tokens": 0}}, ("engine", "max_num_batched_tokens")),
        ({"engine": {"max_num_seqs": 0}}, ("engine", "max_num_seqs")),
        ({"chat": {"rate": -1.0}}, ("chat", "rate")),
        ({"chat": {"think_time_s": -2.0}}, ("chat", "think_time_s")),
        ({"batch": {"docs": -3}}, ("batch", "docs")),
        ({"control": {"interval_s": 0.0}}, ("control", "interval_s")),
        ({"duration_s": 0.0}, ("duration_s",)),
        ({"batch": {"mode": "halves"}}, ("batch", "mode")),
        ({"chat": {"rates": 2.0}}, ("chat", "rates")),
    ],
)
def test_impossible_settings_name_their_field(settings, field):
    with pytest.raises(ValidationError) as info:
        SimConfig.model_validate(settings)
    assert [tuple(e["loc"]) for e in info.value.errors()] == [field]


def test_a_rate_and_a_trace_together_are_refused():
    with pytest.raises(ValidationError, match="not both"):
        SimConfig.model_validate({"chat": {"rate": 1.0, "trace": "t.csv"}})


@pytest.mark.parametrize("spread", [(1.0,), (0.0, 1.0), (1.2, 0.9), (0.9, 1.0, 0.95)])
def test_a_step_time_spread_is_rising_positive_quantiles(spread):
    with pytest.raises(ValidationError, match="step_time_spread"):
        EngineParams(step_time_spread=spread)
    assert EngineParams(step_time_spread=(0.8, 1.0, 1.4)).step_time_spread == (0.8, 1.0, 1.4)


def test_kv_must_hold_at_least_one_block():
    with pytest.raises(ValidationError, match="kv_capacity_tokens"):
        EngineParams(kv_capacity_tokens=8, block_size=16)


def test_every_setting_has_a_default_and_a_description():
    for model in (EngineParams, ChatWorkload, BatchWorkload, ControlParams, SimConfig):
        for name, info in model.model_fields.items():
            assert info.description, f"{model.__name__}.{name} has no description"
    SimConfig()  # all defaults together make a valid run
