"""Time-to-target primitives (docs/science.md, Time to target) and the ScaleRL sigmoid fit
(docs/science.md, Learning-curve fit).

    dJ/dt = dJ/dN * dN/dt;  T = N* / q;  T/T0 = r_N / r_q,  r_N = N*/N0*,  r_q = q/q0.

A larger batch is faster iff r_q > r_N. The analysis with intervals, seeds and verdicts is in
`scaling.analysis`; runs that never reach the target are reported, never extrapolated.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from jaxrl_scale.numbers import is_number





def n_star(responses: Sequence[float], scores: Sequence[float], target: float) -> float | None:
    """Cumulative responses at which the eval score first reaches ``target``.

    Linear interpolation between the last eval below and the first at or above the target;
    if the first eval already meets it, its N. None when never reached. NaN scores are skipped.
    """
    n = np.asarray(responses, dtype=float)
    s = np.asarray(scores, dtype=float)
    keep = np.isfinite(n) & np.isfinite(s)
    n, s = n[keep], s[keep]
    order = np.argsort(n, kind="stable")
    n, s = n[order], s[order]
    if n.size == 0:
        return None
    if s[0] >= target:
        return float(n[0])
    for i in range(1, n.size):
        if s[i] >= target:
            frac = (target - s[i - 1]) / (s[i] - s[i - 1])
            return float(n[i - 1] + frac * (n[i] - n[i - 1]))
    return None


def time_at_many(train_records: Sequence[dict], n) -> np.ndarray:
    """Cumulative wall seconds at each of ``n`` responses, interpolated between training
    records; NaN when no record has both fields, +inf stays +inf.

    (0 responses, 0 s) anchors the start. Past the last record the last segment's rate is
    extended (evals are often logged a little after the last training record).
    """
    n = np.asarray(n, dtype=float)
    out = np.full(n.shape, np.nan)
    pts = sorted((float(r["responses"]), float(r["time_s"])) for r in train_records
                 if is_number(r.get("responses")) and is_number(r.get("time_s")))
    if not pts:
        return out
    nn, tt = np.array(pts).T
    if nn[0] > 0:
        nn, tt = np.r_[0.0, nn], np.r_[0.0, tt]
    rate = (tt[-1] - tt[-2]) / (nn[-1] - nn[-2]) if nn.size > 1 and nn[-1] > nn[-2] else 0.0
    fin = np.isfinite(n)
    out[~fin] = np.inf
    x = n[fin]
    out[fin] = np.where(x <= nn[-1], np.interp(x, nn, tt), tt[-1] + rate * (x - nn[-1]))
    return out


def time_at(train_records: Sequence[dict], n: float) -> float | None:
    """`time_at_many` at one N; None when no record has both responses and time_s."""
    t = float(time_at_many(train_records, [n])[0])
    return None if math.isnan(t) else t


def throughput(train_records: Sequence[dict], n_star_value: float | None) -> float | None:
    """q: mean end-to-end throughput over [0, N*] = N* / t(N*), retained responses per second."""
    if n_star_value is None:
        return None
    t = time_at(train_records, n_star_value)
    if t is None or t <= 0:
        return None
    return float(n_star_value / t)


def time_ratio(r_n: float, r_q: float) -> float:
    """T/T0 = r_N / r_q."""
    return r_n / r_q


# ---------------------------------------------------------------------------------------------
# ScaleRL sigmoid (Khatri et al. 2025): J(N) = R0 + (A - R0) / (1 + (N_mid / N)^B).
# Written in log N, 1 / (1 + (N_mid/N)^B) = sigmoid(B (log N - log N_mid)): better conditioned.


def sigmoid_curve(n: np.ndarray, r0: float, a: float, log_nmid: float, b: float) -> np.ndarray:
    n = np.asarray(n, dtype=float)
    with np.errstate(divide="ignore", over="ignore"):
        z = b * (np.log(np.maximum(n, 1e-300)) - log_nmid)
        frac = np.where(n > 0, 1.0 / (1.0 + np.exp(-z)), 0.0)
    return r0 + (a - r0) * frac


def sigmoid_n_star(r0: float, a: float, log_nmid: float, b: float, target: float) -> float | None:
    """Inverse of the sigmoid: N with J(N) = target; None when target is outside (R0, A)."""
    lo, hi = min(r0, a), max(r0, a)
    if not (lo < target < hi) or b <= 0:
        return None
    ratio = (a - r0) / (target - r0) - 1.0
    if ratio <= 0:
        return None
    return float(math.exp(log_nmid - math.log(ratio) / b))


def _jac(n, p, eps=1e-6):
    f0 = sigmoid_curve(n, *p)
    cols = []
    for i in range(len(p)):
        dp = np.array(p, dtype=float)
        h = eps * max(1.0, abs(dp[i]))
        dp[i] += h
        cols.append((sigmoid_curve(n, *dp) - f0) / h)
    return np.stack(cols, axis=1)


def _lm_fit(n, s, p0, lower, upper, iters=200):
    """Small Levenberg-Marquardt with box clipping: used when scipy is absent."""
    p = np.clip(np.array(p0, dtype=float), lower, upper)
    lam = 1e-2
    cost = float(np.sum((sigmoid_curve(n, *p) - s) ** 2))
    for _ in range(iters):
        r = sigmoid_curve(n, *p) - s
        jm = _jac(n, p)
        jtj = jm.T @ jm
        g = jm.T @ r
        step = np.linalg.solve(jtj + lam * np.diag(np.diag(jtj) + 1e-12), -g)
        p_new = np.clip(p + step, lower, upper)
        c_new = float(np.sum((sigmoid_curve(n, *p_new) - s) ** 2))
        if c_new < cost:
            done = cost - c_new < 1e-14 * max(cost, 1e-30)
            p, cost, lam = p_new, c_new, lam / 3
            if done:
                break
        else:
            lam *= 4
            if lam > 1e10:
                break
    jm = _jac(n, p)
    dof = max(n.size - p.size, 1)
    try:
        cov = np.linalg.pinv(jm.T @ jm) * cost / dof
    except np.linalg.LinAlgError:
        cov = np.full((p.size, p.size), np.inf)
    return p, cov


def fit_sigmoid(responses: Sequence[float], scores: Sequence[float], target: float | None = None,
                n_samples: int = 400, seed: int = 0, use_scipy: bool | None = None) -> dict | None:
    """Fit J(N) = R0 + (A-R0)/(1+(N_mid/N)^B) to eval points.

    Returns {"R0", "A", "N_mid", "B", "N_star", "N_star_std", "method", "rmse"}; N* is the
    smooth crossing of ``target`` and its std comes from sampling the fit covariance.
    None with fewer than 4 points.
    """
    n = np.asarray(responses, dtype=float)
    s = np.asarray(scores, dtype=float)
    keep = np.isfinite(n) & np.isfinite(s)
    n, s = n[keep], s[keep]
    if n.size < 4 or np.ptp(s) == 0:
        return None
    pos = n[n > 0]
    lo_n, hi_n = np.log(pos.min()), np.log(n.max())
    half = s.min() + 0.5 * np.ptp(s)
    log_mid0 = float(np.log(n[np.argmax(s >= half)])) if np.any(s >= half) else hi_n
    log_mid0 = float(np.clip(log_mid0, lo_n, hi_n))
    span = max(np.ptp(s), 1e-6)
    p0 = [float(s[0]) if n[0] == 0 else float(s.min()), float(s.max()), log_mid0, 1.5]
    lower = np.array([s.min() - 2 * span, s.min() - span, lo_n - 5.0, 0.05])
    upper = np.array([s.max() + span, s.max() + 4 * span, hi_n + 5.0, 20.0])
    p0 = np.clip(p0, lower + 1e-9, upper - 1e-9)

    if use_scipy is None:
        try:
            import scipy.optimize  # noqa: F401
            use_scipy = True
        except ImportError:
            use_scipy = False
    method = "numpy-lm"
    p = cov = None
    if use_scipy:
        import scipy.optimize
        try:
            p, cov = scipy.optimize.curve_fit(sigmoid_curve, n, s, p0=p0, bounds=(lower, upper),
                                              maxfev=20000)
            method = "scipy"
        except (RuntimeError, ValueError):
            p = None
    if p is None:
        p, cov = _lm_fit(n, s, p0, lower, upper)
    r0, a, log_nmid, b = (float(x) for x in p)
    rmse = float(np.sqrt(np.mean((sigmoid_curve(n, *p) - s) ** 2)))
    out = {"R0": r0, "A": a, "N_mid": float(math.exp(log_nmid)), "B": b, "rmse": rmse,
           "method": method, "N_star": None, "N_star_std": None}
    if target is not None:
        out["N_star"] = sigmoid_n_star(r0, a, log_nmid, b, target)
        if out["N_star"] is not None and cov is not None and np.all(np.isfinite(cov)):
            rng = np.random.default_rng(seed)
            try:
                draws = rng.multivariate_normal(p, cov, size=n_samples, check_valid="ignore")
            except (ValueError, np.linalg.LinAlgError):
                draws = np.zeros((0, 4))
            ns = [sigmoid_n_star(*d, target) for d in draws]
            ns = np.array([x for x in ns if x is not None])
            if ns.size >= n_samples // 4:
                # Half the 16-84% range: robust to the heavy tail of N* near the asymptote.
                lo16, hi84 = np.percentile(ns, [16, 84])
                out["N_star_std"] = float(0.5 * (hi84 - lo16))
                out["N_star_frac_defined"] = float(ns.size / n_samples)
    return out
