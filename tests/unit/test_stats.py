"""The statistics of validation verdicts (gpunuma.verify.stats) against known values and synthetic runs."""

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible.module_utils.gpunuma.verify import stats
from conftest import examples

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("x, y, u, p", [
    # Exact two-sided p-values of the rank-sum test (Hollander, Wolfe & Chicken table A.6; scipy's exact mode).
    ([1, 2, 3, 4], [5, 6, 7, 8], 0.0, 2 / 70),
    ([1, 2, 3], [4, 5, 6], 0.0, 0.1),
    ([1, 3, 5, 7, 9], [2, 4, 6, 8, 10], 10.0, 0.690476),
    ([5, 6, 7, 8], [1, 2, 3, 4], 16.0, 2 / 70),
    ([1.0, 2.0, 10.0], [3.0, 4.0, 5.0, 6.0], 4.0, 0.628571),
])
def test_exact_mann_whitney(x, y, u, p):
    got_u, got_p = stats.mann_whitney(x, y)
    assert got_u == u and math.isclose(got_p, p, rel_tol=1e-5)


def test_smallest_reachable_p_sets_the_rounds_needed():
    assert stats.min_p_value(3, 3) == 0.1
    assert stats.min_p_value(4, 4) < 0.05 <= stats.min_p_value(3, 3)


def test_too_few_rounds_are_never_significant():
    result = stats.compare([60.0, 61.0, 62.0], [40.0, 41.0, 42.0], True, 0.05, 0.0)
    assert result["testable"] is False and result["outcome"] == "same"


@given(st.lists(st.floats(1, 100), min_size=1, max_size=8), st.lists(st.floats(1, 100), min_size=1, max_size=8))
@settings(max_examples=examples(100), deadline=None)
def test_u_and_p_are_consistent(x, y):
    u_xy, p_xy = stats.mann_whitney(x, y)
    u_yx, p_yx = stats.mann_whitney(y, x)
    assert u_xy + u_yx == pytest.approx(len(x) * len(y))
    assert 0 < p_xy <= 1 and p_xy == pytest.approx(p_yx)


def _noisy(rng, center, relative, n):
    return [center * math.exp(rng.gauss(0, relative)) for _ in range(n)]


def test_false_alarm_rate_is_within_alpha():
    """Two placements with the same distribution: a significant difference in at most alpha of the runs."""
    rng = random.Random(20261202)
    alpha, runs = 0.05, 2000
    alarms = sum(stats.compare(_noisy(rng, 55.0, 0.02, 5), _noisy(rng, 55.0, 0.02, 5), True, alpha, 0.0)["outcome"] != "same"
                 for _ in range(runs))
    assert alarms / runs <= alpha


def test_a_real_15_percent_difference_is_found():
    """Local 15 % faster than unbound, 2 % round-to-round noise, 5 rounds each, the default tolerances."""
    rng = random.Random(7)
    runs = 500
    found = sum(stats.compare(_noisy(rng, 55.0 * 1.15, 0.02, 5), _noisy(rng, 55.0, 0.02, 5), True, 0.05, 0.03)["outcome"]
                == "better" for _ in range(runs))
    assert found / runs >= 0.95


def test_spread():
    assert stats.spread([50.0, 55.0, 60.0]) == pytest.approx(10 / 55)
    with pytest.raises(stats.StatsError, match="is not a finite number"):
        stats.spread([1.0, float("nan")])
