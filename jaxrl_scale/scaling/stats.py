"""Statistics behind every interval the analysis prints (numpy only).

- Eval noise: the standard error of one eval score, from ``eval_se`` or ``eval_n`` on the eval
  records (binomial; for a fixed prompt set this bounds the sampling noise from above), else
  estimated from the curve itself by second differences (a trend cancels, noise does not).
- Monotone smoothing: weighted isotonic regression (pool-adjacent-violators), so N* is the
  crossing of a smoothed curve, not of one lucky eval.
- Bootstrap: parametric for eval noise (fitted curve + Gaussian noise of the measured SE),
  non-parametric over training steps for wall time and over seeds for configs.
- Quantile intervals that keep "never reached" (+inf) replicates: an interval whose upper end
  is +inf is reported as unbounded, never silently dropped.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

CI_LEVEL = 0.9


MIN_BOOT = 20    # fewer give no replicate beyond a 90% interval's 5%/95% quantiles


def min_n_boot(level: float = CI_LEVEL) -> int:
    """Bootstrap replicates a `level` interval needs: at least one beyond each tail's
    quantile, (1 - level) / 2 of them, and never fewer than MIN_BOOT."""
    return max(MIN_BOOT, math.ceil(2 / (1 - level) - 1e-9))


def isotonic(y: Sequence[float], w: Sequence[float] | None = None) -> np.ndarray:
    """Non-decreasing least-squares fit of ``y`` (weights ``w``): pool adjacent violators."""
    y = np.asarray(y, dtype=float)
    w = np.ones_like(y) if w is None else np.asarray(w, dtype=float)
    vals, wts, sizes = [], [], []
    for yi, wi in zip(y, w):
        vals.append(yi)
        wts.append(wi)
        sizes.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:
            wsum = wts[-2] + wts[-1]
            v = (vals[-2] * wts[-2] + vals[-1] * wts[-1]) / wsum
            s = sizes[-2] + sizes[-1]
            del vals[-1], wts[-1], sizes[-1]
            vals[-1], wts[-1], sizes[-1] = v, wsum, s
    return np.repeat(vals, sizes)


def first_crossing(n: np.ndarray, s: np.ndarray, target: float) -> float:
    """N where the piecewise-linear curve (n, s) first reaches ``target``; +inf if never.

    ``n`` sorted ascending. The first point already at or above the target gives its own N.
    """
    above = np.nonzero(s >= target)[0]
    if above.size == 0:
        return math.inf
    i = int(above[0])
    if i == 0:
        return float(n[0])
    frac = (target - s[i - 1]) / (s[i] - s[i - 1])
    return float(n[i - 1] + frac * (n[i] - n[i - 1]))


def binomial_se(p: np.ndarray, n: np.ndarray) -> np.ndarray:
    """sqrt(p (1 - p) / n), with p kept half a sample away from 0 and 1 (never a zero SE)."""
    n = np.asarray(n, dtype=float)
    p = np.clip(np.asarray(p, dtype=float), 0.5 / n, 1 - 0.5 / n)
    return np.sqrt(p * (1 - p) / n)


def noise_from_curve(n: np.ndarray, s: np.ndarray) -> float | None:
    """SE of one eval estimated from the curve: each interior point minus the straight line
    through its neighbours has variance se^2 (1 + a^2 + b^2) for interpolation weights a, b.
    None with fewer than 3 points."""
    n, s = np.asarray(n, float), np.asarray(s, float)
    if n.size < 3:
        return None
    gap = n[2:] - n[:-2]
    ok = gap > 0
    if not np.any(ok):
        return None
    a = np.where(ok, (n[2:] - n[1:-1]) / np.where(ok, gap, 1), 0.5)
    b = 1 - a
    resid = s[1:-1] - (a * s[:-2] + b * s[2:])
    var = resid[ok] ** 2 / (1 + a[ok] ** 2 + b[ok] ** 2)
    return float(math.sqrt(np.mean(var)))


def quantile_ci(x: Sequence[float], level: float = CI_LEVEL) -> list[float]:
    """[lo, hi] percentile interval; +inf entries count (the upper end may be +inf); NaNs
    (undefined replicates) are left out."""
    x = np.asarray(x, dtype=float)
    x = np.sort(x[~np.isnan(x)])
    if x.size == 0:
        return [math.nan, math.nan]
    a = (1 - level) / 2
    lo = x[min(int(math.floor(a * (x.size - 1))), x.size - 1)]
    hi = x[min(int(math.ceil((1 - a) * (x.size - 1))), x.size - 1)]
    return [float(lo), float(hi)]


def ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a / b elementwise, with inf/inf and 0/0 undefined (NaN) and x/inf = 0."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return a / b


def bootstrap_crossing(n: np.ndarray, s: np.ndarray, se: np.ndarray, target: float,
                       n_boot: int, rng: np.random.Generator) -> tuple[float, np.ndarray, np.ndarray]:
    """(N* of the isotonic fit, [n_boot] parametric-bootstrap replicates of it, the fit).

    Replicate b refits the isotonic curve to fit + se * z_b and takes its crossing; +inf where
    the replicate never reaches the target. Weights 1 / se^2.
    """
    w = 1.0 / np.maximum(se, 1e-12) ** 2
    fit = isotonic(s, w)
    point = first_crossing(n, fit, target)
    reps = np.empty(n_boot)
    noise = rng.standard_normal((n_boot, s.size)) * se
    for b in range(n_boot):
        reps[b] = first_crossing(n, isotonic(fit + noise[b], w), target)
    return point, reps, fit


def time_factors(durations: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """[n_boot] factors mean(resampled step durations) / mean(step durations): wall time to
    any N scales by them when steps are drawn again (step-to-step timing variation)."""
    d = np.asarray(durations, dtype=float)
    d = d[np.isfinite(d) & (d >= 0)]
    if d.size < 2 or d.mean() <= 0:
        return np.ones(n_boot)
    idx = rng.integers(0, d.size, size=(n_boot, d.size))
    return d[idx].mean(axis=1) / d.mean()


def block_time_factors(durations: np.ndarray, n_boot: int, rng: np.random.Generator,
                       block: int | None = None) -> np.ndarray:
    """`time_factors` with steps resampled in moving blocks (length ``block``, default
    ceil(n^(1/3))), so runs of slow steps (a busy spell of the machine) stay together and
    widen the interval as they should; block 1 is the i.i.d. resampling."""
    d = np.asarray(durations, dtype=float)
    d = d[np.isfinite(d) & (d >= 0)]
    if d.size < 2 or d.mean() <= 0:
        return np.ones(n_boot)
    n = d.size
    L = max(1, min(n, block or int(math.ceil(n ** (1 / 3)))))
    nb = int(math.ceil(n / L))
    starts = rng.integers(0, n - L + 1, size=(n_boot, nb))
    idx = (starts[:, :, None] + np.arange(L)).reshape(n_boot, -1)[:, :n]
    return d[idx].mean(axis=1) / d.mean()


def fit_line(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of y = a + b x."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    b, a = np.polyfit(x, y, 1)
    return float(a), float(b)


def bootstrap_line(x: Sequence[float], y: Sequence[float], groups: Sequence, n_boot: int,
                   rng: np.random.Generator) -> np.ndarray:
    """[n_boot, 2] (intercept, slope) refits with whole groups (e.g. runs) resampled, so
    points from one run move together. Replicates whose x has < 2 distinct values are NaN."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    g = np.asarray(groups)
    ids = np.unique(g)
    members = [np.nonzero(g == i)[0] for i in ids]
    out = np.full((n_boot, 2), np.nan)
    for b in range(n_boot):
        idx = np.concatenate([members[j] for j in rng.integers(0, ids.size, size=ids.size)])
        if np.unique(x[idx]).size >= 2:
            out[b] = fit_line(x[idx], y[idx])
    return out
