"""Gradient noise scale (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training";
docs/science.md, Gradient noise scale) and the grad-norm signature of batch-size invariance
(docs/science.md, Batch-size invariance and the lr rules).

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
from jaxrl_scale.scaling.stats import quantile_ci


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
        return self.add(float(g2), float(tr))

    def add(self, g2: float, trace_sigma: float) -> "NoiseScaleEMA":
        """One update's two-batch estimates (already computed) into both EMAs."""
        self._g2 = self.beta * self._g2 + (1 - self.beta) * g2
        self._trace = self.beta * self._trace + (1 - self.beta) * trace_sigma
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
    """This record's (micro-batch, full-batch) squared norms under the names of docs/api.md,
    Gradient-norm fields, or (None, None)."""
    micro, full = r.get(f"{who}_grad_sqnorm_micro"), r.get(f"{who}_grad_sqnorm")
    if isinstance(micro, (list, tuple)) and isinstance(full, (int, float)):
        return micro, full
    return None, None


def per_update_estimates(records: Sequence[dict], batch: float,
                         micro_batch: float | None = None, who: str = "actor") -> dict:
    """One unbiased two-batch (|G|^2, tr(Sigma)) pair per logged update (docs/science.md,
    Gradient noise scale).

    Each record with ``{who}_grad_sqnorm_micro`` (list: |g_micro|^2 of each micro-batch's
    gradient) and ``{who}_grad_sqnorm`` (|mean of micro grads|^2) gives B_small =
    ``micro_batch_size`` (record, argument, else batch / number of micro-batches) and
    B_big = batch; |g_small|^2 is the mean over the record's micro-batches (each is an
    unbiased draw at B_small). Records with one micro-batch or a null (non-finite) norm are
    skipped. Returns arrays over the U kept updates: ``step_U``, ``responses_U`` (cumulative,
    NaN where not logged), ``g2_U``, ``trace_U``, ``b_small_U``, ``b_big_U``.
    """
    rows = []
    for r in records:
        micro, full = _sqnorms(r, who)
        if micro is None:
            continue
        if len(micro) < 2 or not all(isinstance(m, (int, float)) for m in micro):
            continue  # one micro batch, or a non-finite norm logged as null
        # PPO's critic may run its own schedule: its batch sizes are its own fields
        b_big = float(r.get(f"{who}_batch") or r.get("batch", batch))
        b_small = float(r.get(f"{who}_micro_batch_size") or r.get("micro_batch_size")
                        or r.get("micro_batch") or micro_batch or b_big / len(micro))
        if b_small >= b_big:
            continue
        resp = r.get("responses")
        rows.append((r.get("step", math.nan), resp if isinstance(resp, (int, float)) else math.nan,
                     float(np.mean(micro)), float(full), b_small, b_big))
    a = np.array(rows, dtype=float).reshape(-1, 6)
    g2, trace = (two_batch_estimates(a[:, 2], a[:, 3], a[:, 4], a[:, 5]) if a.size
                 else (np.zeros(0), np.zeros(0)))
    return {"step_U": a[:, 0], "responses_U": a[:, 1], "g2_U": np.asarray(g2, float),
            "trace_U": np.asarray(trace, float), "b_small_U": a[:, 4], "b_big_U": a[:, 5]}


def noise_scale_from_records(records: Sequence[dict], batch: float,
                             micro_batch: float | None = None, beta: float = 0.95,
                             who: str = "actor") -> dict | None:
    """B_simple of the actor (or critic) from the squared norms logged in training: the
    bias-corrected EMAs (:class:`NoiseScaleEMA`) of :func:`per_update_estimates`, so the
    value describes the end of the run. None when no record has both fields."""
    est = per_update_estimates(records, batch, micro_batch=micro_batch, who=who)
    if est["g2_U"].size == 0:
        return None
    ema = NoiseScaleEMA(beta=beta)
    for g2, tr in zip(est["g2_U"], est["trace_U"]):
        ema.add(float(g2), float(tr))
    return {"b_simple": ema.b_simple, "g2": ema.g2, "trace_sigma": ema.trace_sigma,
            "n_updates": ema.count, "b_small": float(est["b_small_U"][-1]),
            "b_big": float(batch)}


def run_micro_batch(run: Run) -> float | None:
    """``micro_batch_size`` from a run's config, if it records one."""
    mb = config_get(run.config, "micro_batch_size", "micro_batch")
    return float(mb) if isinstance(mb, (int, float)) and mb > 0 else None


def noise_scale_from_run(run: Run, who: str = "actor", beta: float = 0.95) -> dict | None:
    """:func:`noise_scale_from_records` on a run's training records."""
    if not run.batch:
        return None
    return noise_scale_from_records(run.train, run.batch, micro_batch=run_micro_batch(run),
                                    beta=beta, who=who)


# ---------------------------------------------------------------------------------------------
# Windows, intervals and trajectories of B_simple (U: updates, R: bootstrap replicates).
# Over a window B_simple = mean(tr(Sigma)) / mean(|G|^2): a ratio of means, because the ratio
# of the per-update unbiased estimates is biased and |G|^2 of one update is often negative.


def ratio_of_means(g2_U, trace_U) -> float:
    """B_simple over a window: mean(tr(Sigma)) / mean(|G|^2). +inf when mean |G|^2 <= 0 (the
    mean gradient is not detectable above the noise: B_crit unbounded at this precision, so
    the predicted sample cost r_N is 1); NaN for an empty window."""
    g2_U, trace_U = np.asarray(g2_U, float), np.asarray(trace_U, float)
    if g2_U.size == 0:
        return math.nan
    g2, tr = float(np.mean(g2_U)), float(np.mean(trace_U))
    return tr / g2 if g2 > 0 else math.inf


def default_block(n_updates: int) -> int:
    """Moving-block length ~ n^(1/3), the usual rate for bootstrap variance estimates of a
    mean of a weakly dependent series (consecutive updates share slowly changing weights)."""
    return max(1, int(round(n_updates ** (1.0 / 3.0))))


def block_bootstrap_indices(n: int, block: int, n_boot: int, rng: np.random.Generator
                            ) -> np.ndarray:
    """[n_boot, n] indices of a moving-block bootstrap (Kuensch 1989): ceil(n / block) blocks of
    ``block`` consecutive updates, starts uniform over the n - block + 1 possible ones, joined
    and cut to n. Keeps the correlation between neighbouring updates inside a block."""
    block = int(min(max(block, 1), n))
    n_blocks = -(-n // block)
    starts = rng.integers(0, n - block + 1, size=(n_boot, n_blocks))
    idx = (starts[:, :, None] + np.arange(block)[None, None, :]).reshape(n_boot, -1)
    return idx[:, :n]


def bootstrap_b_simple(g2_U, trace_U, groups_U=None, n_boot: int = 1000,
                       block: int | None = None, level: float = 0.9, seed: int = 0,
                       rng: np.random.Generator | None = None) -> dict:
    """B_simple over the given updates with a moving-block bootstrap interval.

    ``groups_U`` (e.g. the run each update came from) keeps blocks inside one run: each run is
    resampled on its own and the replicate pools them, so a pooled estimate from several seeds
    resamples each seed's updates. Replicates whose mean |G|^2 <= 0 give B_simple = +inf (kept:
    the interval's upper end is then unbounded, never silently dropped). Returns
    {"b_simple", "unbounded" (the point is +inf), "ci", "reps" [n_boot], "g2", "trace_sigma",
    "g2_ci", "trace_sigma_ci", "n_updates", "block", "frac_unbounded"}.
    """
    g2_U, trace_U = np.asarray(g2_U, float), np.asarray(trace_U, float)
    if g2_U.shape != trace_U.shape:
        raise ValueError(f"g2_U {g2_U.shape} and trace_U {trace_U.shape} differ in shape")
    n = g2_U.size
    rng = rng if rng is not None else np.random.default_rng(seed)
    groups_U = np.zeros(n, int) if groups_U is None else np.asarray(groups_U)
    point = ratio_of_means(g2_U, trace_U)
    out = {"b_simple": point, "unbounded": bool(point == math.inf), "n_updates": int(n),
           "g2": float(np.mean(g2_U)) if n else math.nan,
           "trace_sigma": float(np.mean(trace_U)) if n else math.nan}
    if n == 0:
        nan2 = [math.nan, math.nan]
        return {**out, "ci": nan2, "g2_ci": nan2, "trace_sigma_ci": nan2,
                "reps": np.full(n_boot, math.nan), "block": None, "frac_unbounded": math.nan}
    sums_g2, sums_tr = np.zeros(n_boot), np.zeros(n_boot)
    blocks = []
    for g in np.unique(groups_U):
        members = np.nonzero(groups_U == g)[0]
        b = block or default_block(members.size)
        blocks.append(int(min(b, members.size)))
        idx = members[block_bootstrap_indices(members.size, b, n_boot, rng)]
        sums_g2 += g2_U[idx].sum(axis=1)
        sums_tr += trace_U[idx].sum(axis=1)
    mg2, mtr = sums_g2 / n, sums_tr / n
    with np.errstate(divide="ignore", invalid="ignore"):
        reps = np.where(mg2 > 0, mtr / mg2, math.inf)
    return {**out, "ci": quantile_ci(reps, level), "reps": reps,
            "g2_ci": quantile_ci(mg2, level), "trace_sigma_ci": quantile_ci(mtr, level),
            "block": max(blocks) if len(set(blocks)) > 1 else blocks[0],
            "frac_unbounded": float(np.mean(~np.isfinite(reps)))}


def pooled_estimates(runs: Sequence[Run], who: str = "actor") -> dict:
    """:func:`per_update_estimates` of several runs (e.g. the seeds of one config) joined, with
    ``run_U`` the index of the run each update came from."""
    parts = []
    for i, run in enumerate(runs):
        if not run.batch:
            continue
        est = per_update_estimates(run.train, run.batch, micro_batch=run_micro_batch(run),
                                   who=who)
        est["run_U"] = np.full(est["g2_U"].size, i)
        parts.append(est)
    keys = ("step_U", "responses_U", "g2_U", "trace_U", "b_small_U", "b_big_U", "run_U")
    if not parts:
        return {k: np.zeros(0) for k in keys}
    return {k: np.concatenate([p[k] for p in parts]) for k in keys}


def window_mask(responses_U, lo: float, hi: float) -> np.ndarray:
    """Updates whose cumulative responses lie in [lo, hi]."""
    n = np.asarray(responses_U, float)
    return np.isfinite(n) & (n >= lo) & (n <= hi)


def noise_scale_window(est: dict, lo: float, hi: float, **boot) -> dict:
    """:func:`bootstrap_b_simple` over the updates of ``est`` with responses in [lo, hi]."""
    m = window_mask(est["responses_U"], lo, hi)
    out = bootstrap_b_simple(est["g2_U"][m], est["trace_U"][m], est["run_U"][m]
                             if "run_U" in est else None, **boot)
    out.update(responses_lo=float(lo), responses_hi=float(hi))
    return out


def n_star_window(n_star: float, half_width: float = 0.5) -> tuple[float, float]:
    """Responses [N*(1 - w), N*(1 + w)]: the updates around where the reference reaches the
    target (docs/science.md, Time to target), where r_N is decided, since B_simple grows as
    the loss falls."""
    if not (n_star > 0 and 0 < half_width):
        raise ValueError(f"n_star_window needs N* > 0 and a positive half width, got "
                         f"{n_star}, {half_width}")
    return max(0.0, n_star * (1 - half_width)), n_star * (1 + half_width)


def noise_scale_trajectory(est: dict, n_windows: int = 8, **boot) -> list[dict]:
    """B_simple in ``n_windows`` equal bins of cumulative responses (each pooling the updates
    of every run in that bin) with bootstrap intervals: its trajectory over training (McCandlish
    et al.: the noise scale grows as the loss falls). Bins with < 2 updates are left out."""
    n = est["responses_U"][np.isfinite(est["responses_U"])]
    if n.size == 0:
        return []
    edges = np.linspace(0.0, float(n.max()), n_windows + 1)
    out = []
    for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])):
        m = window_mask(est["responses_U"], lo, hi)
        if i > 0:
            m &= est["responses_U"] > lo   # bins (lo, hi]: an update on an edge counts once
        if int(m.sum()) < 2:
            continue
        w = bootstrap_b_simple(est["g2_U"][m], est["trace_U"][m],
                               est["run_U"][m] if "run_U" in est else None, **boot)
        out.append({"responses_lo": float(lo), "responses_hi": float(hi),
                    "responses_mid": float(np.median(est["responses_U"][m])),
                    "b_simple": w["b_simple"], "unbounded": w["unbounded"], "ci": w["ci"],
                    "n_updates": w["n_updates"],
                    "frac_unbounded": w["frac_unbounded"]})
    return out


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
