"""Throughput model on fixed hardware (SCIENCE.md sections 3-4).

    t_gen(B_gen) ~ d0 + d1 * B_gen      (decode re-reads the weights: d0 ~ W_bytes / HBM_bw)
    t_train(B_train) ~ gamma * B_train

The critical generation batch is where adding sequences stops paying: the smallest B whose
doubling adds less than ``min_gain`` throughput. Also reused by the decode benchmark.

From a timing pass (experiment/timing.py): `fit_step_times` fits d0, d1, gamma and a per-update
host overhead with bootstrap intervals; `predict_r_q` turns the fit into r_q(B) (section 1)
at any batch and rollout ratio k (t_step = t_gen(k B) / k + t_train(B)).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from jaxrl_scale.scaling.io import Run
from jaxrl_scale.scaling.stats import CI_LEVEL, quantile_ci


def fit_linear_time(batches: Sequence[float], times: Sequence[float]) -> tuple[float, float]:
    """Least-squares (d0, d1) of t = d0 + d1 * B."""
    b = np.asarray(batches, dtype=float)
    t = np.asarray(times, dtype=float)
    if b.size < 2 or np.ptp(b) == 0:
        raise ValueError("fit_linear_time needs at least two distinct batch sizes")
    a = np.stack([np.ones_like(b), b], axis=1)
    (d0, d1), *_ = np.linalg.lstsq(a, t, rcond=None)
    return float(d0), float(d1)


def _sorted(batches, values):
    b = np.asarray(batches, dtype=float)
    v = np.asarray(values, dtype=float)
    if b.shape != v.shape:
        raise ValueError(f"batches {b.shape} and values {v.shape} differ in shape")
    order = np.argsort(b, kind="stable")
    return b[order], v[order]


def throughput_gains(batches: Sequence[float], tokens_per_s: Sequence[float]) -> np.ndarray:
    """Gain per doubling between consecutive measured batches (sorted ascending).

    gain_i = (tp_{i+1} / tp_i) ** (1 / log2(B_{i+1} / B_i)) - 1, so batches need not be exact
    doublings. Length n-1; element i belongs to batch B_i.
    """
    b, tp = _sorted(batches, tokens_per_s)
    if b.size < 2:
        return np.zeros(0)
    octaves = np.log2(b[1:] / b[:-1])
    if np.any(octaves <= 0):
        raise ValueError(f"batches must be distinct and positive, got {b.tolist()}")
    return (tp[1:] / tp[:-1]) ** (1.0 / octaves) - 1.0


def critical_generation_batch(batches: Sequence[float], throughput: Sequence[float],
                              min_gain: float = 0.10) -> float | None:
    """Smallest measured B whose doubling (to the next measured batch, normalised by the log2
    ratio) adds less than ``min_gain`` throughput. None if it never plateaus in the grid."""
    b, _ = _sorted(batches, throughput)
    gains = throughput_gains(batches, throughput)
    for i, g in enumerate(gains):
        if g < min_gain:
            return float(b[i])
    return None


def _steps_and(run: Run, key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = [(r.get("step", math.nan), r[key], r["time_s"]) for r in run.train
            if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    if not rows:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    a = np.array(rows, dtype=float)
    if np.all(np.isfinite(a[:, 0])):
        a = a[np.argsort(a[:, 0], kind="stable")]
    return a[:, 0], a[:, 1], a[:, 2]


def per_step(run: Run, key: str) -> float | None:
    """Median per-update value of a timing field (e.g. ``gen_s``).

    The field may be logged per step or cumulatively; it is taken as cumulative when it never
    decreases and its median exceeds 1.5x the median wall time between records (a per-step
    duration cannot exceed the wall time between two logged steps).
    """
    steps, vals, times = _steps_and(run, key)
    if vals.size == 0:
        return None
    dt = np.diff(times)
    cumulative = (vals.size >= 3 and np.all(np.diff(vals) >= 0) and dt.size
                  and np.median(vals) > 1.5 * np.median(dt))
    if not cumulative:
        return float(np.median(vals))
    ds = np.diff(steps) if np.all(np.isfinite(steps)) else np.ones(vals.size - 1)
    ok = ds > 0
    return float(np.median(np.diff(vals)[ok] / ds[ok])) if np.any(ok) else None


def counter_per_step(run: Run, key: str) -> float | None:
    """Median increase per update of a cumulative counter (e.g. ``responses_generated``)."""
    num = lambda x: isinstance(x, (int, float))
    rows = sorted((r["step"], r[key]) for r in run.train if num(r.get("step")) and num(r.get(key)))
    if len(rows) < 2:
        return None
    s, v = np.array(rows, dtype=float).T
    ok = np.diff(s) > 0
    return float(np.median(np.diff(v)[ok] / np.diff(s)[ok])) if np.any(ok) else None


def step_seconds(run: Run) -> float | None:
    """Median wall seconds per optimizer update from cumulative ``time_s``."""
    rows = sorted((r["step"], r["time_s"]) for r in run.train
                  if isinstance(r.get("step"), (int, float)))
    if len(rows) >= 2:
        s, t = np.array(rows, dtype=float).T
        ok = np.diff(s) > 0
        if np.any(ok):
            return float(np.median(np.diff(t)[ok] / np.diff(s)[ok]))
    n, t = run.train_series("time_s")
    if n.size >= 2 and run.batch:
        ok = np.diff(n) > 0
        if np.any(ok):
            return float(np.median(np.diff(t)[ok] / np.diff(n)[ok]) * run.batch)
    return None


def step_costs(run: Run) -> dict:
    """Per-update costs of a run (source Figure 7 inputs).

    responses_per_step: retained batch; collection_s_per_step: generation seconds per update
    (``gen_s``; else the whole step time); train_s_per_step; step_s; gen_throughput:
    generated responses per generation second (retained responses when
    ``responses_generated`` is absent).
    """
    step_s = step_seconds(run)
    gen = per_step(run, "gen_s")
    train = per_step(run, "train_s")
    gen_resp = counter_per_step(run, "responses_generated")
    if gen_resp is None:
        gen_resp = run.batch
    coll = gen if gen is not None else step_s
    return {
        "responses_per_step": run.batch,
        "collection_s_per_step": coll,
        "collection_source": "gen_s" if gen is not None else ("step time" if coll else None),
        "train_s_per_step": train,
        "step_s": step_s,
        "generated_per_step": gen_resp,
        "gen_throughput": (gen_resp / gen) if (gen and gen_resp) else None,
    }


# ----------------------------------------------------------------------------- step-time model
# A timing pass (experiment/timing.py, `time_batches`) measures per-update rollout and update
# seconds at a few batches; the fit below turns them into the section-3 cost model and
# `predict_r_q` into the throughput ratio r_q of section 1 at any batch, with intervals.

FIT_COLUMNS = ("d0", "d1", "gamma", "overhead")


def _gen_ratio(t: dict) -> float:
    """k = B_gen / B_train of one timing entry (1 for the synchronous rollout)."""
    return float(t.get("batch_gen", t["batch"])) / float(t["batch"])


def _lines_BN(x_BN: np.ndarray, y_BN: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise least-squares (intercept, slope) of y = a + b x: one line per replicate."""
    xm = x_BN.mean(axis=1, keepdims=True)
    ym = y_BN.mean(axis=1, keepdims=True)
    sxx = np.sum((x_BN - xm) ** 2, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.where(sxx > 0, np.sum((x_BN - xm) * (y_BN - ym), axis=1) / sxx, np.nan)
    return ym[:, 0] - slope * xm[:, 0], slope


def fit_step_times(timings: Sequence[dict], n_boot: int = 1000, seed: int = 0) -> dict:
    """Fit the section-3 cost model to a timing pass, with bootstrap intervals.

        t_gen(B_gen) = d0 + d1 * B_gen        (the time to generate B_gen sequences at once)
        t_train(B)   = overhead + gamma * B   (batch packing + update of B responses)

    timings: `time_batches` entries ({"batch", "batch_gen", "gen_s": [...], "train_s": [...]}).
    Every timed step is one point (least squares over all of them, so a batch with more steps
    weighs more). An entry at rollout ratio k = batch_gen / batch measures gen_s per *update*,
    which in steady state is t_gen(k B) / k (see `predict_r_q`), so its points enter the
    generation fit as (B_gen, k * gen_s): d0 and d1 describe the hardware and engine, whatever
    k the pass ran at. (At k > 1 single updates alternate between long and short rollouts; time
    a multiple of k steps so their mean is the steady state.) `overhead` is kept separate from
    the source's t_train = gamma * B because host work per update (packing, transfers,
    dispatch) does not vanish at small B.

    Bootstrap: n_boot refits with the steps resampled within each batch (each batch keeps its
    count; a step's gen_s and train_s move together), so the interval reflects step-to-step
    timing noise at the measured batches. Intervals are stats.CI_LEVEL quantiles.
    Returns {"d0", "d1", "gamma", "overhead" (seconds and seconds per row), "d0_ci", ...,
    "boot": [n_boot, 4] array of (d0, d1, gamma, overhead), "n_steps": timed steps in all,
    "ci_level", "batches", "batch_gens"}.
    """
    xg, yg, xt, yt, group = [], [], [], [], []
    for i, t in enumerate(timings):
        gen, train = np.asarray(t["gen_s"], float), np.asarray(t["train_s"], float)
        if gen.size != train.size or gen.size == 0:
            raise ValueError(f"timing entry for batch {t.get('batch')}: gen_s ({gen.size}) and "
                             f"train_s ({train.size}) need the same, non-zero number of steps")
        k = _gen_ratio(t)
        xg.append(np.full(gen.size, float(t.get("batch_gen", t["batch"]))))
        yg.append(k * gen)
        xt.append(np.full(train.size, float(t["batch"])))
        yt.append(train)
        group.append(np.full(gen.size, i))
    xg, yg, xt, yt, group = map(np.concatenate, (xg, yg, xt, yt, group))
    if np.unique(xg).size < 2 or np.unique(xt).size < 2:
        raise ValueError("fit_step_times needs timings at >= 2 distinct batches (and B_gen)")
    d0, d1 = fit_linear_time(xg, yg)
    overhead, gamma = fit_linear_time(xt, yt)

    rng = np.random.default_rng(seed)
    idx = np.concatenate([rng.choice(np.nonzero(group == g)[0], size=(n_boot, np.sum(group == g)))
                          for g in np.unique(group)], axis=1)          # [n_boot, n_steps]
    bd0, bd1 = _lines_BN(xg[idx], yg[idx])
    bov, bga = _lines_BN(xt[idx], yt[idx])
    boot = np.stack([bd0, bd1, bga, bov], axis=1)
    out = {"d0": d0, "d1": d1, "gamma": gamma, "overhead": overhead}
    for j, name in enumerate(FIT_COLUMNS):
        out[name + "_ci"] = quantile_ci(boot[:, j], CI_LEVEL)
    out.update(boot=boot, n_steps=int(xg.size), ci_level=CI_LEVEL,
               batches=sorted({int(t["batch"]) for t in timings}),
               batch_gens=sorted({int(t.get("batch_gen", t["batch"])) for t in timings}))
    return out


def step_seconds_model(params_N4: np.ndarray, batches: np.ndarray, gen_batch_ratio: float = 1
                       ) -> np.ndarray:
    """t_step(B) = t_gen(k B) / k + t_train(B) for parameter rows (d0, d1, gamma, overhead).

    With k B sequences in flight and one update per B finished responses, a sequence spends
    on average k updates in flight, so in steady state one update's share of the decoding is
    t_gen(k B) / k = d0 / k + d1 B: the fixed per-step cost (weights re-read, SCIENCE.md
    section 3) is spread over k updates while the per-row cost is not. Rollout and update run
    one after the other here (train.py: the engine pauses during the update), so the two add.
    Broadcasts: params [..., 4] x batches [n] -> [..., n].
    """
    p = np.asarray(params_N4, float)
    b = np.asarray(batches, float)
    d0, d1, gamma, overhead = (p[..., j, None] for j in range(4))
    k = float(gen_batch_ratio)
    return (d0 + d1 * k * b) / k + overhead + gamma * b


def predict_r_q(fit: dict, batches: Sequence[float], batch0: float,
                gen_batch_ratio: int = 1, gen_batch_ratio0: int | None = None) -> dict:
    """Predicted throughput ratio r_q(B) = q(B) / q(B0) (SCIENCE.md section 1) from a
    `fit_step_times` fit, q(B) = B / t_step(B) retained responses per second, t_step as in
    `step_seconds_model` at rollout ratio k = gen_batch_ratio (the reference runs at
    gen_batch_ratio0, default the same k).

    Returns {"r_q": [n], "r_q_ci": [n, 2] (stats.CI_LEVEL quantiles of the replicates),
    "boot": [n_boot, n] r_q under each bootstrap fit (empty when the fit has none),
    "q_per_s": [n], "t_step_s": [n], "q0_per_s"}.
    """
    b = np.atleast_1d(np.asarray(batches, float))
    k0 = gen_batch_ratio if gen_batch_ratio0 is None else gen_batch_ratio0
    point = np.array([fit[c] for c in FIT_COLUMNS], float)
    t = step_seconds_model(point, b, gen_batch_ratio)
    t0 = step_seconds_model(point, np.array([float(batch0)]), k0)
    q, q0 = b / t, float(batch0) / t0[0]
    boot = np.asarray(fit.get("boot", np.zeros((0, 4))), float).reshape(-1, 4)
    tb = step_seconds_model(boot, b, gen_batch_ratio)                       # [n_boot, n]
    tb0 = step_seconds_model(boot, np.array([float(batch0)]), k0)           # [n_boot, 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        rb = (b / tb) / (float(batch0) / tb0)
    ci = np.array([quantile_ci(rb[:, j], CI_LEVEL) if rb.shape[0] else [math.nan, math.nan]
                   for j in range(b.size)]).reshape(b.size, 2)
    return {"r_q": q / q0, "r_q_ci": ci, "boot": rb, "q_per_s": q, "t_step_s": t,
            "q0_per_s": q0}
