"""Learning curves and partial rollout against a twin: the mean |J - J0| between seed-mean curves
against a band from the eval noise alone (`invariance`), and each config run with asynchronous
partial rollout (k > 1) against its synchronous twin (`partial_rollout`). Numpy only."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from jaxrl_scale.numbers import is_number
from jaxrl_scale.numbers import or_none
from jaxrl_scale.scaling import io as sio
from jaxrl_scale.scaling import stats
from jaxrl_scale.scaling.io import Run
from jaxrl_scale.scaling.verdicts import interval as _ci
from jaxrl_scale.scaling.verdicts import verdict as _verdict


def _mean_curve(runs: Sequence[Run], per_run: dict, grid: np.ndarray):
    """Seed-mean curve on ``grid`` and the SE of each eval of that mean (``per_run``: {run:
    `summary.RunStats`})."""
    curves = [np.interp(grid, *r.eval_curve()) for r in runs]
    se = np.median(np.concatenate([per_run[r.name].se_at_evals for r in runs]))
    return np.mean(curves, axis=0), se / math.sqrt(len(runs))


def invariance(cfg_runs: list[Run], ref_runs: list[Run], per_run: dict, rng, level: float,
               n_grid: int = 50, n_sim: int = 400) -> dict:
    """Mean |J - J0| between the seed-mean curves over their common N range, against a band
    derived from the eval noise: the ``level`` quantile of the same statistic for two curves
    that differ by eval noise alone (simulated at both configs' eval points and SEs)."""
    ns = [r.eval_curve()[0] for r in cfg_runs + ref_runs]
    if any(n.size < 2 for n in ns):
        return {"within": None, "reason": "fewer than 2 eval points"}
    lo = max(n[0] for n in ns)
    hi = min(n[-1] for n in ns)
    if hi <= lo:
        return {"within": None, "reason": "eval ranges do not overlap"}
    grid = np.linspace(lo, hi, n_grid)
    j, se = _mean_curve(cfg_runs, per_run, grid)
    j0, se0 = _mean_curve(ref_runs, per_run, grid)
    mad = float(np.mean(np.abs(j - j0)))
    n1, n0 = cfg_runs[0].eval_curve()[0], ref_runs[0].eval_curve()[0]
    sims = np.empty(n_sim)
    for i in range(n_sim):
        e1 = np.interp(grid, n1, rng.standard_normal(n1.size) * se)
        e0 = np.interp(grid, n0, rng.standard_normal(n0.size) * se0)
        sims[i] = np.mean(np.abs(e1 - e0))
    band = float(np.quantile(sims, level))
    return {"within": bool(mad <= band), "mean_abs_dev": mad, "band": band,
            "mean_dev": float(np.mean(j - j0)), "grid": [float(lo), float(hi)]}


ROLLOUT_KEYS = ("staleness_mean", "staleness_max", "off_policy_token_frac", "slot_occupancy")


def rollout_means(runs: Sequence[Run]) -> dict:
    """Seed mean of each run's mean partial-rollout record (staleness_max: the largest seen);
    None where no run logs it."""
    out = {}
    for key in ROLLOUT_KEYS:
        per = [v for v in (r.train_series(key)[1] for r in runs) if v.size]
        if not per:
            out[key] = None
        elif key == "staleness_max":
            out[key] = float(max(v.max() for v in per))
        else:
            out[key] = float(np.mean([v.mean() for v in per]))
    return out


def sync_twin(g: str, st, configs: dict) -> str | None:
    """The k = 1 config that differs from config g (k > 1) only in its rollout: same algo,
    B_train, G and lr rule; the one named like g without its ``_k`` tag when several."""
    if st.gen_batch_ratio == 1:
        return None
    key = lambda x: (x.algo, x.batch, x.group_size, x.lr_rule)
    twins = [h for h, x in configs.items() if x.gen_batch_ratio == 1 and key(x) == key(st)]
    if sio.strip_ratio(g) in twins:
        return sio.strip_ratio(g)
    return twins[0] if len(twins) == 1 else None


def partial_rollout(configs: dict, creps: dict, groups: dict, per_run: dict, rng,
                    level: float) -> list[dict]:
    """Partial rollout (B_gen = k * B_train) against its synchronous twin, per config with
    k > 1: q, N* and T ratios (k-run / sync run) with the configs' seed-hierarchical bootstrap
    replicates (configs: {config: `summary.ConfigStats`}), a verdict under Holm over all the comparisons (`familywise_rows`), the
    learning curves against each other (stale tokens may cost samples) and the rollout
    records' means."""
    rows = []
    for g, st in sorted(configs.items()):
        h = sync_twin(g, st, configs)
        if h is None:
            continue
        x0, a, b = configs[h], creps[g], creps[h]
        both = bool(st.reached and x0.reached)
        point = lambda key: or_none(stats.ratio(getattr(st, key), getattr(x0, key))) if (
            is_number(getattr(st, key)) and is_number(getattr(x0, key))) else None
        t_ci = _ci(stats.ratio(a["T"], b["T"]), level)
        rows.append({
            "config": g, "sync_config": h, "algo": st.algo, "batch": st.batch,
            "batch_gen": st.batch_gen, "gen_batch_ratio": st.gen_batch_ratio,
            "reached": both, "q_ratio": point("q"),
            "q_ratio_ci": _ci(stats.ratio(a["q"], b["q"]), level),
            "r_N": point("N_star") if both else None,
            "r_N_ci": _ci(stats.ratio(a["N"], b["N"]), level),
            "T_ratio": point("T") if both else None,
            "T_ratio_ci": t_ci, "verdict": _verdict(both, t_ci),
            "curves": invariance(groups[g], groups[h], per_run, rng, level),
            **{k: getattr(st, k) for k in ROLLOUT_KEYS}})
    return familywise_rows(rows, [stats.ratio(creps[x["config"]]["T"],
                                              creps[x["sync_config"]]["T"]) for x in rows], level)


def familywise_rows(rows: list[dict], t_reps: Sequence[np.ndarray], level: float) -> list[dict]:
    """Holm over the sweep's partial-rollout comparisons: each T ratio gets
    a two-sided bootstrap p-value of 1 (`familywise.bootstrap_p`), Holm-adjusted over the
    comparisons, and a Bonferroni-simultaneous interval; "verdict" is faster / slower only
    where the adjusted p is below 1 - level, so a sweep whose partial rollout changes nothing
    calls a difference at most 1 - level of the time however many k it tries. The
    per-comparison verdict stays as verdict_per_comparison."""
    from jaxrl_scale.scaling.familywise import bootstrap_p, holm
    m = len(rows)
    alpha = 1 - level
    p = [bootstrap_p(r) if x["reached"] else math.nan for x, r in zip(rows, t_reps)]
    adj = holm(p)
    out = []
    for x, r, pi, pa in zip(rows, t_reps, p, adj):
        v = x["verdict"]
        if x["reached"]:
            ratio = x["T_ratio"]
            v = ("indistinguishable" if not (pa < alpha) else
                 "faster" if is_number(ratio) and ratio < 1 else "slower")
        out.append({**x, "verdict_per_comparison": x["verdict"], "verdict": v,
                    "p_value": or_none(pi), "p_holm": or_none(pa),
                    "T_ratio_sci": stats.quantile_ci(r, 1 - alpha / max(m, 1)) if x[
                        "reached"] else [None, None]})
    return out
