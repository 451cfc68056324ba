"""The planner from one warm-start block at a time: for every recorded study with warm-start
blocks, each block's two reference runs are the probe and that block's timing pass the step
times (`plan_compare.first_block_plan(..., block=w)`, the plan the study's report makes from
its first block), and the plan meets what the whole study measured. Per block: T/T0, r_N and
r_q inside the 90% prediction interval, the recommended set holding the measured fastest
batch, the median |log(pred/meas)| of T/T0; then every count with a 90% Wilson interval, over
configs (which share a study, so the interval is optimistic) and over blocks. Run from the
repository root:

    python results/planner_validation/blocks.py > results/planner_validation/blocks.md
"""
import json
import math

import numpy as np
from scipy import stats as sps

from jaxrl_scale.numbers import fmt
from jaxrl_scale.scaling import analysis, plan_compare, planner
from jaxrl_scale.scaling.summary import as_summary

STUDIES = {"main_job": "results/main_job",
           "main_job_sse4_2": "results/main_job/reruns/sse4_2",
           "after_fit": "results/planner_validation/after_fit"}
LEVEL = 0.9


def wilson(k: int, n: int) -> str:
    ci = sps.binomtest(k, n).proportion_ci(confidence_level=LEVEL, method="wilson")
    lo, hi = ci.low, ci.high
    return f"{k}/{n} [{lo:.2f}, {hi:.2f}]"


def block_rows(path: str):
    with open(f"{path}/summary.json") as f:
        summary = as_summary(json.load(f))
    with open(f"{path}/logs/timing.json") as f:
        timing = json.load(f)
    runs, _ = analysis.load_runs(f"{path}/logs", [])
    blocks = sorted({x.block for x in summary.runs.values() if x.block})
    for b in blocks:
        plan, why = plan_compare.first_block_plan(runs, summary, timing, block=b)
        if plan is None:
            yield b, None, why
            continue
        rows = [r for r in planner.compare(plan, summary) if not r.get("is_reference")]
        yield b, (plan, rows, plan_compare.recommendation_check(plan, summary, rows)), ""


def main():
    print("| study | block | B_simple | recommended set | measured fastest | in set | "
          "T/T0 inside | r_N inside | r_q inside | median abs log T/T0 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    tot = {m: [0, 0] for m in ("T_over_T0", "r_N", "r_q")}
    hits, errs, blocks_all_T, refused = [], [], [], []
    for name, path in STUDIES.items():
        for b, got, why in block_rows(path):
            if got is None:
                refused.append(f"{name} {b}: {why}")
                continue
            plan, rows, chk = got
            counts = planner.compare_counts(rows)
            rec = plan["recommended"]["batches"]
            hit = chk["measured_fastest_batch"] in rec
            hits.append(hit)
            for m in tot:
                tot[m][0] += counts[m]["inside"]
                tot[m][1] += counts[m]["n"]
            blocks_all_T.append(counts["T_over_T0"]["inside"] == counts["T_over_T0"]["n"])
            e = counts["T_over_T0"]["median_abs_log_error"]
            errs.append(e)
            print(f"| {name} | {b} | {fmt(plan['B_simple'])} | "
                  f"{', '.join(f'{x:.0f}' for x in rec)} | {chk['measured_fastest_batch']:.0f} | "
                  f"{'yes' if hit else 'no'} | "
                  + " | ".join(f"{counts[m]['inside']}/{counts[m]['n']}" for m in tot)
                  + f" | {e:.3f} |")
    print()
    print(f"Over configs (90% Wilson): " + "; ".join(
        f"{m} inside {wilson(*tot[m])}" for m in tot) + ".")
    print(f"Over blocks: recommended set holds the measured fastest {wilson(sum(hits), len(hits))}; "
          f"every T/T0 inside {wilson(sum(blocks_all_T), len(blocks_all_T))}; median over "
          f"blocks of the median |log(pred/meas)| of T/T0 {np.median(errs):.3f}.")
    if refused:
        print("\nNo plan: " + "; ".join(refused) + ".")


if __name__ == "__main__":
    main()
