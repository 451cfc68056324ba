"""Per-run statistics at a target: N* of the monotone fit with its parametric bootstrap,
q = N* / t(N*) with a bootstrap over step durations (docs/science.md, Time to target and
Intervals), and the auto target read from the reference's runs (docs/science.md, The auto
target). Pure numpy."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from jaxrl_scale.numbers import is_number, or_none
from jaxrl_scale.scaling import stats
from jaxrl_scale.scaling import time_to_target as ttt
from jaxrl_scale.scaling.io import Run
from jaxrl_scale.scaling.verdicts import interval as _ci


def eval_noise(run: Run) -> tuple[np.ndarray, str, float | None]:
    """(SE of each eval score, source, the curve's own jitter SE).

    The measured SE is ``eval_se`` (within-prompt sampling noise on a fixed prompt set) or,
    from ``eval_n``, binomial. A policy that fluctuates between updates makes the curve jitter
    more than its evals' sampling noise, so the SE used is never below the jitter estimated
    from the curve's second differences (with >= 5 evals); without a measured SE, the jitter
    alone (said so in the source).
    """
    n, s = run.eval_curve()
    se = np.full(n.size, np.nan)
    src = set()
    for i, r in enumerate(run.evals):
        if is_number(r.get("eval_se")) and r["eval_se"] > 0:
            se[i] = r["eval_se"]
            src.add("eval_se")
        elif is_number(r.get("eval_n")) and r["eval_n"] > 0:
            se[i] = float(stats.binomial_se(s[i], r["eval_n"]))
            src.add("eval_n")
    jitter = stats.noise_from_curve(n, s) if n.size >= 5 else None
    if np.all(np.isfinite(se)):
        if jitter:
            se = np.maximum(se, jitter)
        return se, "+".join(sorted(src)) or "none", jitter
    jitter = stats.noise_from_curve(n, s)
    fill = jitter if jitter and jitter > 0 else 1e-6
    return np.where(np.isfinite(se), se, fill), "estimated from the curve", jitter


def _durations(run: Run) -> np.ndarray:
    t = np.array([r["time_s"] for r in run.train], dtype=float)
    return np.diff(np.r_[0.0, t]) if t.size else np.zeros(0)


def run_stats(run: Run, target: float, n_boot: int, rng: np.random.Generator,
              level: float) -> tuple[dict, dict]:
    """(JSON numbers, bootstrap arrays) of one run at ``target``."""
    n, s = run.eval_curve()
    se, src, jitter = eval_noise(run)
    measured = [r.get("eval_se") or (float(stats.binomial_se(r["score"], r["eval_n"]))
                                     if is_number(r.get("eval_n")) else None) for r in run.evals]
    measured = [m for m in measured if is_number(m)]
    out: dict[str, Any] = {"batch": run.batch, "n_evals": int(n.size), "eval_se_source": src,
                           "eval_se": float(np.median(measured)) if measured else (
                               float(np.median(se)) if se.size else None),
                           "curve_jitter_se": jitter,
                           "se_used": float(np.median(se)) if se.size else None,
                           "start_score": float(s[0]) if s.size else None,
                           "max_score": float(np.max(s)) if s.size else None,
                           "final_score": float(s[-1]) if s.size else None}
    total_t = max((r["time_s"] for r in run.train), default=0.0)
    total_n = max((r["responses"] for r in run.train), default=0.0)
    q_all = total_n / total_t if total_t > 0 else math.nan
    if n.size == 0:
        reps = {"N": np.full(n_boot, np.inf), "q": np.full(n_boot, q_all)}
        out.update(N_star=None, N_star_raw=None, reached=False, q=or_none(q_all), T=None,
                   smoothed_final=None, error="no eval records")
        return out, reps
    point, n_reps, fit = stats.bootstrap_crossing(n, s, se, target, n_boot, rng)
    f = stats.block_time_factors(_durations(run), n_boot, rng)
    t_point = float(ttt.time_at_many(run.train, [point])[0])
    t_reps = ttt.time_at_many(run.train, n_reps) * f
    q_reps = np.where(np.isfinite(n_reps), stats.ratio(n_reps, t_reps), q_all / f)
    reached = math.isfinite(point)
    q = point / t_point if reached and t_point > 0 else q_all
    raw = ttt.n_star(n, s, target)
    out.update(N_star=or_none(point), N_star_raw=raw, reached=reached,
               N_star_ci=_ci(n_reps, level), q=or_none(q), q_ci=_ci(q_reps, level),
               T=or_none(t_point) if reached else None, q_overall=or_none(q_all),
               responses_total=float(total_n), smoothed_final=float(fit[-1]),
               # N* of a run that did not reach is at least the responses it ran
               censored_at=None if reached else float(total_n),
               frac_replicates_reached=float(np.mean(np.isfinite(n_reps))),
               # the run's own evals: the step-0 eval is shared by every run of a seed
               evals_before_N_star=int(np.sum((n > 0) & (n < point))) if reached else None,
               updates_to_target=or_none(point / run.batch) if run.batch and reached else None)
    return out, {"N": n_reps, "q": q_reps, "fit": fit, "se": se}


def auto_target(ref_stats: Sequence[dict], fraction: float, min_se: float = 3.0
                ) -> tuple[float, dict]:
    """start + max(fraction * (reliably reached - start), min_se * SE): start = mean first
    eval of the reference's seeds, reliably reached = the lowest final value of their monotone
    fits, SE = their median eval SE. The floor keeps a reference that barely learned from
    "reaching" a target that sits in the noise at its first eval."""
    start = float(np.mean([x["start_score"] for x in ref_stats]))
    reach = float(min(x["smoothed_final"] for x in ref_stats))
    se = float(np.median([x["se_used"] for x in ref_stats]))
    t = start + max(fraction * (reach - start), min_se * se)
    return round(t, 4), {"rule": f"start + max({fraction:g} x (lowest final smoothed score of "
                                 f"the reference's seeds - start), {min_se:g} eval SE)",
                         "start": start, "reach": reach, "fraction": fraction, "se": se}
