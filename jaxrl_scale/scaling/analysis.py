"""One sweep in, one summary dict out: the numbers behind ``summary.json`` and the report.

``analyze_sweep`` reads every run of a sweep directory, picks the reference, computes
N*, q, r_N, r_q, T/T0 per run (SCIENCE.md section 1), seed means, the best config, both
critical batches (section 4), the grad-norm slope (section 2) and, when logged, the noise
scale (section 5). Pure numpy: it never imports JAX.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Sequence

import numpy as np

from jaxrl_scale.scaling import io as sio
from jaxrl_scale.scaling import noise as snoise
from jaxrl_scale.scaling.throughput import (critical_generation_batch, step_costs,
                                            throughput_gains)
from jaxrl_scale.scaling import time_to_target as ttt
from jaxrl_scale.scaling.io import Run

SUMMARY_FILE = "summary.json"


class AnalysisError(ValueError):
    """A problem with the inputs that the user must fix; the message names it."""


def parse_target(target: Any) -> float:
    try:
        t = float(target)
    except (TypeError, ValueError):
        raise AnalysisError(f"target must be a number, got {target!r}") from None
    if not math.isfinite(t):
        raise AnalysisError(f"target must be a finite number, got {target!r}")
    return t


def default_reference(runs: Sequence[Run]) -> Run:
    """Smallest batch with lr rule sqrt, else smallest batch (ties: by name). Runs with eval
    records are preferred."""
    pool = [r for r in runs if r.evals] or list(runs)
    sqrt = [r for r in pool if r.lr_rule == "sqrt"]
    pool = sqrt or pool
    return min(pool, key=lambda r: (r.batch if r.batch else math.inf, r.group, r.name))


def resolve_reference(runs: Sequence[Run], reference: str | None) -> tuple[str, list[Run]]:
    """(reference name, its runs). A run name selects that run; a config name selects all its
    seeds (their mean N* and q are the reference)."""
    groups = sio.group_runs(list(runs))
    if reference is None:
        r = default_reference(runs)
        members = groups[r.group or r.name]
        return (r.group if len(members) > 1 else r.name), members
    by_name = {r.name: r for r in runs}
    if reference in by_name:
        return reference, [by_name[reference]]
    if reference in groups:
        return reference, groups[reference]
    raise AnalysisError(
        f"reference {reference!r} not found; available runs: {sorted(by_name)}; "
        f"config groups: {sorted(groups)}")


def _median_in_range(run: Run, key: str, n_max: float | None) -> float | None:
    n, v = run.train_series(key)
    if n_max is not None:
        v = v[n <= n_max]
    return float(np.median(v)) if v.size else None


def _overall_q(run: Run) -> float | None:
    """Retained responses per second over the whole run."""
    n, _ = run.train_series("time_s")
    return ttt.throughput(run.train, float(n.max())) if n.size else None


def _mean(xs):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return float(np.mean(xs)) if xs else None


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
    with open(path, "w") as f:
        json.dump(to_jsonable(summary), f, indent=2, allow_nan=False)
    return path


def analyze_runs(runs: Sequence[Run], target: float, reference: str | None = None,
                 tolerance: float = 0.1, fit_sigmoid: bool = False, *,
                 skipped: Sequence[dict] = (), band: float | None = None,
                 min_gain: float = 0.10, flat_slope: float = -0.25) -> dict:
    """The summary dict for already-loaded runs (see :func:`analyze_sweep`)."""
    target = parse_target(target)
    runs = list(runs)
    if not runs:
        raise AnalysisError("no runs to analyse")
    names = [r.name for r in runs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise AnalysisError(f"duplicate run names {dup}: rename the run directories or CSVs")
    warnings = [f"{r.name}: {w}" for r in runs for w in r.warnings]
    no_eval = [r.name for r in runs if not r.evals]
    if len(no_eval) == len(runs):
        raise AnalysisError(f"no run has eval records (records with a 'score' field): {no_eval}")
    for n in no_eval:
        warnings.append(f"{n}: no eval records (no 'score' field); reported as not reached")
    no_batch = [r.name for r in runs if not r.batch]
    for n in no_batch:
        warnings.append(f"{n}: batch per update unknown (no config.json batch keys and no "
                        "responses increments)")

    ref_name, ref_runs = resolve_reference(runs, reference)
    missing = [r.name for r in ref_runs if not r.evals]
    if missing:
        raise AnalysisError(f"reference {ref_name!r} has runs without eval records: {missing}")
    try:
        per_run = ttt.compare(runs, ref_runs, target)
    except ValueError as e:
        raise AnalysisError(str(e)) from None

    # Grad norms are compared over the response range every run covers.
    ends = [r.train_series("actor_grad_norm")[0] for r in runs]
    ends = [n.max() for n in ends if n.size]
    n_common = float(min(ends)) if ends else None

    ref0 = ref_runs[0]
    ref_names = {r.name for r in ref_runs}
    for r in runs:
        x = per_run[r.name]
        x.update({"group": r.group, "seed": r.seed, "lr_rule": r.lr_rule, "algo": r.algo,
                  "batch_source": r.batch_source, "batch_gen": r.batch_gen,
                  "is_reference": r.name in ref_names})
        x.update(step_costs(r))
        x["actor_grad_norm"] = _median_in_range(r, "actor_grad_norm", n_common)
        x["critic_grad_norm"] = _median_in_range(r, "critic_grad_norm", n_common)
        x["noise"] = snoise.noise_scale_from_run(r)
        if r is not ref0:
            x["invariance"] = ttt.invariance(r, ref0, band=band)
        if fit_sigmoid:
            n, s = r.eval_curve()
            x["sigmoid"] = ttt.fit_sigmoid(n, s, target)
        if not r.evals:
            x["error"] = "no eval records"

    groups_runs = sio.group_runs(runs)
    groups = ttt.seed_stats(per_run, {g: [r.name for r in rs] for g, rs in groups_runs.items()})
    for g, rs in groups_runs.items():
        groups[g].update({
            "batch": _mean([r.batch for r in rs]),
            "batch_gen": _mean([r.batch_gen for r in rs]),
            "lr_rule": rs[0].lr_rule, "algo": rs[0].algo,
            "gen_throughput": _mean([per_run[r.name]["gen_throughput"] for r in rs]),
            "collection_s_per_step": _mean([per_run[r.name]["collection_s_per_step"] for r in rs]),
            "actor_grad_norm": _mean([per_run[r.name]["actor_grad_norm"] for r in rs]),
            "critic_grad_norm": _mean([per_run[r.name]["critic_grad_norm"] for r in rs]),
        })
        if fit_sigmoid:
            groups[g]["sigmoid_A"] = _mean([(per_run[r.name].get("sigmoid") or {}).get("A")
                                            for r in rs])

    best_group = ttt.best_config({g: st for g, st in groups.items() if st["reached"]})

    # Critical training batch: same lr rule (and algo) as the reference, seed means.
    ref_rule, ref_algo = ref0.lr_rule, ref0.algo
    same_rule = {g: st for g, st in groups.items()
                 if st["lr_rule"] == ref_rule and st["algo"] == ref_algo}
    ctb_points = sorted(({"group": g, "batch": st["batch"], "r_N": st["r_N"],
                          "reached": st["reached"]} for g, st in same_rule.items()
                         if st["batch"]), key=lambda p: p["batch"])
    ctb = {"batch": ttt.critical_training_batch(
               [p for p in ctb_points if p["reached"]], tolerance),
           "lr_rule": ref_rule, "algo": ref_algo, "tolerance": tolerance, "points": ctb_points}

    # Critical generation batch: generation throughput per generation batch (all lr rules:
    # throughput is a system property), else end-to-end q.
    use_gen = all(st["gen_throughput"] is not None for st in groups.values())
    by_b: dict[float, list[float]] = {}
    for g, st in groups.items():
        b = st["batch_gen"] or st["batch"]
        if use_gen:
            tp = st["gen_throughput"]
        else:
            tp = _mean([_overall_q(rr) for rr in groups_runs[g]])
        if b and tp:
            by_b.setdefault(float(b), []).append(tp)
    cgb_b = sorted(by_b)
    cgb_tp = [float(np.mean(by_b[b])) for b in cgb_b]
    gains = throughput_gains(cgb_b, cgb_tp).tolist() if len(cgb_b) >= 2 else []
    cgb = {"batch": critical_generation_batch(cgb_b, cgb_tp, min_gain) if gains else None,
           "min_gain": min_gain,
           "metric": "gen_throughput" if use_gen else "q_end_to_end",
           "batch_kind": "batch_gen" if any(st["batch_gen"] for st in groups.values())
           else "batch_train",
           "points": [{"batch": b, "throughput": tp, "gain_per_doubling": (gains + [None])[i]}
                      for i, (b, tp) in enumerate(zip(cgb_b, cgb_tp))]}

    grad = {}
    for key in ("actor_grad_norm", "critic_grad_norm"):
        pts = sorted((st["batch"], st[key]) for st in same_rule.values()
                     if st["batch"] and st[key])
        if len(pts) >= 2:
            b, v = zip(*pts)
            grad[key] = {"batches": list(b), "norms": list(v),
                         "slope": snoise.loglog_slope(b, v),
                         "flattens_after": snoise.flattening_batch(b, v, flat_slope),
                         "flat_threshold": flat_slope, "lr_rule": ref_rule,
                         "responses_range": [0.0, n_common]}

    noise = None
    ref_noise = [per_run[r.name]["noise"] for r in ref_runs if per_run[r.name]["noise"]]
    if ref_noise and ref_noise[0]["b_simple"]:
        bs = _mean([z["b_simple"] for z in ref_noise])
        b0 = ref0.batch
        noise = {"reference_b_simple": bs,
                 "predicted_r_N": {g: snoise.predicted_r_n(st["batch"], b0, bs)
                                   for g, st in groups.items() if st["batch"] and b0}}

    return {
        "reference": ref_name,
        "target": target,
        "runs": per_run,
        "best": ttt.best_config(per_run),
        "best_group": best_group,
        "reference_runs": [r.name for r in ref_runs],
        "tolerance": tolerance,
        "groups": groups,
        "critical_training_batch": ctb,
        "critical_generation_batch": cgb,
        "grad_norm": grad,
        "noise": noise,
        "skipped": list(skipped),
        "warnings": warnings,
    }


def analyze_sweep(sweep_dir: str | None, target: float, reference: str | None = None,
                  tolerance: float = 0.1, fit_sigmoid: bool = False, *,
                  extra_runs: Sequence[Run] = (), **kwargs) -> dict:
    """Summary dict of a sweep directory (plus ``extra_runs``, e.g. CSV imports).

    Keys: reference, target, runs {name: {N_star, q, r_N, r_q, T_over_T0, reached, ...}},
    best, and extras (groups with seed mean/std, critical batches, grad-norm slope, noise,
    skipped dirs, warnings). Raises AnalysisError naming the problem.
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
    summary = analyze_runs(runs, target, reference, tolerance, fit_sigmoid,
                           skipped=skipped, **kwargs)
    summary["sweep_dir"] = sweep_dir
    return summary
