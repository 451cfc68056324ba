"""The planner's predictions beside a sweep's measurements (summary.json of
`analysis.analyze_sweep`): per config, predicted r_N, r_q, T/T0 with intervals against the
measured ones, counts of points inside, and the recommendation against the measured fastest
config (docs/science.md, The planner)."""

from __future__ import annotations

import math
import os

import numpy as np

from jaxrl_scale.numbers import Interval, fmt_ci, is_number
from jaxrl_scale.scaling.summary import ConfigStats, Summary

METRICS = ("r_N", "r_q", "T_over_T0")


def _inside(x, ci) -> bool | None:
    """x inside the interval (a null end is unbounded); None without x or an interval."""
    if not (is_number(x) and ci and len(ci) == 2):
        return None
    iv = Interval.of(ci)
    return bool((iv.lo is None or iv.lo <= x) and (iv.hi is None or x <= iv.hi))


def _overlap(a, b) -> bool | None:
    """Do two intervals overlap (a null upper end is unbounded)? None without lower ends."""
    if not (a and b and len(a) == 2 and len(b) == 2) or a[0] is None or b[0] is None:
        return None
    return Interval.of(a).overlaps(Interval.of(b))


def _configs_of(summary) -> dict[str, ConfigStats]:
    """The typed configs of a `Summary` or of summary.json's dict (a dict needs only
    "configs": the planner compares with any sweep's table)."""
    if isinstance(summary, Summary):
        return summary.configs
    return {g: ConfigStats.from_json(c) for g, c in (summary.get("configs") or {}).items()}


def compare(plan: dict, summary, network: str | None = None,
            same_lr_rule: bool = True) -> list[dict]:
    """One row per measured config of the plan's algo (and lr rule; the planner assumes the
    probe's rule, sqrt re-tuning in docs/science.md, Batch-size invariance and the lr rules)
    and gen_batch_ratio: predicted r_N, r_q, T/T0 with intervals at its batch vs the measured
    ones of the summary's configs (a `summary.Summary` or summary.json's dict),
    whether the measured point lies inside the predicted interval (``*_inside``) and whether
    the two intervals overlap (``*_overlap``). ``predicted`` fields are None at a batch the
    plan has no prediction for; ``network`` picks `plan["by_network"]` (default: the plan's).
    """
    preds = (plan["by_network"][network]["predictions"] if network else plan["predictions"])
    by_batch = {float(p["batch"]): p for p in preds}
    k_plan = float(plan.get("gen_batch_ratio") or 1)
    rows = []
    for name, c in sorted(_configs_of(summary).items(),
                          key=lambda kv: (kv[1].batch or 0, kv[0])):
        if plan.get("algo") and c.algo and c.algo != plan["algo"]:
            continue
        if same_lr_rule and plan.get("lr_rule") and c.lr_rule != plan["lr_rule"]:
            continue
        b = c.batch
        if not is_number(b):
            continue
        k = (c.batch_gen or b) / b
        if abs(k - k_plan) > 1e-9:
            continue
        p = by_batch.get(float(b))
        row = {"config": name, "batch": float(b), "group_size": c.group_size,
               "lr_rule": c.lr_rule, "is_reference": bool(c.is_reference),
               "reached": c.reached}
        for m in METRICS:
            pv, pci = (p[m], p.get(f"{m}_ci")) if p else (None, None)
            mv, mci = getattr(c, m), getattr(c, f"{m}_ci")
            row.update({f"{m}_pred": pv, f"{m}_pred_ci": pci, f"{m}_meas": mv,
                        f"{m}_meas_ci": mci, f"{m}_inside": _inside(mv, pci) if p else None,
                        f"{m}_overlap": _overlap(pci, mci) if p else None,
                        f"{m}_pred_over_meas": pv / mv
                        if p and is_number(pv) and is_number(mv) and mv
                        else None})
        rows.append(row)
    return rows


def compare_counts(rows: list[dict], group_size=None) -> dict:
    """Per metric, over non-reference rows with both a prediction and a measurement (and the
    given group size, if any): how many measured points lie inside the predicted interval, how
    many intervals overlap, and the median |log(predicted / measured)| of the points."""
    out = {}
    for m in METRICS:
        rs = [r for r in rows if not r["is_reference"] and r[f"{m}_inside"] is not None
              and (group_size is None or r["group_size"] == group_size)]
        logs = [abs(math.log(r[f"{m}_pred_over_meas"])) for r in rs
                if is_number(r[f"{m}_pred_over_meas"]) and r[f"{m}_pred_over_meas"] > 0]
        out[m] = {"n": len(rs), "inside": sum(r[f"{m}_inside"] for r in rs),
                  "overlap": sum(bool(r[f"{m}_overlap"]) for r in rs),
                  "median_abs_log_error": float(np.median(logs)) if logs else None}
    return out


def recommendation_check(plan: dict, summary, rows: list[dict]) -> dict:
    """The planner's recommended batch and range beside the sweep's: the measured fastest
    config among ``rows`` with the plan's group size, and the sweep's best set (configs not
    distinguishable from the fastest, per algorithm when the summary has several)."""
    g = plan.get("group_size")
    same = [r for r in rows
            if (g is None or r["group_size"] == g) and is_number(r["T_over_T0_meas"])]
    fastest = min(same, key=lambda r: r["T_over_T0_meas"]) if same else None
    if isinstance(summary, Summary):
        per_algo = summary.algos.get(plan.get("algo"))
        best_set = (per_algo.best_set if per_algo is not None else summary.primary.best_set)
    else:   # summary.json's dict, possibly another tool's with "configs" only
        per_algo = (summary.get("algos") or {}).get(plan.get("algo")) or {}
        best_set = per_algo.get("best_set", summary.get("best_set"))
    best_set = best_set or []
    best_batches = sorted({r["batch"] for r in same if r["config"] in best_set})
    rec = plan["recommended"]
    return {"recommended": rec["batch"], "range": rec["range"],
            "measured_fastest": fastest and fastest["config"],
            "measured_fastest_batch": fastest and fastest["batch"],
            "measured_best_set": [c for c in best_set if any(r["config"] == c for r in same)],
            "measured_best_set_batches": best_batches,
            "recommended_in_best_set": rec["batch"] in best_batches if best_batches else None}


def _fmt_ci(v, ci) -> str:
    return fmt_ci(v, ci) if v is not None else "-"


def format_compare(rows: list[dict]) -> str:
    """Markdown table of `compare` rows: predicted vs measured r_N, r_q, T/T0; a check mark
    where the measured point lies inside the predicted interval, '~' where only the intervals
    overlap, 'x' where they are disjoint."""
    head = ("| config | B | r_N pred | r_N meas | | r_q pred | r_q meas | | T/T0 pred | "
            "T/T0 meas | |\n|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        cells = [r["config"] + (" (ref)" if r["is_reference"] else ""), f"{r['batch']:g}"]
        for m in METRICS:
            mark = ("-" if r[f"{m}_inside"] is None else "✓" if r[f"{m}_inside"]
                    else "~" if r[f"{m}_overlap"] else "x")
            cells += [_fmt_ci(r[f"{m}_pred"], r[f"{m}_pred_ci"]),
                      _fmt_ci(r[f"{m}_meas"], r[f"{m}_meas_ci"]), mark]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)




def separation_text(rec: dict) -> str:
    """One sentence on the recommended set: the batches the plan cannot tell apart from the
    best, and for each what would separate them (`planner_link.separation`)."""
    sep = rec.get("separation") or {}
    others = [b for b in rec["batches"] if b != rec["batch"]]
    if not others:
        return f"B = {rec['batch']:g} is the only batch not shown slower than the best."

    def one(b):
        x = sep.get(f"{b:g}") or {}
        if (x.get("probe_runs_x") or 9) <= 1.0 or (x.get("pass_x") or 9) <= 1.0:
            return f"{b:g} (at the edge: a few more probe runs would tell)"
        ways = [f"{x['probe_runs_x']:g}x the probe runs" if x.get("probe_runs_x") else "",
                f"a {x['pass_x']:g}x longer timing pass" if x.get("pass_x") else ""]
        ways = [w for w in ways if w]
        return (f"{b:g} ({' or '.join(ways)})" if ways else
                f"{b:g} (not by more probe runs or timing: the link's between-study error)")
    return (f"Cannot separate from B = {rec['batch']:g}: " + "; ".join(one(b) for b in others)
            + ".")


FIRST_BLOCK_PLAN = "plan_first_block.json"


def first_block_plan(runs, summary, timing: dict | None, n_boot: int = 1000,
                     seed: int = 0, min_blocks: int = 2,
                     block: str | None = None) -> tuple[dict | None, str]:
    """The plan a study could have made before its other warm-starts: `planner.batch_plan` on
    its first warm-start block's reference runs (or ``block``'s: w0, w1, ...; target: that
    block's J*), with the step-time fit of that block's timing pass, for every batch the study
    ran. With ``min_blocks`` 0 and runs of one warm-start (no blocks): its reference runs and
    its pass. (None, why) when the study has fewer blocks, no timing pass of the block, or a
    probe the planner refuses."""
    from jaxrl_scale.scaling import planner, step_cost
    algo = summary.primary_algo
    ref = summary.reference_configs.get(algo)
    blocks = sorted({x.block for x in summary.runs.values() if x.block})
    if not ref or len(blocks) < min_blocks:
        return None, "one warm-start: no first block to plan from"
    if block is not None and block not in blocks:
        return None, f"no warm-start block {block} (blocks: {', '.join(blocks) or 'none'})"
    block = block or (blocks[0] if blocks else None)
    names = {n for n, x in summary.runs.items() if x.block == block and x.group == ref}
    probe = [r for r in runs if r.name in names]
    warm = {os.path.basename(os.path.dirname(str(r.config.get("init_checkpoint") or "")))
            for r in probe}
    entries = [e for e in (timing or {}).get("entries", [])
               if e.get("algo", algo) == algo and (block is None or os.path.basename(
                   os.path.dirname(str(e.get("warm_start") or ""))) in warm)]
    if not probe or len(warm) != 1 or len({e["batch"] for e in entries}) < 2:
        return None, f"no timing pass of warm-start block {block or 1} to fit step times to"
    rule = (summary.primary.target_rule or {}).get("per_warm_start") or {}
    target = rule.get(block) if block else summary.primary.target
    batches = sorted({float(c.batch) for c in summary.configs.values()
                      if c.algo == algo and is_number(c.batch)})
    try:
        fit = step_cost.fit_step_times(entries, n_boot=n_boot, seed=seed)
        plan = planner.batch_plan(probe, fit, batches, target=target, n_boot=n_boot,
                                  seed=seed)
    except planner.PlanError as e:
        return None, f"{e.field}: {e.problem}"
    plan["first_block"] = {"block": block or "w0", "probe_runs": sorted(names),
                           "target": target}
    return plan, ""


def block_plan(runs, timing: dict | None, target_fraction: float, n_boot: int = 1000,
               seed: int = 0) -> tuple[dict | None, str]:
    """`first_block_plan` of a study that has run its first warm-start only (the runs so far,
    analysed at the study's target fraction)."""
    from jaxrl_scale.scaling import analysis
    try:
        summary = analysis.analyze(runs, "auto", n_boot=50, target_fraction=target_fraction,
                                   timing=(timing or {}).get("entries") or None)
    except Exception as e:   # noqa: BLE001  (any analysis failure: plan nothing, say why)
        return None, f"the first warm-start's runs cannot be analysed ({e})"
    return first_block_plan(runs, summary, timing, n_boot, seed, min_blocks=0)


__all__ = ["METRICS", "compare", "compare_counts", "recommendation_check", "format_compare",
           "first_block_plan", "block_plan", "FIRST_BLOCK_PLAN", "separation_text"]
