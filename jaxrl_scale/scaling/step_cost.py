"""The one step-time model (docs/science.md, Step-cost model): fit, predicted step seconds,
r_q and the r_q cap, used by the analysis, the planner and the report.

    t_gen(B_gen)  = d0 + d1 * B_gen            (one decode round with B_gen sequences)
    t_train(B)    = overhead + gamma * B       (batch packing + update of B responses)
    t_step(B, k)  = t_gen(k B) / k + t_train(B)   (k = gen_batch_ratio; rollout then update)
    r_q(B)        = [B / t_step(B)] / [B0 / t_step(B0)]
    r_q cap       = lim r_q(B) as B -> inf = t_step(B0) / (B0 (d1 + gamma))   (k = 1)

Parameters are always in the order `COLUMNS` = (d0, d1, gamma, overhead): a "theta" is an
array [..., 4] of them. Two sources of a fit: a timing pass (`fit_step_times`, from
`experiment.timing.time_batches` entries) and a sweep's own runs (`fit_runs`, per-run median
step times, intervals by resampling runs). Numpy only (no JAX).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Sequence

import numpy as np

from jaxrl_scale.numbers import is_number, or_none
from jaxrl_scale.scaling import stats
from jaxrl_scale.scaling.io import Run
from jaxrl_scale.scaling.stats import CI_LEVEL, quantile_ci
from jaxrl_scale.scaling.verdicts import interval as _ci

COLUMNS = ("d0", "d1", "gamma", "overhead")   # column order of every theta [..., 4] / "boot"


def fit_linear_time(batches: Sequence[float], times: Sequence[float]) -> tuple[float, float]:
    """Least-squares (d0, d1) of t = d0 + d1 * B."""
    b = np.asarray(batches, dtype=float)
    t = np.asarray(times, dtype=float)
    if b.size < 2 or np.ptp(b) == 0:
        raise ValueError("fit_linear_time needs at least two distinct batch sizes")
    a = np.stack([np.ones_like(b), b], axis=1)
    (d0, d1), *_ = np.linalg.lstsq(a, t, rcond=None)
    return float(d0), float(d1)


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
    """Fit the step-cost model (docs/science.md, Step-cost model) to a timing pass, with
    bootstrap intervals.

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
    _check_timings(timings)
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
    out = {"d0": d0, "d1": d1, "gamma": gamma, "overhead": overhead, **_reward_line(timings)}
    for j, name in enumerate(COLUMNS):
        out[name + "_ci"] = quantile_ci(boot[:, j], CI_LEVEL)
    out.update(boot=boot, n_steps=int(xg.size), ci_level=CI_LEVEL,
               batches=sorted({int(t["batch"]) for t in timings}),
               batch_gens=sorted({int(t.get("batch_gen", t["batch"])) for t in timings}),
               source="jaxrl_scale.scaling.step_cost.fit_step_times", timings=list(timings))
    return out


def _reward_line(timings: Sequence[dict]) -> dict:
    """The time outside the model inside t_gen, measured, fitted like t_gen (per B_gen) to
    every timed step: the reward function's `reward_s`, t_reward(B_gen) = reward_d0 +
    reward_d1 B_gen, and with multi-turn episodes the reward plus the environment's `env_s`,
    t_external(B_gen) = external_d0 + external_d1 B_gen. Both are already inside gen_s, so
    they change no prediction; they say how much of the rollout is spent outside the model.
    A line is left out when a pass did not record its fields at every step (passes made
    before they were recorded; single-turn passes have no env_s) or timed < 2 batches."""
    out = {}
    for names, prefix in ((("reward_s",), "reward"), (("reward_s", "env_s"), "external")):
        line = _seconds_line(timings, names)
        if line is not None:
            out[prefix + "_d0"], out[prefix + "_d1"] = line
    return out


def _seconds_line(timings: Sequence[dict], names: Sequence[str]):
    """(d0, d1) of sum(names) seconds against B_gen over every timed step, or None."""
    x, y = [], []
    for t in timings:
        parts = [np.asarray(t.get(n) or [], float) for n in names]
        if any(r.size != len(t["gen_s"]) or not np.all(np.isfinite(r)) for r in parts):
            return None
        x.append(np.full(len(t["gen_s"]), float(t.get("batch_gen", t["batch"]))))
        y.append(_gen_ratio(t) * np.sum(parts, axis=0))
    x, y = np.concatenate(x), np.concatenate(y)
    if np.unique(x).size < 2:
        return None
    return fit_linear_time(x, y)


def predict_r_q(fit: dict, batches: Sequence[float], batch0: float,
                gen_batch_ratio: int = 1, gen_batch_ratio0: int | None = None) -> dict:
    """Predicted throughput ratio r_q(B) = q(B) / q(B0) (docs/science.md, Time to target) from a
    `fit_step_times` fit, q(B) = B / t_step(B) retained responses per second, t_step as in
    `step_seconds` at rollout ratio k = gen_batch_ratio (the reference runs at
    gen_batch_ratio0, default the same k).

    Returns {"r_q": [n], "r_q_ci": [n, 2] (stats.CI_LEVEL quantiles of the replicates),
    "boot": [n_boot, n] r_q under each bootstrap fit (empty when the fit has none),
    "q_per_s": [n], "t_step_s": [n], "q0_per_s"}.
    """
    b = np.atleast_1d(np.asarray(batches, float))
    k0 = gen_batch_ratio if gen_batch_ratio0 is None else gen_batch_ratio0
    point = theta_of_fit(fit)
    t = step_seconds(point, b, gen_batch_ratio)
    q, q0 = b / t, float(batch0) / step_seconds(point, [float(batch0)], k0)[0]
    boot = np.asarray(fit.get("boot", np.zeros((0, 4))), float).reshape(-1, 4)
    rb = r_q(boot, b, batch0, gen_batch_ratio, k0)                          # [n_boot, n]
    ci = np.array([quantile_ci(rb[:, j], CI_LEVEL) if rb.shape[0] else [math.nan, math.nan]
                   for j in range(b.size)]).reshape(b.size, 2)
    return {"r_q": q / q0, "r_q_ci": ci, "boot": rb, "q_per_s": q, "t_step_s": t,
            "q0_per_s": q0}


class PlanError(ValueError):
    """A bad planner input; str() is `<field>: <problem>. Fix: <fix>.` like
    `experiment.config.ConfigError` (the command turns it into one; this module stays free of
    JAX, which that module imports). Raised for bad timings here and by the planner."""

    def __init__(self, field: str, problem: str, fix: str):
        self.field, self.problem, self.fix = field, problem, fix
        super().__init__(f"{field}: {problem}. Fix: {fix}.")


def _check_timings(timings: Sequence[dict]) -> None:
    if not isinstance(timings, (list, tuple)) or not timings:
        raise PlanError("timings_json", "no timing entries", "give a list of {\"batch\", "
                        "\"batch_gen\", \"gen_s\": [...], \"train_s\": [...]} (time_batches' "
                        "output)")
    for i, e in enumerate(timings):
        ok = (isinstance(e, dict) and is_number(e.get("batch")) and e["batch"] > 0
              and all(isinstance(e.get(k), (list, tuple)) and e[k]
                      and all(is_number(x) and x >= 0 for x in e[k]) for k in ("gen_s", "train_s"))
              and len(e["gen_s"]) == len(e["train_s"]))
        if not ok:
            raise PlanError("timings_json", f"entry {i} is not {{\"batch\" > 0, \"gen_s\": "
                            "[seconds...], \"train_s\": [as many seconds]}}: "
                            f"{str(e)[:120]}", "time at least two batches, a few steps each")
    if len({float(e["batch"]) for e in timings}) < 2:
        raise PlanError("timings_json", "the step-time fit needs timings at >= 2 distinct "
                        "batches, "
                        f"got {sorted({e['batch'] for e in timings})}",
                        "time two or more batches (e.g. --time_batches=64,128,256)")


def _batch_means(timings) -> np.ndarray:
    """[entries, 4]: batch, batch_gen, mean t_gen(B_gen) (gen_s per update times k, as
    `fit_step_times` reads it), mean t_train(B)."""
    rows = []
    for e in timings:
        b = float(e["batch"])
        bg = float(e.get("batch_gen") or b)
        rows.append((b, bg, np.mean(e["gen_s"]) * bg / b, np.mean(e["train_s"])))
    return np.array(rows, float)


def fit_check(timings: Sequence[dict], theta, batch0: float) -> list[dict]:
    """Per timed batch: measured mean seconds per update (collection + update), the fitted
    lines' step_seconds, their relative error, and r_q straight from the measured step times
    (where B0 was timed): shows how much of an r_q miss is the linear model's."""
    rows = _batch_means(timings)
    out, q0 = [], None
    meas = {float(b): g * b / bg + t for b, bg, g, t in rows}   # per-update seconds as timed
    k_of = {float(b): bg / b for b, bg, _, _ in rows}
    if float(batch0) in meas:
        q0 = batch0 / meas[float(batch0)]
    for b in sorted(meas):
        fitted = float(step_seconds(theta, [b], k_of[b])[0])
        out.append({"batch": b, "step_s": meas[b], "step_s_fit": fitted,
                    "rel_err": fitted / meas[b] - 1.0,
                    "r_q_timed": (b / meas[b]) / q0 if q0 else None})
    return out


def theta_of_fit(fit: dict) -> np.ndarray:
    """(d0, d1, gamma, overhead) of a fit dict."""
    try:
        theta = np.array([float(fit[k]) for k in COLUMNS])
    except (KeyError, TypeError, ValueError):
        raise PlanError("timings_json", f"the step-time fit lacks one of {COLUMNS}: "
                        f"{sorted(fit)}", "pass fit_step_times' output") from None
    return theta


def step_seconds(theta, batches, gen_batch_ratio: float = 1) -> np.ndarray:
    """Predicted seconds per update t_gen(k B) / k + t_train(B) for theta [..., 4] and
    batches [C]: [..., C]; NaN where the fitted lines give a step time <= 0 (outside where the
    fit means anything).

    With k B sequences in flight and one update per B finished responses, a sequence spends
    on average k updates in flight, so in steady state one update's share of the decoding is
    t_gen(k B) / k = d0 / k + d1 B: the fixed per-step cost (weights re-read; docs/science.md,
    Step-cost model) is spread over k updates while the per-row cost is not. Rollout and update run
    one after the other here (train.py: the engine pauses during the update), so the two add.
    """
    p = np.asarray(theta, float)
    b = np.asarray(batches, float)
    d0, d1, gamma, overhead = (p[..., j, None] for j in range(4))
    k = float(gen_batch_ratio)
    t = (d0 + d1 * k * b) / k + overhead + gamma * b
    return np.where(t > 0, t, np.nan)


@dataclasses.dataclass(frozen=True)
class ExternalTime:
    """Time outside the model per update: a reward judge, a remote verifier or an environment
    answering requests of `per_request` responses, `concurrency` at once, `request_s` seconds
    each. Not overlapped with decoding or the update (an upper bound where the rollout
    overlaps them): external_seconds(B) = request_s ceil(B / (per_request concurrency))."""
    request_s: float
    per_request: int = 1
    concurrency: int = 1

    def seconds(self, batches) -> np.ndarray:
        b = np.asarray(batches, float)
        return self.request_s * np.ceil(b / (self.per_request * self.concurrency))


def r_q(theta, batches, batch0: float, gen_batch_ratio: float = 1,
        gen_batch_ratio0: float | None = None,
        external: ExternalTime | None = None) -> np.ndarray:
    """r_q(B) = q(B) / q(B0) with q(B) = B / (step_seconds(B) + external seconds(B))
    (docs/science.md, Step-cost model): [..., C] for theta [..., 4] (the reference at
    gen_batch_ratio0, default the same k)."""
    k0 = gen_batch_ratio if gen_batch_ratio0 is None else gen_batch_ratio0
    b = np.asarray(batches, float)
    b0 = np.array([float(batch0)])
    ext, ext0 = ((external.seconds(b), external.seconds(b0)[0]) if external is not None
                 else (0.0, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        q = b / (step_seconds(theta, b, gen_batch_ratio) + ext)
        q0 = float(batch0) / (step_seconds(theta, b0, k0)[..., 0] + ext0)
        return q / q0[..., None]


def r_q_cap(theta, batch0: float) -> np.ndarray:
    """The most any batch can gain in throughput over B0 (k = 1): lim r_q(B) as B -> inf,
    t_step(B0) / (B0 (d1 + gamma)). theta [..., 4] -> [...]."""
    p = np.asarray(theta, float)
    per_resp = p[..., 1] + p[..., 2]
    with np.errstate(divide="ignore", invalid="ignore"):
        return (p[..., 0] + p[..., 3] + per_resp * batch0) / batch0 / per_resp


def gen_seconds(run: Run, cost: dict) -> float | None:
    """Seconds to generate B_gen responses with B_gen in flight: the collection time per update
    times B_gen / responses generated per update. Synchronous rollout generates B_gen = B_train
    per update (factor 1); partial rollout keeps k * B_train in flight but harvests about
    B_train per update, so an update's collection is about 1/k of one t_gen(B_gen)."""
    t, b_gen, made = cost["collection_s_per_step"], run.batch_gen or run.batch, \
        cost.get("generated_per_step")
    if not (is_number(t) and t > 0 and b_gen):
        return None
    return t * b_gen / made if is_number(made) and made > 0 else t


def fit_runs(runs: Sequence[Run], costs: dict, n_boot: int, rng, level: float,
             min_gain: float, ref_batch: float | None) -> dict:
    """Fits t_gen = d0 + d1 * B_gen (`gen_seconds`: synchronous and partial-rollout runs
    share one curve) and t_train = overhead + gamma * B_train over the runs (per-run median step
    times), intervals by resampling runs. Critical generation batch: beyond it a doubling
    of B_gen gains < min_gain generation throughput, B = (1 - g) d0 / (2 g d1). r_q cap: the
    most a larger batch can gain in end-to-end throughput over ``ref_batch`` under both fits."""
    rows = [(r.batch_gen or r.batch, gen_seconds(r, costs[r.name]),
             costs[r.name].get("train_s_per_step"), r.batch or r.batch_gen, r.name)
            for r in runs if gen_seconds(r, costs[r.name])]
    out = {"batch": None, "d0": None, "d1": None, "min_gain": min_gain,
           "metric": "gen_s" if any(costs[r.name]["collection_source"] == "gen_s" for r in runs)
           else "step time",
           "batch_kind": "batch_gen" if any(r.batch_gen for r in runs) else "batch_train",
           "gen_batch_ratios": sorted({r.gen_batch_ratio for r in runs}),
           # distinct B_gen of synchronous runs: with < 2, B_gen varies only through k, and
           # the fit compares slot-engine rounds with synchronous ones (not one curve's points)
           "sync_batches": len({r.batch_gen or r.batch for r in runs
                                if r.gen_batch_ratio == 1 and gen_seconds(r, costs[r.name])}),
           "points": []}
    if not rows:
        return out
    b, tg, tt, bt, names = zip(*rows)
    b, tg, bt = np.array(b, float), np.array(tg, float), np.array(bt, float)
    by_b = collections.defaultdict(list)
    for bi, ti in zip(b, tg):
        by_b[bi].append(bi / ti)
    out["points"] = [{"batch": bb, "throughput": float(np.median(v)),
                      "throughput_range": [float(min(v)), float(max(v))], "runs": len(v)}
                     for bb, v in sorted(by_b.items())]
    if np.unique(b).size < 2:
        return out
    d0, d1 = stats.fit_line(b, tg)
    boot = stats.bootstrap_line(b, tg, names, n_boot, rng)
    k = (1 - min_gain) / (2 * min_gain)
    with np.errstate(divide="ignore", invalid="ignore"):
        cgb_b = np.where((boot[:, 1] > 0) & (boot[:, 0] > 0), k * boot[:, 0] / boot[:, 1],
                         np.where(boot[:, 1] > 0, 0.0, np.inf))
    cgb_b[np.isnan(boot[:, 1])] = np.nan   # a resample with one batch fits no line
    cgb = k * d0 / d1 if d1 > 0 and d0 > 0 else (0.0 if d1 > 0 else math.inf)
    out.update(d0=d0, d1=d1, d0_ci=_ci(boot[:, 0], level), d1_ci=_ci(boot[:, 1], level),
               batch=or_none(cgb), batch_ci=_ci(cgb_b, level),
               within_grid=bool(is_number(cgb) and b.min() <= cgb <= b.max()),
               rule=f"B_gen beyond which a doubling adds < {min_gain:.0%} throughput: "
                    f"(1 - g) d0 / (2 g d1)")
    tt = np.array([x if is_number(x) else np.nan for x in tt], float)
    ok = np.isfinite(tt)
    if np.unique(bt[ok]).size >= 2:   # the update sees B_train responses, whatever B_gen
        overhead, gamma = stats.fit_line(bt[ok], tt[ok])
        tboot = stats.bootstrap_line(bt[ok], tt[ok], np.array(names)[ok], n_boot, rng)
        train = {"overhead": overhead, "gamma": gamma, "overhead_ci": _ci(tboot[:, 0], level),
                 "gamma_ci": _ci(tboot[:, 1], level)}
        if ref_batch:
            theta = np.array([d0, d1, gamma, overhead])
            boot_th = np.stack([boot[:, 0], boot[:, 1], tboot[:, 1], tboot[:, 0]], axis=1)
            train["r_q_cap"] = or_none(r_q_cap(theta, ref_batch))
            train["r_q_cap_ci"] = _ci(r_q_cap(boot_th, ref_batch), level)
            share = gamma * ref_batch / (d0 + d1 * ref_batch + overhead + gamma * ref_batch)
            train["update_share_at_reference"] = or_none(share)
        out["train_fit"] = train
    return out



def regime(ref_runs: Sequence[Run], costs: dict, fit: dict) -> dict:
    """Where a step's time goes at the reference batch, stated before any
    verdict: a larger generation batch buys throughput only where generation is a large part
    of a step, as in real LLM RL.

    Per reference run: median generation seconds (``gen_s``) and update seconds (``train_s``)
    per step, as shares of the median step time; the regime is "generation-bound" when the
    median generation share is at least the update share. ``fit``: `fit_runs`' d0, d1 with
    intervals, quoted beside. "unknown" when the logs carry no generation/update times."""
    rows = []
    for r in ref_runs:
        c = costs[r.name]
        g, u, s = c.get("collection_s_per_step"), c.get("train_s_per_step"), c.get("step_s")
        if c.get("collection_source") == "gen_s" and is_number(g) and is_number(u) and (
                is_number(s) and s > 0):
            rows.append((g / s, u / s, g, u, s))
    out = {"batch": ref_runs[0].batch if ref_runs else None, "runs": len(rows),
           "regime": "unknown", "d0": fit.get("d0"), "d0_ci": fit.get("d0_ci"),
           "d1": fit.get("d1"), "d1_ci": fit.get("d1_ci")}
    if not rows:
        out["reason"] = "the reference's logs have no per-step gen_s and train_s"
        return out
    gs, us, g, u, s = (np.array(x, float) for x in zip(*rows))
    gen_share, upd_share = float(np.median(gs)), float(np.median(us))
    out.update(gen_share=gen_share, gen_share_range=[float(gs.min()), float(gs.max())],
               update_share=upd_share, update_share_range=[float(us.min()), float(us.max())],
               gen_s=float(np.median(g)), update_s=float(np.median(u)),
               step_s=float(np.median(s)),
               regime="generation-bound" if gen_share >= upd_share else "update-bound")
    return out


MISS_FLOOR = 0.05   # a relative miss below this is not worth refusing a fit for


def fit_misses(fit: dict, timings: Sequence[dict], level: float = CI_LEVEL,
               floor: float = MISS_FLOOR) -> list[dict]:
    """The timed batches whose measured mean seconds per update lie outside the fit's own
    ci_level interval there (the bootstrap of the four parameters) and more than ``floor``
    (relative) from the fitted value: a linear model that does not describe the records it was
    fitted on. Empty when it does, or without a bootstrap."""
    boot = np.asarray(fit.get("boot", np.zeros((0, 4))), float).reshape(-1, 4)
    if boot.shape[0] < 2:
        return []
    out = []
    for row in fit_check(timings, theta_of_fit(fit), timings[0]["batch"]):
        k = [e for e in timings if float(e["batch"]) == row["batch"]][0]
        k = float(k.get("batch_gen") or k["batch"]) / float(k["batch"])
        s_R = np.array([step_seconds(th, [row["batch"]], k)[0] for th in boot])
        lo, hi = np.quantile(s_R, [0.5 - level / 2, 0.5 + level / 2])
        if not lo <= row["step_s"] <= hi and abs(row["rel_err"]) > floor:
            out.append(dict(row, step_s_fit_ci=[float(lo), float(hi)]))
    return out
