"""The slack mark from the spread of chat's window pressure at one target."""

from __future__ import annotations

import math
import random

import pytest

from scheduler.pressure_spread import MISS_T, SPREAD_DOF, PressureSpread


def test_before_any_pair_the_slack_mark_is_the_configured_one():
    assert PressureSpread.from_slack(0.8).slack_mark() == pytest.approx(0.8)


@pytest.mark.parametrize("slack", [0.0, 1.0, -0.2, 1.5])
def test_a_slack_mark_outside_zero_to_one_is_refused(slack):
    with pytest.raises(ValueError, match=r"slack mark must be in \(0, 1\)"):
        PressureSpread.from_slack(slack)


def test_steady_windows_raise_the_mark_and_swinging_ones_lower_it():
    steady, swinging = PressureSpread.from_slack(0.8), PressureSpread.from_slack(0.8)
    for i in range(12):
        steady.observe(10.0 * (i + 1), 10.0 * i, 0.7)
        swinging.observe(10.0 * (i + 1), 10.0 * i, 0.5 if i % 2 else 0.9)
    assert 0.8 < steady.slack_mark() < 1
    assert swinging.slack_mark() < 0.8


@pytest.mark.parametrize("sigma", [0.05, 0.1, 0.2])
def test_a_window_at_the_mark_breaks_the_slo_one_time_in_a_hundred(sigma):
    """Windows at one target whose log pressure is normal about its level: at each mark the
    spread sets, the next window (a growth that landed on the mark) reads over 1 about 1% of the
    time. The mark moves with the estimate, and it is the moments it sits high, on a narrow
    estimate, that breaks come from: with the normal quantile in place of t, 2.9%."""
    rng = random.Random(7)
    spread, chances = PressureSpread.from_slack(0.8), []
    for i in range(8000):
        spread.observe(10.0 * (i + 1), 10.0 * i, math.exp(rng.gauss(math.log(0.5), sigma)))
        if i >= 100:
            above = -math.log(spread.slack_mark()) / sigma  # standard deviations up to 1
            chances.append(0.5 * math.erfc(above / math.sqrt(2)))
    assert 0.008 < sum(chances) / len(chances) < 0.013


def test_the_margin_is_students_t_at_the_samples_the_running_variance_is_worth():
    """The 0.99 quantile of t with 7 degrees of freedom, by integrating its density."""
    nu = SPREAD_DOF
    assert nu == pytest.approx(7)

    def density(t: float) -> float:
        c = math.gamma((nu + 1) / 2) / (math.sqrt(nu * math.pi) * math.gamma(nu / 2))
        return c * (1 + t * t / nu) ** (-(nu + 1) / 2)

    steps, top = 200_000, 200.0
    width = (top - MISS_T) / steps
    tail = sum(density(MISS_T + (k + 0.5) * width) for k in range(steps)) * width
    assert tail == pytest.approx(0.01, rel=0.01)


def test_overlapping_windows_and_windows_across_a_change_do_not_pair():
    spread = PressureSpread.from_slack(0.8)
    spread.observe(60.0, 0.0, 0.9)
    spread.observe(63.0, 3.0, 0.3)  # overlaps the first: skipped
    spread.target_changed()
    spread.observe(130.0, 70.0, 0.3)  # first at the new target: nothing to pair with
    assert spread.slack_mark() == pytest.approx(0.8)
    spread.observe(190.0, 130.0, 0.3)
    assert spread.slack_mark() > 0.8


def test_a_window_without_chat_says_nothing():
    spread = PressureSpread.from_slack(0.8)
    spread.observe(60.0, 0.0, 0.5)
    for nothing in (0.0, float("nan"), float("inf")):
        spread.observe(130.0, 70.0, nothing)
    assert spread.last == (60.0, 0.5) and spread.slack_mark() == pytest.approx(0.8)


def test_a_growth_that_lands_where_it_aimed_raises_the_mark_and_one_that_overshoots_lowers_it():
    landed, overshot = PressureSpread.from_slack(0.8), PressureSpread.from_slack(0.8)
    for spread, read in ((landed, 0.8), (overshot, 1.1)):
        spread.target_changed(aimed=0.8)
        spread.judge_growth(read)
    assert landed.slack_mark() > 0.8 > overshot.slack_mark()


def test_only_a_growth_is_judged_and_only_once():
    spread = PressureSpread.from_slack(0.8)
    spread.target_changed()  # a cut aims at no level
    spread.judge_growth(1.5)
    assert spread.slack_mark() == pytest.approx(0.8)
    spread.target_changed(aimed=0.8)
    spread.judge_growth(0.0)  # no chat in the window: the growth is still to be judged
    spread.judge_growth(0.8)
    judged = spread.slack_mark()
    spread.judge_growth(2.0)  # the next window is not the first to show the growth
    assert spread.slack_mark() == judged > 0.8


def test_one_window_far_out_widens_the_spread_a_bounded_step():
    """A host spell reads far past what the mark allows for: it counts as a window at the
    mark's own quantile, tripling the variance, rather than setting the margin by itself."""
    prior = PressureSpread.from_slack(0.8)
    spell = PressureSpread.from_slack(0.8)
    spell.target_changed(aimed=0.8)
    spell.judge_growth(1.5)
    assert spell.variance == pytest.approx(3 * prior.variance, rel=0.01)
    assert 0.6 < spell.slack_mark() < 0.8


def test_a_noise_that_really_widens_is_followed_within_a_few_windows():
    """Windows alternating 0.4 and 0.6 have the spread whose mark is 0.42; from a prior of 0.8,
    each clipped sample still moves toward it, and five pairs bring the mark within 0.1 of it."""
    spread = PressureSpread.from_slack(0.8)
    for i in range(6):
        spread.observe(10.0 * (i + 1), 10.0 * i, 0.4 if i % 2 else 0.6)
    wide = math.exp(-MISS_T * abs(math.log(1.5)) / math.sqrt(2))
    assert wide < spread.slack_mark() < wide + 0.1
