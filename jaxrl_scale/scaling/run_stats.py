"""Per-run statistics at a target, one typed `summary.RunStats` per run: N* of the monotone
fit with its parametric bootstrap, q = N* / t(N*) with a bootstrap over step durations
(docs/science.md, Time to target and Intervals), and the auto target read from the
reference's runs (docs/science.md, The auto target). The analysis' per-run stages live here:
the targets (`set_targets`), every run's record (`run_table`) and its ratios to the reference
(`with_run_ratios`). Pure numpy."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Sequence

import numpy as np

from jaxrl_scale.numbers import is_number, or_none
from jaxrl_scale.scaling import io as sio
from jaxrl_scale.scaling import stats
from jaxrl_scale.scaling import time_to_target as ttt
from jaxrl_scale.scaling.io import Run
from jaxrl_scale.scaling.summary import RunStats
from jaxrl_scale.scaling.stats import interval as _ci


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


DEFAULT_TARGET_FRACTION = 0.5


def clipped_update_fraction(run: Run) -> float | None:
    """Share of updates whose pre-clip actor grad norm exceeded max_grad_norm."""
    lim = sio.config_get(run.config, "max_grad_norm")
    _, v = run.train_series("actor_grad_norm")
    if not is_number(lim) or lim <= 0 or not v.size:
        return None
    return float(np.mean(v > lim))


def run_stats(run: Run, target: float, n_boot: int, rng: np.random.Generator, level: float,
              *, block: str | None = None, fit_sigmoid: bool = False) -> RunStats:
    """One run at ``target``, with its identity (config, seed, warm-start ``block``, ...) and
    its bootstrap replicates; with ``fit_sigmoid``, the ScaleRL curve fit too. The ratios to
    its reference are not known yet: `with_run_ratios` sets them."""
    n, s = run.eval_curve()
    se, src, jitter = eval_noise(run)
    measured = [r.get("eval_se") or (float(stats.binomial_se(r["score"], r["eval_n"]))
                                     if is_number(r.get("eval_n")) else None) for r in run.evals]
    measured = [m for m in measured if is_number(m)]
    who = dict(batch=run.batch, n_evals=int(n.size), eval_se_source=src,
               eval_se=float(np.median(measured)) if measured else (
                   float(np.median(se)) if se.size else None),
               curve_jitter_se=jitter, se_used=float(np.median(se)) if se.size else None,
               start_score=float(s[0]) if s.size else None,
               max_score=float(np.max(s)) if s.size else None,
               final_score=float(s[-1]) if s.size else None,
               group=run.group, seed=run.seed, block=block, lr_rule=run.lr_rule,
               algo=run.algo, batch_source=run.batch_source, batch_gen=run.batch_gen,
               gen_batch_ratio=run.gen_batch_ratio, target=target,
               clipped_update_fraction=clipped_update_fraction(run),
               sigmoid=ttt.fit_sigmoid(n, s, target) if fit_sigmoid else None)
    total_t = max((r["time_s"] for r in run.train), default=0.0)
    total_n = max((r["responses"] for r in run.train), default=0.0)
    q_all = total_n / total_t if total_t > 0 else math.nan
    if n.size == 0:
        return RunStats(**who, reached=False, q=or_none(q_all), error="no eval records",
                        N_star_boot=np.full(n_boot, np.inf), q_boot=np.full(n_boot, q_all))
    point, n_reps, fit = stats.bootstrap_crossing(n, s, se, target, n_boot, rng)
    f = stats.block_time_factors(_durations(run), n_boot, rng)
    t_point = float(ttt.time_at_many(run.train, [point])[0])
    t_reps = ttt.time_at_many(run.train, n_reps) * f
    q_reps = np.where(np.isfinite(n_reps), stats.ratio(n_reps, t_reps), q_all / f)
    reached = math.isfinite(point)
    q = point / t_point if reached and t_point > 0 else q_all
    return RunStats(
        **who, N_star=or_none(point), N_star_raw=ttt.n_star(n, s, target), reached=reached,
        N_star_ci=_ci(n_reps, level), q=or_none(q), q_ci=_ci(q_reps, level),
        T=or_none(t_point) if reached else None, q_overall=or_none(q_all),
        responses_total=float(total_n), smoothed_final=float(fit[-1]),
        # N* of a run that did not reach is at least the responses it ran
        censored_at=None if reached else float(total_n),
        frac_replicates_reached=float(np.mean(np.isfinite(n_reps))),
        # the run's own evals: the step-0 eval is shared by every run of a seed
        evals_before_N_star=int(np.sum((n > 0) & (n < point))) if reached else None,
        updates_to_target=or_none(point / run.batch) if run.batch and reached else None,
        N_star_boot=n_reps, q_boot=q_reps, fit_at_evals=fit, se_at_evals=se)


def auto_target(ref_stats: Sequence[RunStats], fraction: float, min_se: float = 3.0
                ) -> tuple[float, dict]:
    """start + max(fraction * (reliably reached - start), min_se * SE): start = mean first
    eval of the reference's seeds, reliably reached = the lowest final value of their monotone
    fits, SE = their median eval SE. The floor keeps a reference that barely learned from
    "reaching" a target that sits in the noise at its first eval."""
    start = float(np.mean([x.start_score for x in ref_stats]))
    reach = float(min(x.smoothed_final for x in ref_stats))
    se = float(np.median([x.se_used for x in ref_stats]))
    t = start + max(fraction * (reach - start), min_se * se)
    return round(t, 4), {"rule": f"start + max({fraction:g} x (lowest final smoothed score of "
                                 f"the reference's seeds - start), {min_se:g} eval SE)",
                         "start": start, "reach": reach, "fraction": fraction, "se": se}


def recorded_target_fraction(sweep_dir: str | None) -> float:
    """The auto target's fraction a study chose (SWEEP_DIR/sweep.json "sweep" ->
    "target_fraction"), so that re-analysing its directory decides at the same target;
    DEFAULT_TARGET_FRACTION for logs without one (other frameworks, older sweeps)."""
    dirs = sio.sweep_dirs(sweep_dir)
    path = os.path.join(dirs[0], sio.SWEEP_FILE) if dirs else None
    if not path or not os.path.isfile(path):
        return DEFAULT_TARGET_FRACTION
    with open(path) as f:
        rec = json.load(f).get("sweep") or {}
    x = rec.get("target_fraction")
    return float(x) if is_number(x) else DEFAULT_TARGET_FRACTION


@dataclasses.dataclass(frozen=True)
class Targets:
    """J* per algorithm (its rule when auto) and, with warm-start blocks, per (algo, block)."""
    by_algo: dict[str, float]
    rules: dict[str, dict]
    by_block: dict[tuple[str, str], float]

    def of(self, run: Run, block: str | None, primary: str) -> float:
        t = self.by_algo.get(run.algo or "?", self.by_algo[primary])
        return self.by_block.get((run.algo or "?", block), t)


def set_targets(refs: dict[str, tuple[str, list[Run]]], blocks: dict[str, str],
                target: float | str, fraction: float, level: float, rng: np.random.Generator
                ) -> Targets:
    """One target per algorithm (each is judged against its own reference) and, when the
    runs start from several warm-starts, one per warm-start block: the same rule on the
    block's own reference runs, as a study from that warm-start alone would set it."""
    by_algo, rules, by_block = {}, {}, {}
    for algo, (name, rs) in refs.items():
        if target == "auto":
            probe = [run_stats(r, math.inf, 1, rng, level) for r in rs]
            by_algo[algo], rules[algo] = auto_target(probe, fraction)
            mine = {b: [p for r, p in zip(rs, probe) if blocks.get(r.name) == b]
                    for b in sorted(set(blocks.values()))}
            per_block = {b: auto_target(m, fraction) for b, m in mine.items() if m}
            by_block.update({(algo, b): t for b, (t, _) in per_block.items()})
            if len(per_block) >= 2:   # the algorithm's J* is their median, not a pooled rule
                med = {k: float(np.median([r[k] for _, r in per_block.values()]))
                       for k in ("start", "reach")}
                by_algo[algo] = round(float(np.median([t for t, _ in per_block.values()])), 4)
                rules[algo] = {**rules[algo], **med,
                               "rule": rules[algo]["rule"] + ", on each warm-start's own "
                               "reference runs (J*, start and reach: their medians)",
                               "per_warm_start": {b: t for b, (t, _) in per_block.items()}}
        else:
            by_algo[algo] = target
    return Targets(by_algo, rules, by_block)


def run_table(runs: Sequence[Run], blocks: dict[str, str], targets: Targets, primary: str,
              n_boot: int, rng: np.random.Generator, level: float, fit_sigmoid: bool
              ) -> dict[str, RunStats]:
    """{run: `run_stats`} of every run at its target (its warm-start block's, else its
    algorithm's, else the ``primary`` algorithm's), in the runs' order: the order of the
    bootstrap draws."""
    return {r.name: run_stats(r, targets.of(r, blocks.get(r.name), primary), n_boot, rng,
                              level, block=blocks.get(r.name), fit_sigmoid=fit_sigmoid)
            for r in runs}


def with_run_ratios(per_run: dict[str, RunStats], configs: dict[str, dict], refs: dict
                    ) -> dict[str, RunStats]:
    """Each run with its r_N, r_q, T/T0 against the point values of its algorithm's
    reference config (``configs``: `configs.config_stats`' dicts)."""
    ref_runs = {z.name for _, rs in refs.values() for z in rs}
    out = {}
    for name, x in per_run.items():
        ref = configs.get(refs.get(x.algo or "?", (None,))[0]) or {}
        r_n = x.N_star / ref["N_star"] if x.reached and ref.get("N_star") else None
        r_q = x.q / ref["q"] if is_number(x.q) and is_number(ref.get("q")) else None
        out[name] = dataclasses.replace(
            x, r_N=r_n, r_q=r_q, is_reference=name in ref_runs,
            T_over_T0=r_n / r_q if is_number(r_n) and is_number(r_q) and r_q else None)
    return out
