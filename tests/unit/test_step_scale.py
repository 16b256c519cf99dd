"""The plug-in's scale of its model: the tail of its own error over the steps it sized."""

import random

import pytest

from scheduler.step_scale import SCALE_BOUNDS, SIZED_MIN, SIZED_STEPS, StepTimeScale


def test_before_any_step_the_model_is_taken_as_it_is() -> None:
    assert StepTimeScale().value == 1.0


def test_until_enough_batch_steps_the_scale_is_the_mean_over_every_step() -> None:
    scale = StepTimeScale()
    for _ in range(SIZED_MIN - 1):
        scale.observe(0.030, 0.020, batch_chunk=False)  # chat's own steps: 1.5x the model
        scale.observe(0.013, 0.010, batch_chunk=True)
    assert 1.35 < scale.value < 1.45  # 0.043 / 0.030, time-weighted


def test_with_enough_batch_steps_all_but_one_in_a_hundred_fit_the_scaled_model() -> None:
    rng = random.Random(7)
    scale = StepTimeScale()
    ratios = [rng.lognormvariate(0.2, 0.08) for _ in range(SIZED_STEPS)]
    for r in ratios:
        scale.observe(0.050 * r, 0.050, batch_chunk=True)
        scale.observe(0.020 * 3.0, 0.020, batch_chunk=False)  # chat-only steps do not count
    over = sum(r > scale.value for r in ratios)
    assert over <= 0.01 * SIZED_STEPS
    assert scale.value < max(ratios)  # a quantile, not the worst step ever seen


def test_the_tail_follows_the_recent_steps_not_the_first_ones() -> None:
    scale = StepTimeScale()
    for _ in range(SIZED_STEPS):
        scale.observe(0.060, 0.040, batch_chunk=True)  # a busy spell: 1.5x
    assert scale.value == pytest.approx(1.5)
    for _ in range(SIZED_STEPS):
        scale.observe(0.044, 0.040, batch_chunk=True)
    assert scale.value == pytest.approx(1.1)


def test_the_scale_stays_within_its_bounds() -> None:
    fast, slow = StepTimeScale(), StepTimeScale()
    for _ in range(SIZED_STEPS):
        fast.observe(0.010, 0.040, batch_chunk=True)
        slow.observe(0.400, 0.040, batch_chunk=True)
    assert fast.value == SCALE_BOUNDS[0] and slow.value == SCALE_BOUNDS[1]


def test_a_step_without_a_modelled_time_changes_nothing() -> None:
    scale = StepTimeScale()
    scale.observe(0.050, 0.0, batch_chunk=True)
    scale.observe(float("nan"), 0.01, batch_chunk=True)
    assert scale.value == 1.0 and not scale.sized
