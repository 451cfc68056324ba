"""Statistics behind every interval the analysis prints (numpy only).

- Eval noise: the standard error of one eval score, from ``eval_se`` or ``eval_n`` on the eval
  records (binomial; for a fixed prompt set this bounds the sampling noise from above), else
  estimated from the curve itself by second differences (a trend cancels, noise does not).
- Monotone smoothing: weighted isotonic regression (pool-adjacent-violators) joined by a
  monotone cubic (Fritsch-Carlson), so N* is the crossing of a smoothed curve that bends as
  learning curves do, not of one lucky eval or of a chord between two sparse evals.
- Bootstrap: parametric for eval noise (fitted curve + Gaussian noise of the measured SE),
  non-parametric over training steps for wall time and over seeds for configs.
- Quantile intervals that keep "never reached" (+inf) replicates: an interval whose upper end
  is +inf is reported as unbounded, never silently dropped.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from jaxrl_scale.numbers import or_none

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


def pchip_slopes(n: np.ndarray, y_RE: np.ndarray) -> np.ndarray:
    """Fritsch-Carlson slopes [R, E] of the monotone cubic through every row of ``y_RE`` at the
    knots ``n`` [E] (scipy's PchipInterpolator rule: weighted harmonic means inside, the
    shape-preserving three-point formula at the ends). With these slopes the Hermite cubic is
    monotone on every interval, so a non-decreasing fit stays non-decreasing between evals."""
    y = np.atleast_2d(np.asarray(y_RE, float))
    h = np.diff(np.asarray(n, float))
    with np.errstate(invalid="ignore", divide="ignore"):
        d = np.where(h > 0, np.diff(y, axis=1) / np.where(h > 0, h, 1.0), 0.0)   # [R, E-1]
    m = np.zeros_like(y)
    if y.shape[1] < 2:
        return m
    if y.shape[1] == 2:
        return np.repeat(d, 2, axis=1)
    w1 = 2 * h[1:] + h[:-1]
    w2 = h[1:] + 2 * h[:-1]
    same = d[:, :-1] * d[:, 1:] > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        inner = (w1 + w2) / (w1 / np.where(same, d[:, :-1], 1.0) + w2 / np.where(same, d[:, 1:], 1.0))
    m[:, 1:-1] = np.where(same, inner, 0.0)

    def end(h0, h1, d0, d1):
        e = ((2 * h0 + h1) * d0 - h0 * d1) / (h0 + h1)
        e = np.where(np.sign(e) != np.sign(d0), 0.0, e)
        return np.where((np.sign(d0) != np.sign(d1)) & (np.abs(e) > 3 * np.abs(d0)), 3 * d0, e)

    m[:, 0] = end(h[0], h[1], d[:, 0], d[:, 1])
    m[:, -1] = end(h[-1], h[-2], d[:, -1], d[:, -2])
    return m


def monotone_crossing_batch(n: np.ndarray, fit_RE: np.ndarray, target_R: np.ndarray,
                            iters: int = 48) -> np.ndarray:
    """First N where each row's monotone cubic (`pchip_slopes`) through (n, fit) reaches its
    target; +inf if never, n[0] when the first point already does.

    Why not a straight line between evals: learning curves are concave between sparse evals,
    so the chord crosses late, by more where the curve bends more, which pulls every r_N
    toward 1 (a true 0.5 read as 0.70 with evals every 5,120 responses; results/n_star). The
    cubic follows the bend the neighbouring evals show; with dense evals both agree.
    ``fit_RE`` rows must be non-decreasing (an isotonic fit); bisection on the crossing
    interval (the cubic is monotone there), ``iters`` halvings."""
    n = np.asarray(n, float)
    y = np.atleast_2d(np.asarray(fit_RE, float))
    t = np.broadcast_to(np.asarray(target_R, float), (y.shape[0],))
    above = y >= t[:, None]
    hit = above.any(axis=1)
    i = np.argmax(above, axis=1)
    out = np.where(hit, n[i], np.inf)
    rows = np.nonzero(hit & (i > 0))[0]
    if rows.size == 0:
        return out
    m = pchip_slopes(n, y[rows])
    k = i[rows]
    r = np.arange(rows.size)
    x0, x1 = n[k - 1], n[k]
    y0, y1, m0, m1 = y[rows, k - 1], y[rows, k], m[r, k - 1], m[r, k]
    h = x1 - x0
    lo, hi = np.zeros(rows.size), np.ones(rows.size)      # in s = (x - x0) / h
    for _ in range(iters):
        s = 0.5 * (lo + hi)
        val = ((2 * s ** 3 - 3 * s ** 2 + 1) * y0 + (s ** 3 - 2 * s ** 2 + s) * h * m0
               + (-2 * s ** 3 + 3 * s ** 2) * y1 + (s ** 3 - s ** 2) * h * m1)
        up = val >= t[rows]
        hi = np.where(up, s, hi)
        lo = np.where(up, lo, s)
    out[rows] = x0 + hi * h
    return out


def monotone_crossing(n: np.ndarray, fit: np.ndarray, target: float) -> float:
    """`monotone_crossing_batch` for one curve."""
    return float(monotone_crossing_batch(n, np.asarray(fit, float)[None, :], [target])[0])


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


def interval(x, level: float) -> list:
    """[lo, hi] of replicates ``x`` at ``level`` (None for an end that is not finite): every
    interval of the analysis, its step-cost fits and its rollout comparison."""
    lo, hi = quantile_ci(x, level)
    return [or_none(lo), or_none(hi)]


def ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a / b elementwise, with inf/inf and 0/0 undefined (NaN) and x/inf = 0."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return a / b


def bootstrap_crossing(n: np.ndarray, s: np.ndarray, se: np.ndarray, target: float,
                       n_boot: int, rng: np.random.Generator) -> tuple[float, np.ndarray, np.ndarray]:
    """(N* of the fitted monotone curve, [n_boot] parametric-bootstrap replicates of it, the
    fit at the evals).

    The curve: weighted isotonic fit of the evals (weights 1 / se^2), joined by the monotone
    cubic of `monotone_crossing`. Replicate b refits both to fit + se * z_b and takes their
    crossing, so the fit's uncertainty is in the interval; +inf where a replicate never
    reaches the target.
    """
    w = 1.0 / np.maximum(se, 1e-12) ** 2
    fit = isotonic(s, w)
    point = monotone_crossing(n, fit, target)
    noise = rng.standard_normal((n_boot, s.size)) * se
    fits = np.stack([isotonic(fit + noise[b], w) for b in range(n_boot)]) if n_boot else (
        np.zeros((0, s.size)))
    reps = monotone_crossing_batch(n, fits, np.full(n_boot, target)) if n_boot else np.empty(0)
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
