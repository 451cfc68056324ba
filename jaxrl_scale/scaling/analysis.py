"""One sweep in, one summary dict out: the numbers behind ``summary.json`` and the report.

Per run: N* from the isotonic (monotone) fit of its eval curve, with a parametric bootstrap
of the eval noise; q = N* / t(N*) with a bootstrap over step durations. Per config (a run name
without its seed): seed means, a hierarchical bootstrap (seeds, then each seed's replicates),
N*, q, r_N, r_q, T/T0 with intervals at ``ci_level`` and a verdict against the reference of
its own algorithm (SCIENCE.md sections 1-4). Then the set of configs not distinguishable from
the fastest, both critical batches, grad-norm slopes, noise scales and curve invariance with
a band derived from the measured eval noise; and, for configs run with asynchronous partial
rollout (gen_batch_ratio k > 1), their q, N* and T against the synchronous twin (section 3).
Verdicts and the fastest set are family-wise over all configs of the sweep
(`scaling.familywise`: Holm over seed-paired, pooled-variance t tests of log T/T0; the t
intervals replace the bootstrap ones as *_ci, which stay as *_ci_boot), with the design's
power (min_detectable_r_N); r_q prefers an interleaved timing pass (`scaling.drift`).
Pure numpy: it never imports JAX.
"""

from __future__ import annotations

import collections
import json
import math
import os
from typing import Any, Sequence

import numpy as np

from jaxrl_scale.scaling import drift as sdrift
from jaxrl_scale.scaling import familywise
from jaxrl_scale.scaling import io as sio
from jaxrl_scale.scaling import lr_bracket
from jaxrl_scale.scaling import noise as snoise
from jaxrl_scale.scaling import stats
from jaxrl_scale.scaling import time_to_target as ttt
from jaxrl_scale.scaling.io import Run
from jaxrl_scale.scaling.throughput import step_costs

SUMMARY_FILE = "summary.json"
VERDICTS = ("faster", "slower", "indistinguishable", "not reached")


class AnalysisError(ValueError):
    """A problem with the inputs that the user must fix; the message names it."""


def parse_target(target: Any) -> float | str:
    """A finite score, or "auto" (chosen from the reference's curves, see `auto_target`)."""
    if isinstance(target, str) and target.strip().lower() == "auto":
        return "auto"
    try:
        t = float(target)
    except (TypeError, ValueError):
        raise AnalysisError(f"target must be a number or 'auto', got {target!r}") from None
    if not math.isfinite(t):
        raise AnalysisError(f"target must be a finite number, got {target!r}")
    return t


def to_jsonable(x: Any) -> Any:
    """Plain JSON: numpy scalars to Python, NaN/inf to None."""
    if isinstance(x, dict):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return to_jsonable(x.tolist())
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    return x


def write_summary(out_dir: str, summary: dict) -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, SUMMARY_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(to_jsonable(summary), f, indent=2, allow_nan=False)
    os.replace(tmp, path)
    return path


def _fin(x) -> bool:
    return x is not None and isinstance(x, (int, float, np.floating)) and math.isfinite(x)


def _or_none(x):
    return float(x) if _fin(x) else None


def _ci(x, level):
    lo, hi = stats.quantile_ci(x, level)
    return [_or_none(lo), _or_none(hi)]


# ----------------------------------------------------------------------------- references


def _base_batch(run: Run) -> float | None:
    b = sio.config_get(run.config, "base_batch")
    return float(b) if _fin(b) and b > 0 else None


def _group_size(run: Run):
    return sio.config_get(run.config, "group_size")


def default_references(groups: dict[str, list[Run]]) -> dict[str, str]:
    """{algo: config}: per algorithm, the config whose batch equals the sweep's base batch
    (``base_batch`` in config.json), preferring lr rule sqrt, synchronous rollout and the most
    common group size; without a base batch, the smallest batch with lr rule sqrt, else the
    smallest batch."""
    by_algo: dict[str, list[str]] = collections.defaultdict(list)
    for g, rs in groups.items():
        if any(r.evals for r in rs):
            by_algo[rs[0].algo or "?"].append(g)
    out = {}
    for algo, names in by_algo.items():
        first = {g: groups[g][0] for g in names}
        bases = [b for b in (_base_batch(r) for r in first.values()) if b]
        common_g = collections.Counter(_group_size(r) for r in first.values()).most_common(1)
        common_g = common_g[0][0] if common_g else None
        pool = [g for g in names if bases and first[g].batch == max(set(bases),
                                                                   key=bases.count)]
        if not pool:
            sqrt = [g for g in names if first[g].lr_rule == "sqrt"]
            pool = sqrt or names
            lo = min(first[g].batch or math.inf for g in pool)
            pool = [g for g in pool if (first[g].batch or math.inf) == lo]
        out[algo] = min(pool, key=lambda g: (first[g].lr_rule != "sqrt",
                                             first[g].gen_batch_ratio != 1,
                                             _group_size(first[g]) != common_g, g))
    return out


def default_reference(runs: Sequence[Run]) -> Run:
    """The first run of the primary algorithm's default reference config."""
    groups = sio.group_runs(list(runs))
    refs = default_references(groups)
    if not refs:
        raise AnalysisError("no run has eval records (records with a 'score' field)")
    return groups[refs[_primary(refs)]][0]


def _primary(refs: dict) -> str:
    return "grpo" if "grpo" in refs else sorted(refs)[0]


def resolve_references(runs: Sequence[Run], reference: str | None) -> dict[str, tuple[str, list[Run]]]:
    """{algo: (reference name, its runs)}. ``reference`` (a run or a config name) overrides
    the default of its own algorithm; a run name selects that run alone."""
    groups = sio.group_runs(list(runs))
    out = {a: (g, groups[g]) for a, g in default_references(groups).items()}
    if reference is None:
        return out
    by_name = {r.name: r for r in runs}
    if reference in groups:
        chosen = (reference, groups[reference])
    elif reference in by_name:
        chosen = (reference, [by_name[reference]])
    else:
        raise AnalysisError(
            f"reference {reference!r} not found; available runs: {sorted(by_name)}; "
            f"config groups: {sorted(groups)}")
    out[chosen[1][0].algo or "?"] = chosen
    return out


def resolve_reference(runs: Sequence[Run], reference: str | None) -> tuple[str, list[Run]]:
    """(name, runs) of the primary algorithm's reference (see `resolve_references`)."""
    refs = resolve_references(runs, reference)
    if reference is not None:
        for name, rs in refs.values():
            if name == reference:
                return name, rs
    return refs[_primary(refs)]


# ----------------------------------------------------------------------------- per run


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
        if _fin(r.get("eval_se")) and r["eval_se"] > 0:
            se[i] = r["eval_se"]
            src.add("eval_se")
        elif _fin(r.get("eval_n")) and r["eval_n"] > 0:
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
                                     if _fin(r.get("eval_n")) else None) for r in run.evals]
    measured = [m for m in measured if _fin(m)]
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
        out.update(N_star=None, N_star_raw=None, reached=False, q=_or_none(q_all), T=None,
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
    out.update(N_star=_or_none(point), N_star_raw=raw, reached=reached,
               N_star_ci=_ci(n_reps, level), q=_or_none(q), q_ci=_ci(q_reps, level),
               T=_or_none(t_point) if reached else None, q_overall=_or_none(q_all),
               responses_total=float(total_n), smoothed_final=float(fit[-1]),
               frac_replicates_reached=float(np.mean(np.isfinite(n_reps))),
               evals_before_N_star=int(np.sum(n < point)) if reached else None,
               updates_to_target=_or_none(point / run.batch) if run.batch and reached else None)
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


# ----------------------------------------------------------------------------- per config


def _config_reps(names: list[str], reps: dict, rng) -> tuple[np.ndarray, np.ndarray]:
    """Replicates of the config's mean N* and mean q over its K seeds: seeds resampled with
    replacement (the same draws for both), each contributing its own replicate b."""
    N = np.stack([reps[n]["N"] for n in names])
    Q = np.stack([reps[n]["q"] for n in names])
    K, B = N.shape
    if K == 1:
        return N[0], Q[0]
    pick = rng.integers(0, K, size=(B, K))
    cols = np.arange(B)[:, None]
    return N[pick, cols].mean(axis=1), Q[pick, cols].mean(axis=1)


def _verdict(reached: bool, ci) -> str:
    if not reached:
        return "not reached"
    lo, hi = ci
    if hi is not None and hi < 1:
        return "faster"
    if lo is not None and lo > 1:
        return "slower"
    return "indistinguishable"


def config_stats(groups: dict[str, list[Run]], per_run: dict, reps: dict, refs: dict,
                 rng, level: float) -> tuple[dict, dict]:
    """Per config: seeds, N*, q, r_N, r_q, T/T0 with intervals and a verdict."""
    out, creps = {}, {}
    for g, rs in groups.items():
        names = [r.name for r in rs]
        xs = [per_run[n] for n in names]
        n_reached = sum(bool(x["reached"]) for x in xs)
        all_reached = n_reached == len(xs)
        N_b, q_b = _config_reps(names, reps, rng)
        N = float(np.mean([x["N_star"] for x in xs])) if all_reached else math.inf
        q = float(np.mean([x["q"] for x in xs if _fin(x["q"])])) if any(
            _fin(x["q"]) for x in xs) else math.nan
        creps[g] = {"N": N_b, "q": q_b, "T": stats.ratio(N_b, q_b)}
        st = {"algo": rs[0].algo, "batch": rs[0].batch, "batch_gen": rs[0].batch_gen,
              "gen_batch_ratio": rs[0].gen_batch_ratio, "lr_rule": rs[0].lr_rule,
              "group_size": _group_size(rs[0]),
              "seeds": len(xs), "seeds_reached": n_reached, "runs": names,
              "reached": all_reached, "N_star": _or_none(N), "N_star_ci": _ci(N_b, level),
              "q": _or_none(q), "q_ci": _ci(q_b, level),
              "T": _or_none(N / q) if all_reached and q > 0 else None,
              "N_star_reached_mean": _or_none(np.mean([x["N_star"] for x in xs
                                                       if x["reached"]])) if n_reached else None}
        for k in ("N_star", "q"):
            vals = [x[k] for x in xs if x["reached"] and _fin(x[k])]
            st[k + "_std"] = float(np.std(vals)) if len(vals) > 1 else None
        out[g] = st
    for algo, (ref_name, ref_runs) in refs.items():
        rg = ref_runs[0].group or ref_runs[0].name
        if ref_name in out:
            rst, rrep = out[ref_name], creps[ref_name]
        else:  # a single run as reference
            x = per_run[ref_name]
            rst = {"N_star": x["N_star"], "q": x["q"], "reached": x["reached"]}
            rrep = {"N": reps[ref_name]["N"], "q": reps[ref_name]["q"]}
        ref_ok = bool(rst["reached"])
        for g, st in out.items():
            if (st["algo"] or "?") != algo:
                continue
            st["reference"] = ref_name
            st["is_reference"] = g == ref_name or (g == rg and len(ref_runs) == len(st["runs"]))
            if not ref_ok:
                st.update(r_N=None, r_q=None, T_over_T0=None, r_N_ci=[None, None],
                          r_q_ci=[None, None], T_over_T0_ci=[None, None],
                          verdict="not reached")
                continue
            cr = creps[g]
            same = st["is_reference"]
            rn_b = np.ones_like(cr["N"]) if same else stats.ratio(cr["N"], rrep["N"])
            rq_b = np.ones_like(cr["q"]) if same else stats.ratio(cr["q"], rrep["q"])
            tt_b = stats.ratio(rn_b, rq_b)
            r_n = st["N_star"] / rst["N_star"] if st["reached"] and rst["N_star"] else None
            r_q = st["q"] / rst["q"] if _fin(st["q"]) and rst["q"] else None
            st.update(r_N=_or_none(r_n), r_q=_or_none(r_q),
                      T_over_T0=_or_none(r_n / r_q) if _fin(r_n) and _fin(r_q) else None,
                      r_N_ci=_ci(rn_b, level), r_q_ci=_ci(rq_b, level),
                      T_over_T0_ci=_ci(tt_b, level))
            st["verdict"] = _verdict(st["reached"], st["T_over_T0_ci"])
            if st["batch"] and rst.get("batch"):
                st["updates_ratio"] = _or_none(r_n * rst["batch"] / st["batch"]) if _fin(
                    r_n) else None
            creps[g]["r_N"] = rn_b
    return out, creps


def best_sets(configs: dict, creps: dict, level: float) -> dict[str, list[str]]:
    """Per algorithm: configs whose time to target is not distinguishable from the fastest's
    (the interval of T / T_fastest reaches 1). Empty when nothing reached the target."""
    out = {}
    for algo in sorted({st["algo"] or "?" for st in configs.values()}):
        ok = {g: st for g, st in configs.items() if (st["algo"] or "?") == algo
              and st["reached"] and _fin(st["T"])}
        if not ok:
            out[algo] = []
            continue
        fastest = min(ok, key=lambda g: (ok[g]["T"], g))
        keep = []
        for g in ok:
            lo, _ = stats.quantile_ci(stats.ratio(creps[g]["T"], creps[fastest]["T"]), level)
            if g == fastest or not (lo > 1):
                keep.append(g)
        out[algo] = sorted(keep, key=lambda g: (ok[g]["T"], g))
    return out


def critical_training_batch(configs: dict, ref: dict, tolerance: float) -> dict:
    """Largest B such that every measured B' <= B (reference's algo and lr rule) has the
    upper end of r_N's interval <= 1 + tolerance; and the smallest B where a sample cost is
    detected (lower end > 1 + tolerance, or the target not reached within a budget that
    already exceeds (1 + tolerance) x N0*). Configs with the reference's gen_batch_ratio."""
    algo, rule, k = ref["algo"], ref["lr_rule"], ref.get("gen_batch_ratio", 1)
    # The reference's rollout only: partial rollout changes learning per response (stale
    # tokens), and is compared with its synchronous twin in `partial_rollout` instead.
    pts = sorted(((st["batch"], g, st) for g, st in configs.items()
                  if st["algo"] == algo and st["lr_rule"] == rule and st["batch"]
                  and st.get("gen_batch_ratio", 1) == k),
                 key=lambda p: (p[0], p[1]))
    by_b: dict[float, list] = collections.defaultdict(list)
    for b, g, st in pts:
        by_b[b].append((g, st))
    ok_upto, detected = None, None
    lim = 1 + tolerance
    chain = True
    for b in sorted(by_b):
        oks = []
        for g, st in by_b[b]:
            hi = st.get("r_N_ci", [None, None])[1]
            oks.append(bool(st["reached"] and hi is not None and hi <= lim))
            lo = st.get("r_N_ci", [None, None])[0]
            if detected is None and st["reached"] and lo is not None and lo > lim:
                detected = b
            if (detected is None and not st["reached"] and ref.get("N_star")
                    and st.get("responses_min", 0) > lim * ref["N_star_ci"][1]):
                detected = b
        chain = chain and all(oks)
        if chain:
            ok_upto = b
    return {"batch": ok_upto, "cost_detected_at": detected, "tolerance": tolerance,
            "lr_rule": rule, "algo": algo,
            "points": [{"config": g, "batch": b, "r_N": st.get("r_N"),
                        "r_N_ci": st.get("r_N_ci"), "reached": st["reached"]}
                       for b, g, st in pts]}


def gen_seconds(run: Run, cost: dict) -> float | None:
    """Seconds to generate B_gen responses with B_gen in flight: the collection time per update
    times B_gen / responses generated per update. Synchronous rollout generates B_gen = B_train
    per update (factor 1); partial rollout keeps k * B_train in flight but harvests about
    B_train per update, so an update's collection is about 1/k of one t_gen(B_gen)."""
    t, b_gen, made = cost["collection_s_per_step"], run.batch_gen or run.batch, \
        cost.get("generated_per_step")
    if not (_fin(t) and t > 0 and b_gen):
        return None
    return t * b_gen / made if _fin(made) and made > 0 else t


def step_time_model(runs: Sequence[Run], costs: dict, n_boot: int, rng, level: float,
                    min_gain: float, ref_batch: float | None) -> dict:
    """Fits t_gen = d0 + d1 * B_gen (`gen_seconds`: synchronous and partial-rollout runs
    share one curve) and t_train = c + gamma * B_train over the runs (per-run median step
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
               batch=_or_none(cgb), batch_ci=_ci(cgb_b, level),
               within_grid=bool(_fin(cgb) and b.min() <= cgb <= b.max()),
               rule=f"B_gen beyond which a doubling adds < {min_gain:.0%} throughput: "
                    f"(1 - g) d0 / (2 g d1)")
    tt = np.array([x if _fin(x) else np.nan for x in tt], float)
    ok = np.isfinite(tt)
    if np.unique(bt[ok]).size >= 2:   # the update sees B_train responses, whatever B_gen
        c, gamma = stats.fit_line(bt[ok], tt[ok])
        tboot = stats.bootstrap_line(bt[ok], tt[ok], np.array(names)[ok], n_boot, rng)
        train = {"c": c, "gamma": gamma, "c_ci": _ci(tboot[:, 0], level),
                 "gamma_ci": _ci(tboot[:, 1], level)}
        if ref_batch:
            def cap(d0_, d1_, c_, g_):
                per_resp = d1_ + g_
                return (d0_ + c_ + per_resp * ref_batch) / ref_batch / per_resp
            train["r_q_cap"] = _or_none(cap(d0, d1, c, gamma))
            with np.errstate(divide="ignore", invalid="ignore"):
                caps = cap(boot[:, 0], boot[:, 1], tboot[:, 0], tboot[:, 1])
            train["r_q_cap_ci"] = _ci(caps, level)
            share = gamma * ref_batch / (d0 + d1 * ref_batch + c + gamma * ref_batch)
            train["update_share_at_reference"] = _or_none(share)
        out["train_fit"] = train
    return out


def grad_norm_slopes(runs: Sequence[Run], configs: dict, ref: dict, n_boot: int, rng,
                     level: float, flat_slope: float) -> dict:
    """log-log slope of the median actor / critic grad norm vs batch (reference's algo and lr
    rule and gen_batch_ratio, over the response range every such run covers), with an interval
    over runs."""
    pool = [r for r in runs if r.algo == ref["algo"] and r.lr_rule == ref["lr_rule"] and r.batch
            and r.gen_batch_ratio == ref.get("gen_batch_ratio", 1)]
    out = {}
    for key in ("actor_grad_norm", "critic_grad_norm"):
        ends = [r.train_series(key)[0] for r in pool]
        ends = [e.max() for e in ends if e.size]
        if not ends:
            continue
        n_common = float(min(ends))
        pts = []
        for r in pool:
            n, v = r.train_series(key)
            v = v[n <= n_common]
            if v.size and np.median(v) > 0:
                pts.append((r.batch, float(np.median(v)), r.name))
        if len({p[0] for p in pts}) < 2:
            continue
        b, v, names = zip(*pts)
        lb, lv = np.log(b), np.log(v)
        _, slope = stats.fit_line(lb, lv)
        boot = stats.bootstrap_line(lb, lv, names, n_boot, rng)
        by_b = collections.defaultdict(list)
        for bi, vi in zip(b, v):
            by_b[bi].append(vi)
        bs = sorted(by_b)
        means = [float(np.mean(by_b[x])) for x in bs]
        out[key] = {"batches": bs, "norms": means,
                    "norm_ranges": [[float(min(by_b[x])), float(max(by_b[x]))] for x in bs],
                    "slope": slope, "slope_ci": _ci(boot[:, 1], level),
                    "flattens_after": snoise.flattening_batch(bs, means, flat_slope),
                    "flat_threshold": flat_slope, "lr_rule": ref["lr_rule"],
                    "algo": ref["algo"], "responses_range": [0.0, n_common]}
    return out


def _mean_curve(runs: Sequence[Run], reps: dict, grid: np.ndarray):
    """Seed-mean curve on ``grid`` and the SE of each eval of that mean."""
    curves = [np.interp(grid, *r.eval_curve()) for r in runs]
    se = np.median(np.concatenate([reps[r.name]["se"] for r in runs]))
    return np.mean(curves, axis=0), se / math.sqrt(len(runs))


def invariance(cfg_runs: list[Run], ref_runs: list[Run], reps: dict, rng, level: float,
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
    j, se = _mean_curve(cfg_runs, reps, grid)
    j0, se0 = _mean_curve(ref_runs, reps, grid)
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


def sync_twin(g: str, st: dict, configs: dict) -> str | None:
    """The k = 1 config that differs from config g (k > 1) only in its rollout: same algo,
    B_train, G and lr rule; the one named like g without its ``_k`` tag when several."""
    if st.get("gen_batch_ratio", 1) == 1:
        return None
    key = lambda x: (x["algo"], x["batch"], x["group_size"], x["lr_rule"])
    twins = [h for h, x in configs.items() if x.get("gen_batch_ratio", 1) == 1
             and key(x) == key(st)]
    if sio.strip_ratio(g) in twins:
        return sio.strip_ratio(g)
    return twins[0] if len(twins) == 1 else None


def partial_rollout(configs: dict, creps: dict, groups: dict, reps: dict, rng,
                    level: float) -> list[dict]:
    """Partial rollout (B_gen = k * B_train) against its synchronous twin, per config with
    k > 1: q, N* and T ratios (k-run / sync run) with the configs' seed-hierarchical bootstrap
    replicates, a verdict from the T ratio's interval (as `config_stats` judges T/T0), the
    learning curves against each other (stale tokens may cost samples) and the rollout
    records' means."""
    rows = []
    for g, st in sorted(configs.items()):
        h = sync_twin(g, st, configs)
        if h is None:
            continue
        x0, a, b = configs[h], creps[g], creps[h]
        both = bool(st["reached"] and x0["reached"])
        point = lambda key: _or_none(stats.ratio(st[key], x0[key])) if _fin(st[key]) and _fin(
            x0[key]) else None
        t_ci = _ci(stats.ratio(a["T"], b["T"]), level)
        rows.append({
            "config": g, "sync_config": h, "algo": st["algo"], "batch": st["batch"],
            "batch_gen": st["batch_gen"], "gen_batch_ratio": st["gen_batch_ratio"],
            "reached": both, "q_ratio": point("q"),
            "q_ratio_ci": _ci(stats.ratio(a["q"], b["q"]), level),
            "r_N": point("N_star") if both else None,
            "r_N_ci": _ci(stats.ratio(a["N"], b["N"]), level),
            "T_ratio": point("T") if both else None,
            "T_ratio_ci": t_ci, "verdict": _verdict(both, t_ci),
            "curves": invariance(groups[g], groups[h], reps, rng, level),
            **{k: st.get(k) for k in ROLLOUT_KEYS}})
    return rows


def clip_fraction(run: Run) -> float | None:
    """Share of updates whose pre-clip actor grad norm exceeded max_grad_norm."""
    lim = sio.config_get(run.config, "max_grad_norm")
    _, v = run.train_series("actor_grad_norm")
    if not _fin(lim) or lim <= 0 or not v.size:
        return None
    return float(np.mean(v > lim))


# ----------------------------------------------------------------------------- the summary


def analyze_runs(runs: Sequence[Run], target: Any = "auto", reference: str | None = None,
                 tolerance: float = 0.25, fit_sigmoid: bool = False, *,
                 skipped: Sequence[dict] = (), ci_level: float = stats.CI_LEVEL,
                 n_boot: int = 1000, seed: int = 0, target_fraction: float = 0.5,
                 min_gain: float = 0.10, flat_slope: float = -0.25,
                 timing: Sequence[dict] | None = None) -> dict:
    """The summary dict for already-loaded runs (see :func:`analyze_sweep`). ``timing``: the
    entries of an interleaved timing pass (`experiment.timing.time_batches`), which r_q then
    prefers over the in-run step times (`scaling.drift`)."""
    target = parse_target(target)
    runs = list(runs)
    if not runs:
        raise AnalysisError("no runs to analyse")
    names = [r.name for r in runs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise AnalysisError(f"duplicate run names {dup}: rename the run directories or CSVs")
    if not 0 < ci_level < 1:
        raise AnalysisError(f"ci_level must be in (0, 1), got {ci_level}")
    warnings = [f"{r.name}: {w}" for r in runs for w in r.warnings]
    if not any(r.evals for r in runs):
        raise AnalysisError(f"no run has eval records (records with a 'score' field): {names}")
    for r in runs:
        if not r.evals:
            warnings.append(f"{r.name}: no eval records (no 'score' field); reported as not "
                            "reached")
        if not r.batch:
            warnings.append(f"{r.name}: batch per update unknown (no config.json batch keys "
                            "and no responses increments)")
    refs = resolve_references(runs, reference)
    for algo, (name, rs) in refs.items():
        missing = [r.name for r in rs if not r.evals]
        if missing:
            raise AnalysisError(f"reference {name!r} has runs without eval records: {missing}")
    rng = np.random.default_rng(seed)
    groups = sio.group_runs(runs)

    # Targets: one per algorithm (each is judged against its own reference).
    targets, target_rule = {}, {}
    for algo, (name, rs) in refs.items():
        if target == "auto":
            probe = [run_stats(r, math.inf, 1, rng, ci_level)[0] for r in rs]
            targets[algo], target_rule[algo] = auto_target(probe, target_fraction)
        else:
            targets[algo] = target
    per_run, reps = {}, {}
    for r in runs:
        t = targets.get(r.algo or "?", targets[_primary(refs)])
        per_run[r.name], reps[r.name] = run_stats(r, t, n_boot, rng, ci_level)
        per_run[r.name].update(group=r.group, seed=r.seed, lr_rule=r.lr_rule, algo=r.algo,
                               batch_source=r.batch_source, batch_gen=r.batch_gen,
                               gen_batch_ratio=r.gen_batch_ratio,
                               target=t, clip_fraction=clip_fraction(r))
    configs, creps = config_stats(groups, per_run, reps, refs, rng, ci_level)
    costs = {r.name: step_costs(r) for r in runs}
    for g, rs in groups.items():
        st = configs[g]
        st["responses_min"] = min(per_run[r.name].get("responses_total", 0.0) for r in rs)
        for k in ("collection_s_per_step", "train_s_per_step", "gen_throughput"):
            v = [costs[r.name][k] for r in rs if _fin(costs[r.name][k])]
            st[k] = float(np.mean(v)) if v else None
        cf = [per_run[r.name]["clip_fraction"] for r in rs if _fin(per_run[r.name]["clip_fraction"])]
        st["clip_fraction"] = float(np.mean(cf)) if cf else None
        st.update(rollout_means(rs))
        for who in ("actor", "critic"):
            ns = [snoise.noise_scale_from_run(r, who) for r in rs]
            bs = [z["b_simple"] for z in ns if z and _fin(z["b_simple"])]
            st[f"{who}_b_simple"] = float(np.mean(bs)) if bs else None
            st[f"{who}_b_simple_range"] = [min(bs), max(bs)] if bs else None
        if fit_sigmoid:
            fits = [ttt.fit_sigmoid(*r.eval_curve(), per_run[r.name]["target"]) for r in rs]
            for r, fz in zip(rs, fits):
                per_run[r.name]["sigmoid"] = fz
            a = [fz["A"] for fz in fits if fz]
            st["sigmoid_A"] = float(np.mean(a)) if a else None

    # Per-run ratios against the point values of their algorithm's reference config.
    for r in runs:
        x = per_run[r.name]
        ref = configs.get(refs.get(r.algo or "?", (None,))[0]) or {}
        r_n = x["N_star"] / ref["N_star"] if x["reached"] and ref.get("N_star") else None
        r_q = x["q"] / ref["q"] if _fin(x["q"]) and _fin(ref.get("q")) else None
        x.update(r_N=r_n, r_q=r_q,
                 T_over_T0=r_n / r_q if _fin(r_n) and _fin(r_q) and r_q else None,
                 is_reference=r.name in {z.name for _, rs in refs.values() for z in rs})

    drift_info, timing_offsets = sdrift.interleaved_r_q(timing, configs, refs, ci_level)
    # Family-wise verdicts and fastest sets (scaling.familywise): they replace the per-config
    # bootstrap verdicts; the bootstrap intervals stay as *_ci_boot.
    fw = familywise.sweep_tests(configs, per_run, creps,
                                {a: n for a, (n, _) in refs.items()}, ci_level,
                                offsets=timing_offsets)
    for g, f in fw["configs"].items():
        familywise.merge_into(configs[g], f)
    best = fw["best_sets"]
    primary = _primary(refs)
    per_algo = {}
    for algo, (name, rs) in refs.items():
        ref = configs.get(name) or {"algo": rs[0].algo, "lr_rule": rs[0].lr_rule,
                                    "batch": rs[0].batch, **per_run[name]}
        ref_se = float(np.median([per_run[z.name]["eval_se"] for z in rs]))
        jit = [per_run[z.name]["curve_jitter_se"] for z in rs if _fin(per_run[z.name]
                                                                      ["curve_jitter_se"])]
        start = float(np.mean([per_run[z.name]["start_score"] for z in rs]))
        inv = {}
        for g, grs in groups.items():
            if (grs[0].algo or "?") == algo and g != name:
                inv[g] = invariance(grs, rs, reps, rng, ci_level)
                configs[g]["invariance"] = inv[g]
        per_algo[algo] = {
            "reference_config": name, "reference_runs": [z.name for z in rs],
            "target": targets[algo], "target_rule": target_rule.get(algo),
            "eval_se": ref_se, "eval_se_source": per_run[rs[0].name]["eval_se_source"],
            "curve_jitter_se": float(np.median(jit)) if jit else None,
            "start_score": start,
            "signal_to_noise": (targets[algo] - start) / ref_se if ref_se > 0 else None,
            "reference_reached": bool(ref.get("reached")),
            "reference_best_smoothed": max(per_run[z.name].get("smoothed_final") or -math.inf
                                           for z in rs),
            "critical_training_batch": critical_training_batch(configs, ref, tolerance),
            "grad_norm": grad_norm_slopes(runs, configs, ref, n_boot, rng, ci_level,
                                          flat_slope),
            "best_set": best.get(algo, []),
            # Step costs differ by algorithm (PPO also runs a critic): one fit each.
            "critical_generation_batch": step_time_model(
                [r for r in runs if (r.algo or "?") == algo], costs, n_boot, rng, ci_level,
                min_gain, ref.get("batch")),
        }
    # Last: its bootstrap draws must not move the numbers above.
    partial = partial_rollout(configs, creps, groups, reps, rng, ci_level)
    p = per_algo[primary]
    cgb = p["critical_generation_batch"]
    return {
        "ci_level": ci_level,
        "target": p["target"],
        "targets": targets,
        "target_rule": p["target_rule"],
        "eval_se": p["eval_se"],
        "eval_se_source": p["eval_se_source"],
        "curve_jitter_se": p["curve_jitter_se"],
        "signal_to_noise": p["signal_to_noise"],
        "start_score": p["start_score"],
        "reference": p["reference_config"],
        "reference_config": p["reference_config"],
        "reference_configs": {a: v["reference_config"] for a, v in per_algo.items()},
        "reference_runs": p["reference_runs"],
        "reference_reached": p["reference_reached"],
        "primary_algo": primary,
        "algos": per_algo,
        "runs": per_run,
        "configs": configs,
        "best_set": p["best_set"],
        "best": p["best_set"],
        "critical_training_batch": p["critical_training_batch"],
        "critical_generation_batch": cgb,
        "grad_norm": p["grad_norm"],
        "partial_rollout": partial,
        "tolerance": tolerance,
        "familywise": {k: fw[k] for k in ("families", "n_tests", "alpha", "margin", "method")},
        **familywise.power_fields(fw, ci_level, primary),
        "drift": drift_info,
        "n_boot": n_boot,
        "skipped": list(skipped),
        "warnings": warnings,
    }


def analyze_sweep(sweep_dir: str | None, target: Any = "auto", reference: str | None = None,
                  tolerance: float = 0.25, fit_sigmoid: bool = False, *,
                  extra_runs: Sequence[Run] = (), **kwargs) -> dict:
    """Summary dict of a sweep directory (plus ``extra_runs``, e.g. CSV imports).

    Keys: the uncertainty contract of docs/API.md (ci_level, eval_se, signal_to_noise,
    reference_config(s), configs {N_star(_ci), q(_ci), r_N(_ci), r_q(_ci), T_over_T0(_ci),
    verdict, ...}, best_set, critical_training_batch, critical_generation_batch) plus runs
    {name: {N_star, q, r_N, r_q, T_over_T0, reached, ...}}, grad-norm slopes, partial_rollout
    [{config, sync_config, gen_batch_ratio, q_ratio(_ci), r_N(_ci), T_ratio(_ci), verdict,
    ...}] (empty without k > 1 configs), skipped dirs and warnings. Raises AnalysisError naming
    the problem.
    """
    target = parse_target(target)
    runs, skipped = [], []
    if sweep_dir is not None:
        try:
            sweep = sio.read_sweep(sweep_dir)
        except FileNotFoundError as e:
            raise AnalysisError(str(e)) from None
        runs, skipped = sweep.runs, sweep.skipped
    runs = runs + list(extra_runs)
    if not runs:
        detail = "; ".join(f"{s['dir']}: {s['reason']}" for s in skipped) or "it is empty"
        raise AnalysisError(f"no runs in {sweep_dir!r} (a run is a subdirectory with "
                            f"{sio.METRICS_FILE}); {detail}")
    if sweep_dir is not None and "timing" not in kwargs:
        kwargs["timing"] = sdrift.read_timing(sweep_dir)
    summary = analyze_runs(runs, target, reference, tolerance, fit_sigmoid,
                           skipped=skipped, **kwargs)
    summary["sweep_dir"] = sweep_dir
    tuning = lr_bracket.read_lr_tuning(sweep_dir)
    if tuning:   # issue 27 item 1: the primary algorithm's record, and all of them
        summary["lr_tuning"] = tuning.get(summary["primary_algo"]) or next(iter(tuning.values()))
        summary["lr_tuning_by_algo"] = tuning
    return summary
