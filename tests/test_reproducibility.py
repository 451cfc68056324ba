"""The fragile mark: the 0/1 band whose unmarked share tracks the rerun agreement."""
import numpy as np
import pytest
from scipy import stats as sps

from jaxrl_scale.scaling import calibration as cal
from jaxrl_scale.scaling import reproducibility as rep


def test_holm_steps_count_the_tests_left_at_each_step():
    assert rep.holm_steps([0.3, 0.01, float("nan"), 0.05]) == [2, 4, 1, 3]


@pytest.mark.parametrize("df", [5.0, 20.0])
def test_band_tracks_simulated_rerun_agreement_at_every_truth(df):
    """Independent Monte Carlo of two studies per truth (noncentral t at df): the share of
    studies not marked equals the rate at which both studies' verdicts agree, to within the
    band's stated max gap plus 4 binomial SEs."""
    m, alpha = 4, 0.1
    band = rep.fragile_band(df, m, alpha)
    assert band.lo < band.c < band.hi and band.max_gap < 0.05
    rng = np.random.default_rng(0)
    n = 40_000
    for delta in (0.0, 1.0, 2.0, band.c, 3.0, 4.0, 6.0):
        t = (delta + rng.standard_normal((2, n))) / np.sqrt(rng.chisquare(df, (2, n)) / df)
        v = np.sign(t) * (np.abs(t) > band.c)
        agree = np.mean(v[0] == v[1])
        unmarked = np.mean([not rep.is_fragile(x, df, m, alpha) for x in t[0, :4000]])
        se = np.sqrt(0.25 / 4000)
        assert abs(unmarked - agree) <= band.max_gap + 4 * se, (delta, unmarked, agree)


def test_no_figure_of_the_estimate_does_much_better_than_the_band():
    lp = rep.rerun_agreement_bound(8.0)
    assert 0.03 < lp["max_gap"] < 0.05
    assert rep.fragile_band(None, 4, 0.1).max_gap <= lp["max_gap"] + 0.005


def test_a_verdict_without_a_statistic_is_not_marked():
    assert rep.is_fragile(None, 20, 4, 0.1) is None
    assert rep.is_fragile(2.4, None, 4, 0.1) is None
    assert rep.is_fragile(2.4, 20, 4, 0.1) is True and rep.is_fragile(0.1, 20, 4, 0.1) is False


def test_sweep_marks_near_the_boundary_and_not_at_the_null():
    """Through familywise.sweep_tests on the default design: with every config at r_N 1.2
    (near the boundary) reruns agree about half the time and about half the verdicts are
    marked; at the null reruns agree > 0.85 and few are marked."""
    names = [c[0] for c in cal.DEFAULT.configs]
    near = rep.rerun_pairs(cal.DEFAULT, 60, seed=3, r_N={g: 1.2 for g in names[1:]})
    null = rep.rerun_pairs(cal.DEFAULT, 60, seed=4)
    a_near = np.mean([x["agreement"] for x in near.values()])
    nf_near = np.mean([x["not_fragile"] for x in near.values()])
    a_null = np.mean([x["agreement"] for x in null.values()])
    nf_null = np.mean([x["not_fragile"] for x in null.values()])
    assert a_near < 0.7 and nf_near < 0.7, (a_near, nf_near)
    assert a_null > 0.85 and nf_null > 0.75, (a_null, nf_null)
    assert abs(nf_near - a_near) < 0.15 and abs(nf_null - a_null) < 0.15


def test_marking_a_verdict_beyond_the_band_costs_calibration():
    free = rep.fragile_band(20, 4, 0.1)
    inside = rep.band_marking(2.0, 20, 4, 0.1)
    assert (inside.lo, inside.hi, inside.max_gap) == (free.lo, free.hi, free.max_gap)
    wider = rep.band_marking(3.28, 20, 4, 0.1)
    assert wider.lo <= 3.28 <= wider.hi
    assert wider.max_gap > free.max_gap + 0.03
    with pytest.raises(ValueError, match="below the critical value"):
        rep.band_marking(0.1, 20, 4, 0.1)
