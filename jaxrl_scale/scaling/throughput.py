"""Throughput model on fixed hardware (docs/science.md, Step-cost model and Critical batches).

    t_gen(B_gen) ~ d0 + d1 * B_gen      (decode re-reads the weights: d0 ~ W_bytes / HBM_bw)
    t_train(B_train) ~ gamma * B_train

The critical generation batch is where adding sequences stops paying: the smallest B whose
doubling adds less than ``min_gain`` throughput. Also reused by the decode benchmark.

The step-time model itself (fit, predicted step seconds, r_q, r_q cap) is
`jaxrl_scale.scaling.step_cost`; this module measures (per-update costs of a run's records).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from jaxrl_scale.scaling.io import Run


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


def measured_step_seconds(run: Run) -> float | None:
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
    step_s = measured_step_seconds(run)
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
