"""Gradient noise scale (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training";
SCIENCE.md section 5) and the grad-norm signature of batch-size invariance (section 2).

    E|g_B|^2 = |G|^2 + tr(Sigma) / B,     B_simple = tr(Sigma) / |G|^2
    S = S_min (1 + B_noise / B),  E = E_min (1 + B / B_noise),  B_crit = E_min / S_min

Two-batch unbiased estimators from squared norms at B_small and B_big:

    |G|^2     ~ (B_big |g_big|^2 - B_small |g_small|^2) / (B_big - B_small)
    tr(Sigma) ~ (|g_small|^2 - |g_big|^2) / (1/B_small - 1/B_big)

The ratio of the two unbiased estimates is biased, so both are smoothed by separate EMAs and
divided only at the end. With gradient accumulation the micro-batch gradients are "small"
and their mean is "big": nearly free.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from jaxrl_scale.scaling.io import Run, config_get


def two_batch_estimates(sq_small, sq_big, b_small, b_big):
    """Unbiased (|G|^2, tr(Sigma)) from |g_small|^2 at B_small and |g_big|^2 at B_big.

    Works elementwise on arrays. B_big must differ from B_small.
    """
    sq_small = np.asarray(sq_small, dtype=float)
    sq_big = np.asarray(sq_big, dtype=float)
    b_small = np.asarray(b_small, dtype=float)
    b_big = np.asarray(b_big, dtype=float)
    if np.any(b_big == b_small):
        raise ValueError("two_batch_estimates needs B_big != B_small")
    g2 = (b_big * sq_big - b_small * sq_small) / (b_big - b_small)
    trace = (sq_small - sq_big) / (1.0 / b_small - 1.0 / b_big)
    return g2, trace


def b_simple(g2: float, trace_sigma: float) -> float | None:
    """B_simple = tr(Sigma) / |G|^2 (None when |G|^2 <= 0: noise swamps the signal)."""
    return float(trace_sigma / g2) if g2 > 0 else None


@dataclasses.dataclass
class NoiseScaleEMA:
    """Separate bias-corrected EMAs of the |G|^2 and tr(Sigma) estimates; B_simple is their
    ratio taken at the end (not an EMA of ratios)."""
    beta: float = 0.95
    _g2: float = 0.0
    _trace: float = 0.0
    count: int = 0

    def update(self, sq_small: float, sq_big: float, b_small: float, b_big: float
               ) -> "NoiseScaleEMA":
        g2, tr = two_batch_estimates(sq_small, sq_big, b_small, b_big)
        self._g2 = self.beta * self._g2 + (1 - self.beta) * float(g2)
        self._trace = self.beta * self._trace + (1 - self.beta) * float(tr)
        self.count += 1
        return self

    def _debias(self, x: float) -> float:
        return x / (1 - self.beta ** self.count) if self.count else math.nan

    @property
    def g2(self) -> float:
        return self._debias(self._g2)

    @property
    def trace_sigma(self) -> float:
        return self._debias(self._trace)

    @property
    def b_simple(self) -> float | None:
        return b_simple(self.g2, self.trace_sigma) if self.count else None


def _sqnorms(r: dict, who: str):
    """This record's (micro-batch, full-batch) squared norms under the names of docs/API.md
    ("Gradient-norm fields"), or (None, None)."""
    micro, full = r.get(f"{who}_grad_sqnorm_micro"), r.get(f"{who}_grad_sqnorm")
    if isinstance(micro, (list, tuple)) and isinstance(full, (int, float)):
        return micro, full
    return None, None


def noise_scale_from_records(records: Sequence[dict], batch: float,
                             micro_batch: float | None = None, beta: float = 0.95,
                             who: str = "actor") -> dict | None:
    """B_simple of the actor (or critic) from per-micro-batch squared norms logged in training.

    Each record with ``{who}_grad_sqnorm_micro`` (list: |g_micro|^2 per micro-batch) and
    ``{who}_grad_sqnorm`` (|mean of micro grads|^2) gives one two-batch estimate with
    B_small = ``micro_batch_size`` (record, argument, else batch / number of micro-batches),
    B_big = batch; |g_small|^2 is the mean over micro-batches. None when no record has both.
    """
    ema = NoiseScaleEMA(beta=beta)
    b_small_used = None
    for r in records:
        micro, full = _sqnorms(r, who)
        if micro is None:
            continue
        if len(micro) < 2 or not all(isinstance(m, (int, float)) for m in micro):
            continue  # one micro batch, or a non-finite norm logged as null
        b_big = float(r.get("batch", batch))
        b_small = float(r.get("micro_batch_size") or r.get("micro_batch") or micro_batch
                        or b_big / len(micro))
        if b_small >= b_big:
            continue
        ema.update(float(np.mean(micro)), float(full), b_small, b_big)
        b_small_used = b_small
    if ema.count == 0:
        return None
    return {"b_simple": ema.b_simple, "g2": ema.g2, "trace_sigma": ema.trace_sigma,
            "n_updates": ema.count, "b_small": b_small_used, "b_big": float(batch)}


def noise_scale_from_run(run: Run, who: str = "actor", beta: float = 0.95) -> dict | None:
    """:func:`noise_scale_from_records` on a run's training records."""
    if not run.batch:
        return None
    mb = config_get(run.config, "micro_batch_size", "micro_batch")
    mb = float(mb) if isinstance(mb, (int, float)) and mb > 0 else None
    return noise_scale_from_records(run.train, run.batch, micro_batch=mb, beta=beta, who=who)


def predicted_r_n(batch, batch0, b_crit):
    """Predicted sample cost r_N(B) = (1 + B/B_crit) / (1 + B0/B_crit) (McCandlish E(B))."""
    batch = np.asarray(batch, dtype=float)
    out = (1.0 + batch / b_crit) / (1.0 + batch0 / b_crit)
    return float(out) if out.ndim == 0 else out


def _loglog(batches, values):
    b = np.asarray(batches, dtype=float)
    v = np.asarray(values, dtype=float)
    keep = np.isfinite(b) & np.isfinite(v) & (b > 0) & (v > 0)
    b, v = b[keep], v[keep]
    order = np.argsort(b, kind="stable")
    return np.log(b[order]), np.log(v[order]), b[order]


def loglog_slope(batches: Sequence[float], norms: Sequence[float]) -> float | None:
    """Least-squares slope of log(norm) vs log(batch): -1/2 inside the invariant range."""
    lb, lv, _ = _loglog(batches, norms)
    if np.unique(lb).size < 2:
        return None
    return float(np.polyfit(lb, lv, 1)[0])


def flattening_batch(batches: Sequence[float], norms: Sequence[float],
                     threshold: float = -0.25) -> float | None:
    """First batch B_i after which the local log-log slope (B_i -> B_{i+1}) exceeds
    ``threshold``: where the P^(-1/2) fall of the grad norm flattens. None if it never does."""
    lb, lv, b = _loglog(batches, norms)
    for i in range(lb.size - 1):
        if lb[i + 1] > lb[i] and (lv[i + 1] - lv[i]) / (lb[i + 1] - lb[i]) > threshold:
            return float(b[i])
    return None
