"""The plug-in's scale of its model: the tail of its own error over the recent steps it sized."""

import random

import pytest

from scheduler.step_scale import SAMPLE_LIFE_S, SCALE_BOUNDS, SIZED_STEPS, StepTimeScale

STEP_S = 0.02
"""Batch steps 20 ms apart: `SIZED_STEPS` of them well within `SAMPLE_LIFE_S`."""


def test_before_any_step_the_model_is_taken_as_it_is() -> None:
    assert StepTimeScale().value == 1.0
    assert StepTimeScale().at(1000.0) == 1.0


def test_under_a_hundred_steps_the_scale_is_their_slowest() -> None:
    scale = StepTimeScale()
    for i, r in enumerate([1.2, 1.5, 1.1, 1.3]):
        scale.observe(i * STEP_S, 0.010 * r, 0.010)
    assert scale.value == pytest.approx(1.5)


def test_with_enough_batch_steps_all_but_one_in_a_hundred_fit_the_scaled_model() -> None:
    rng = random.Random(7)
    scale = StepTimeScale()
    ratios = [rng.lognormvariate(0.2, 0.08) for _ in range(SIZED_STEPS)]
    for i, r in enumerate(ratios):
        scale.observe(i * STEP_S, 0.050 * r, 0.050)
    over = sum(r > scale.value for r in ratios)
    assert over <= 0.01 * SIZED_STEPS
    assert scale.value < max(ratios)  # a quantile, not the worst step ever seen


def test_the_tail_follows_the_recent_steps_not_the_first_ones() -> None:
    scale = StepTimeScale()
    for i in range(SIZED_STEPS):
        scale.observe(i * STEP_S, 0.060, 0.040)  # a busy spell: 1.5x
    assert scale.value == pytest.approx(1.5)
    for i in range(SIZED_STEPS, 2 * SIZED_STEPS):
        scale.observe(i * STEP_S, 0.044, 0.040)
    assert scale.value == pytest.approx(1.1)


def test_a_scale_a_passing_spell_set_high_is_forgotten_so_batch_steps_run_again() -> None:
    """A burst of slow steps sets the scale high enough to forbid every batch chunk; with no
    batch step to learn from, only time can take it down: once its evidence has expired the
    model is taken as it is, and the next step's own error becomes the scale."""
    scale = StepTimeScale()
    for i in range(40):
        scale.observe(i * STEP_S, 0.023 if i % 10 == 9 else 0.013, 0.010)  # 1 in 10 at 2.3x
    assert scale.value == pytest.approx(2.3)
    last = 39 * STEP_S
    assert scale.at(last + SAMPLE_LIFE_S / 2) == pytest.approx(2.3)  # still evidence
    assert scale.at(last + SAMPLE_LIFE_S + 0.1) == 1.0  # none left: the model as it is
    scale.observe(last + SAMPLE_LIFE_S + 0.2, 0.0128, 0.010)  # the step it allowed
    assert scale.value == pytest.approx(1.28)


def test_only_the_expired_part_of_the_evidence_is_dropped() -> None:
    scale = StepTimeScale()
    scale.observe(0.0, 0.020, 0.010)  # 2x, old
    scale.observe(SAMPLE_LIFE_S / 2, 0.012, 0.010)  # 1.2x, recent
    assert scale.value == pytest.approx(2.0)
    assert scale.at(SAMPLE_LIFE_S + 0.1) == pytest.approx(1.2)


def test_the_scale_stays_within_its_bounds() -> None:
    fast, slow = StepTimeScale(), StepTimeScale()
    for i in range(SIZED_STEPS):
        fast.observe(i * STEP_S, 0.010, 0.040)
        slow.observe(i * STEP_S, 0.400, 0.040)
    assert fast.value == SCALE_BOUNDS[0] and slow.value == SCALE_BOUNDS[1]


def test_a_step_without_a_modelled_time_changes_nothing() -> None:
    scale = StepTimeScale()
    scale.observe(0.0, 0.050, 0.0)
    scale.observe(0.0, float("nan"), 0.01)
    assert scale.value == 1.0 and not scale.sized
