"""Kaplan–Meier, log-log bands, median, RMST and the published survival-at-t, against hand arithmetic."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ncpbench.survival import Z95, alive_share, kaplan_meier

# Eight episodes: conflicts (events) at 2, 3, 3, 5, 8; censored at 3 (tied with two events), 5 and 7.
TIMES = [2, 3, 3, 3, 5, 5, 7, 8]
EVENTS = [True, True, True, False, True, False, False, True]


def test_product_limit_steps_with_ties_and_censoring_at_an_event_time() -> None:
    km = kaplan_meier(TIMES, EVENTS)
    assert km.times.tolist() == [2, 3, 5, 7, 8]
    # At t=3 the episode censored at 3 is still at risk (events first): n = 8 - 1 = 7, not 6.
    assert km.at_risk.tolist() == [8, 7, 4, 2, 1]
    assert km.events.tolist() == [1, 2, 1, 0, 1]
    assert km.censored.tolist() == [0, 1, 1, 1, 0]
    s2 = 1 - 1 / 8               # 0.875
    s3 = s2 * (1 - 2 / 7)        # 0.625 (censoring first would give 0.875 * 4/6 = 0.5833)
    s5 = s3 * (1 - 1 / 4)        # 0.46875
    s7 = s5 * (1 - 0 / 2)        # 0.46875
    s8 = s7 * (1 - 1 / 1)        # 0
    assert km.survival.tolist() == pytest.approx([s2, s3, s5, s7, s8])
    assert (s2, s3, s5) == (0.875, 0.625, 0.46875)


def test_curve_is_a_right_continuous_step_function() -> None:
    km = kaplan_meier(TIMES, EVENTS)
    assert km.at(0) == 1.0 and km.at(1.99) == 1.0
    assert km.at(2) == 0.875 and km.at(2.5) == 0.875
    assert km.at(3) == 0.625 and km.at(6) == 0.46875 and km.at(100) == 0.0


def test_log_log_greenwood_band_by_hand() -> None:
    km = kaplan_meier(TIMES, EVENTS)
    # Greenwood sum at t=3: d/(n(n-d)) = 1/(8*7) + 2/(7*5) = 0.017857 + 0.057143 = 0.075
    v = 1 / (8 * 7) + 2 / (7 * 5)
    assert v == pytest.approx(0.075)
    se = math.sqrt(v) / abs(math.log(0.625))   # 0.273861 / 0.470004 = 0.582681
    lower = 0.625 ** math.exp(Z95 * se)         # 0.625 ** 3.1332  = 0.2293
    upper = 0.625 ** math.exp(-Z95 * se)        # 0.625 ** 0.31917 = 0.8607
    assert km.band_at(3) == pytest.approx((lower, upper))
    assert km.band_at(3) == pytest.approx((0.2293, 0.8607), abs=1e-4)
    # At t=2: v = 1/56, se = sqrt(1/56) / |ln 0.875|
    se2 = math.sqrt(1 / 56) / abs(math.log(0.875))
    assert km.band_at(2) == pytest.approx((0.875 ** math.exp(Z95 * se2), 0.875 ** math.exp(-Z95 * se2)))


def test_band_is_inside_zero_one_collapses_at_one_and_zero() -> None:
    km = kaplan_meier(TIMES, EVENTS)
    assert np.all(km.lower <= km.survival + 1e-12) and np.all(km.survival <= km.upper + 1e-12)
    assert np.all(km.lower >= 0) and np.all(km.upper <= 1)
    assert km.band_at(1) == (1.0, 1.0), "no event yet: S = 1, band [1, 1]"
    assert km.band_at(8) == (0.0, 0.0), "S = 0: band [0, 0]"
    censored_first = kaplan_meier([1, 4], [False, True])
    assert censored_first.survival.tolist() == [1.0, 0.0] and censored_first.band_at(1) == (1.0, 1.0)


def test_other_confidence_levels_use_the_normal_quantile() -> None:
    wide, narrow = kaplan_meier(TIMES, EVENTS, confidence=0.99), kaplan_meier(TIMES, EVENTS, confidence=0.8)
    v = 1 / (8 * 7) + 2 / (7 * 5)
    se = math.sqrt(v) / abs(math.log(0.625))
    assert wide.band_at(3)[0] == pytest.approx(0.625 ** math.exp(2.5758293035489 * se))
    assert wide.band_at(3)[0] < narrow.band_at(3)[0] < 0.625 < narrow.band_at(3)[1] < wide.band_at(3)[1]


def test_median_is_the_first_time_the_curve_reaches_one_half() -> None:
    assert kaplan_meier(TIMES, EVENTS).median == 5.0          # S(3) = 0.625 > 0.5 >= S(5) = 0.46875
    assert kaplan_meier([1, 2, 3, 4], [True, True, False, False]).median == 2.0   # S(2) = 0.5 exactly
    assert kaplan_meier([1, 10, 10], [True, False, False]).median is None         # S stays at 2/3
    assert kaplan_meier([], []).median is None


def test_restricted_mean_is_the_area_under_the_steps() -> None:
    km = kaplan_meier(TIMES, EVENTS)
    # 1*(2-0) + 0.875*(3-2) + 0.625*(5-3) + 0.46875*(8-5) = 2 + 0.875 + 1.25 + 1.40625
    assert km.rmst(8) == pytest.approx(5.53125)
    assert km.rmst() == pytest.approx(5.53125), "default horizon: the largest observed time"
    assert km.rmst(4) == pytest.approx(2 + 0.875 + 0.625)          # horizon inside a step
    assert km.rmst(10) == pytest.approx(5.53125 + 0.0 * 2)         # S = 0 after 8
    assert km.rmst(1) == 1.0 and km.rmst(0) == 0.0


def test_everything_censored_survives_at_one() -> None:
    km = kaplan_meier([5, 5, 3], [False, False, False])
    assert km.survival.tolist() == [1.0, 1.0] and km.median is None and km.rmst(5) == 5.0


def test_published_survival_at_t_is_the_share_whose_turn_count_reaches_t() -> None:
    times, events = [1, 2, 3, 3, 10], [True, False, True, True, False]
    assert alive_share(times, 0) == 1.0
    assert alive_share(times, 1) == 1.0      # the conflict at turn 1 still counts at 1
    assert alive_share(times, 2) == 4 / 5
    assert alive_share(times, 3) == 3 / 5    # the episode that ended at 2 without a conflict does not reach 3
    assert alive_share(times, 4) == 1 / 5
    assert alive_share(times, 100) == 0.0
    # Kaplan–Meier is another quantity: SUCCESS/SURVIVAL are censored; at 3, n = 3, d = 2
    assert kaplan_meier(times, events).at(3) == pytest.approx(4 / 5 * (1 - 2 / 3))
    assert math.isnan(alive_share([], 3))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=20), min_size=1, max_size=40))
def test_without_censoring_km_is_the_alive_share_and_rmst_the_mean_turns(times: list[int]) -> None:
    events = [True] * len(times)
    km = kaplan_meier(times, events)
    for t in range(0, 22):
        assert km.at(t) == pytest.approx(alive_share(times, t + 1)), "S(t) counts those alive after turn t"
    assert km.rmst(20) == pytest.approx(sum(times) / len(times))
    assert km.rmst(7) == pytest.approx(sum(min(t, 7) for t in times) / len(times))


def test_censor_marks_and_plot_steps() -> None:
    km = kaplan_meier(TIMES, EVENTS)
    ct, cs = km.censor_marks()
    assert ct.tolist() == [3.0, 5.0, 7.0] and cs.tolist() == [0.625, 0.46875, 0.46875]
    x, s, lo, hi = km.steps(until=10)
    assert x.tolist() == [0, 2, 3, 5, 7, 8, 10] and s[0] == 1.0 and s[-1] == 0.0
    assert len(lo) == len(hi) == len(x)


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError):
        kaplan_meier([1, 2], [True])
    with pytest.raises(ValueError):
        kaplan_meier([-1], [True])
