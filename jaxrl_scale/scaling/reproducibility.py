"""How often a rerun repeats a verdict, and the mark that says so.

Two independent studies of the same truth agree on a config's verdict (faster, slower or
indistinguishable) with probability `agreement(delta) = sum_v P(v | delta)^2`, a function of
the unknown truth delta = theta / se: about 0.95 at delta = 0 (m = 4, alpha = 0.1), about 0.5
where the truth sits on the decision boundary, and near 1 far beyond it. Any figure a report
prints is a function of the study's own estimate instead, so the question is which function of
the estimate has, at every truth, a mean equal to the rerun agreement.

`rerun_agreement_bound` answers it under the normal model as a linear program over all
functions g(|T|) in [0, 1]: the best possible worst-case gap is about 0.046, reached by a 0/1
band around the critical value, while the two natural probabilities (the power at the estimate,
the flat-prior predictive) miss by 0.1 or more (`rerun_agreement_gap`). The report's figure is
therefore that band, `fragile_band`, computed for the test's own df around the critical value of
the config's Holm step: a verdict whose |T| falls inside it is marked fragile. For one test at
that critical value, at every truth the share of studies whose verdict is not marked equals the
rerun agreement to within the band's `max_gap` (0.040-0.049); on studies simulated through the
sweep's own tests, where Holm couples the configs, the gap is measured in
results/calibration/reproducibility.py. A mark says "a study like this one, at its truth, is
repeated by a rerun about half the time or less"; it is not a probability for this study.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Sequence

import numpy as np
from scipy import stats as sps

THETA_MAX = 8.0      # the truths the band is fitted over, in units of the test's SE
DF_GRID = tuple(range(1, 31)) + (35, 40, 50, 60, 80, 100, 150, 200, 300, 500, 1000)


@dataclasses.dataclass(frozen=True)
class Band:
    """|T| in [lo, hi] marks a verdict fragile; c the critical value; max_gap the largest
    |share not marked - rerun agreement| over truths 0 <= delta <= THETA_MAX."""
    lo: float
    hi: float
    c: float
    max_gap: float


def _cdf_grid(z: np.ndarray, delta: np.ndarray, df: float | None) -> np.ndarray:
    """P(T <= z | delta) for T = (delta + Z) / S, S = sqrt(chi2_df / df): [len(delta), len(z)].
    The noncentral t by quadrature over S at its quantile midpoints (S = 1 at infinite df)."""
    if df is None or not math.isfinite(df):
        s = np.ones(1)
    else:
        u = (np.arange(100) + 0.5) / 100
        s = np.sqrt(sps.chi2.ppf(u, df) / df)
    return sps.norm.cdf(z[None, :, None] * s[None, None, :] - delta[:, None, None]).mean(-1)


@functools.lru_cache(maxsize=64)
def _band(df_key: float | None, m: int, alpha: float, must_mark: float | None = None) -> Band:
    c = float(sps.t.isf(alpha / (2 * m), df_key) if df_key else sps.norm.isf(alpha / (2 * m)))
    delta = np.linspace(0.0, THETA_MAX, 81)
    top = max(c + 3.0, (must_mark or 0.0) + 0.02)
    z = np.round(np.arange(0.0, top + 1e-9, 0.02), 10)
    F_pos = _cdf_grid(z, delta, df_key)           # P(T <= z)
    F_neg = _cdf_grid(-z, delta, df_key)          # P(T <= -z)
    F_c = _cdf_grid(np.array([c, -c]), delta, df_key)
    up, lo = 1.0 - F_c[:, 0], F_c[:, 1]
    agree = up ** 2 + lo ** 2 + (1.0 - up - lo) ** 2            # [delta]
    below = F_pos - F_neg                                       # P(|T| <= z): [delta, z]
    i_lo = np.flatnonzero((z >= c - 2.0) & (z <= c))
    i_hi = np.flatnonzero(z >= c)
    if must_mark is not None:          # only bands with lo <= must_mark <= hi
        i_lo = i_lo[z[i_lo] <= must_mark]
        i_hi = i_hi[z[i_hi] >= must_mark]
        if not i_lo.size:
            raise ValueError(f"|T| = {must_mark} is more than 2 below the critical value {c:.2f}")
    # share not marked = 1 - P(z_lo <= |T| <= z_hi), for every (z_lo, z_hi) pair at once
    inside = below[:, None, i_hi] - below[:, i_lo, None]        # [delta, lo, hi]
    gap = np.abs(1.0 - inside - agree[:, None, None]).max(axis=0)
    a, b = np.unravel_index(np.argmin(gap), gap.shape)
    return Band(float(z[i_lo[a]]), float(z[i_hi[b]]), c, float(gap[a, b]))


def _df_key(df: float | None) -> float | None:
    # df floored to a grid (heavier tails, a slightly wider band): Welch-Satterthwaite df
    # differ per study, and each band costs a grid search
    if df is None or not math.isfinite(df) or df >= DF_GRID[-1]:
        return None
    return float(DF_GRID[max(0, int(np.searchsorted(DF_GRID, float(df), side="right")) - 1)])


def fragile_band(df: float | None, m: int, alpha: float) -> Band:
    """The 0/1 band of |T| (T the config's statistic at the first Holm step, critical value c
    = t_{1 - alpha / (2m)}(df)) whose unmarked share tracks the rerun agreement best over
    truths up to THETA_MAX standard errors. df None or inf: the normal."""
    return _band(_df_key(df), int(m), float(alpha))


def band_marking(t_abs: float, df: float | None, m: int, alpha: float) -> Band:
    """The band that tracks the rerun agreement best among those that mark |T| = t_abs: what
    marking one more verdict costs in calibration (its max_gap against fragile_band's). Bands
    start within 2 of the critical value, so a |T| further below c cannot be marked."""
    return _band(_df_key(df), int(m), float(alpha), round(float(abs(t_abs)), 2))


def is_fragile(t_stat: float | None, df: float | None, m_step: int, alpha: float) -> bool | None:
    """Whether a verdict whose test statistic is t_stat is fragile: |t_stat| inside the band
    around the critical value of its own Holm step (m_step = tests still in the family when
    it is tested, m for the smallest p). None without a statistic or a df."""
    if t_stat is None or not np.isfinite(t_stat) or df is None or not df > 0 or m_step < 1:
        return None
    band = fragile_band(df, m_step, alpha)
    return bool(band.lo <= abs(float(t_stat)) <= band.hi)


def holm_steps(p_values: Sequence[float]) -> list[int]:
    """Per test, the number of tests still in the family at its Holm step (m for the smallest
    p, 1 for the largest; NaN last)."""
    p = np.asarray(p_values, dtype=float)
    order = np.argsort(np.where(np.isnan(p), np.inf, p), kind="stable")
    steps = np.empty(len(p), dtype=int)
    steps[order] = len(p) - np.arange(len(p))
    return steps.tolist()


def rerun_agreement_gap(theta_over_se: Sequence[float], alpha: float = 0.1, m: int = 4,
                        n: int = 200_000, seed: int = 0) -> list[dict]:
    """Per true theta / se: {"theta_over_se", "actual", "observed_power", "predictive"}: the
    agreement of two independent normal studies, and the mean of the power at the estimate and
    of the flat-prior predictive (estimate' ~ N(estimate, 2 se^2)) as figures of it."""
    c = sps.norm.ppf(1 - alpha / (2 * m))
    rng = np.random.default_rng(seed)
    out = []
    for th in theta_over_se:
        d, d2 = th + rng.standard_normal(n), th + rng.standard_normal(n)
        v, v2 = (np.sign(x) * (np.abs(x) > c) for x in (d, d2))

        def same(spread):   # P(verdict v) for a rerun estimate ~ N(d, spread^2)
            up, lo = sps.norm.sf((c - d) / spread), sps.norm.cdf((-c - d) / spread)
            return np.where(v > 0, up, np.where(v < 0, lo, 1 - up - lo))

        out.append({"theta_over_se": float(th), "actual": float(np.mean(v == v2)),
                    "observed_power": float(np.mean(same(1.0))),
                    "predictive": float(np.mean(same(math.sqrt(2.0))))})
    return out


def rerun_agreement_bound(theta_max: float, alpha: float = 0.1, m: int = 4,
                          max_step: float | None = None, z_max: float = 12.0,
                          n_z: int = 241, n_theta: int = 161) -> dict:
    """min over g of max over theta / se in [0, theta_max] of |E g(|Z + theta|) - agreement|,
    normal model. g is piecewise constant on a grid of |z| in [0, z_max]; max_step bounds
    |g(z_i) - g(z_i+1)| (None: any g). Returns {"max_gap", "z", "g", "theta", "agreement",
    "mean_figure"}."""
    from scipy.optimize import linprog
    c = sps.norm.ppf(1 - alpha / (2 * m))
    z, theta = np.linspace(0.0, z_max, n_z), np.linspace(0.0, theta_max, n_theta)
    up, lo = sps.norm.sf(c - theta), sps.norm.cdf(-c - theta)
    agree = up ** 2 + lo ** 2 + (1 - up - lo) ** 2
    # W[t, i]: P(|theta_t + Z| falls in grid cell i)
    W = sps.norm.pdf(z[None, :] - theta[:, None]) + sps.norm.pdf(z[None, :] + theta[:, None])
    W[:, 0] /= 2
    W /= W.sum(axis=1, keepdims=True)
    ones = np.ones((n_theta, 1))
    a_ub, b_ub = [np.hstack([W, -ones]), np.hstack([-W, -ones])], [agree, -agree]
    if max_step is not None:
        D = np.zeros((n_z - 1, n_z + 1))
        D[np.arange(n_z - 1), np.arange(n_z - 1)] = 1.0
        D[np.arange(n_z - 1), np.arange(1, n_z)] = -1.0
        a_ub += [D, -D]
        b_ub += [np.full(n_z - 1, max_step)] * 2
    cost = np.zeros(n_z + 1)
    cost[-1] = 1.0
    res = linprog(cost, A_ub=np.vstack(a_ub), b_ub=np.concatenate(b_ub),
                  bounds=[(0.0, 1.0)] * n_z + [(0.0, None)], method="highs")
    g = res.x[:n_z]
    return {"max_gap": float(res.x[-1]), "z": z, "g": g, "theta": theta,
            "agreement": agree, "mean_figure": W @ g}


def rerun_pairs(design, n_pairs: int, seed: int = 0, r_N: dict | None = None,
                level: float = 0.9) -> dict:
    """Pairs of independent studies simulated through `familywise.sweep_tests` (the
    calibration's fast path) at the same truth: per config {"agreement": share of pairs with
    the same verdict, "not_fragile": share of studies whose verdict is not marked, "n"}."""
    from jaxrl_scale.scaling import calibration as cal, familywise
    rng = np.random.default_rng(seed)
    n = 2 * n_pairs
    est = cal.simulate_estimates(design, n, rng, r_N or {})
    W = design.warm_starts
    units = (cal.simulate_pass_units(design, rng, {}, n * W).reshape(
        n, W, len(design.configs), -1) if design.timing_blocks else None)
    names = [c[0] for c in design.configs]
    calls = {g: [] for g in names[1:]}
    for i in range(n):
        configs, per_run, offsets, block_offsets = cal.sweep_inputs(design, est, units, i,
                                                                    level)
        fw = familywise.sweep_tests(configs, per_run, {}, {"grpo": names[0]}, level,
                                    offsets=offsets, block_offsets=block_offsets)
        for g in names[1:]:
            f = fw["configs"].get(g)
            calls[g].append((f.verdict, f.fragile) if f else ("not reached", None))
    out = {}
    for g, x in calls.items():
        same = [a[0] == b[0] for a, b in zip(x[0::2], x[1::2])]
        out[g] = {"agreement": float(np.mean(same)), "n": n_pairs,
                  "not_fragile": float(np.mean([f is False for _, f in x]))}
    return out


__all__ = ["Band", "THETA_MAX", "band_marking", "fragile_band", "is_fragile", "holm_steps", "rerun_agreement_gap",
           "rerun_agreement_bound", "rerun_pairs"]
