"""r_q from each throughput source the planner can use, on the recorded studies, against the
study's timing pass (the r_q its verdicts use): the linear step-time fit to the runs' own step
records (`--step_times_from`: 3 updates after 2 warm-up per run, and every update after the
warm-up), and whether that fit describes the records it was fitted on (`step_cost.fit_misses`:
outside its own interval and by more than 5%; `jaxrl-plan` refuses such a fit). Run from the
repository root:

    python results/planner_validation/throughput_sources.py > results/planner_validation/throughput_sources.md
"""
import json
import math

import numpy as np

from jaxrl_scale.scaling import planner, step_cost

STUDIES = {"sweep_default": "results/sweep_default",
           "sweep_replicate": "results/sweep_replicate",
           "main_job_one_warm_start": "results/main_job_one_warm_start",
           "main_job": "results/main_job",
           "main_job_sse4_2": "results/main_job/reruns/sse4_2"}


def main():
    print("| study | step records | fit misses its records (B: miss) | r_q at B = 64 / 256 / 512 "
          "/ 1,024: records' fit vs pass | median abs log error |")
    print("|---|---|---|---|---|")
    errs = {}
    for name, d in STUDIES.items():
        with open(f"{d}/summary.json") as f:
            s = json.load(f)
        ref = s["reference_config"]
        rc = s["configs"][ref]
        runs = planner.sweep_runs(d)
        pool, _ = planner.like_probe(runs, [r for r in runs if r.group == ref][0])
        for warmup, steps in ((2, 3), (2, 0)):
            t = planner.timings_from_runs(pool, warmup, steps)
            fit = step_cost.fit_step_times(t, n_boot=400, seed=0)
            th = step_cost.theta_of_fit(fit)
            miss = step_cost.fit_misses(fit, t)
            cells, e = [], []
            for g, c in sorted(s["configs"].items(), key=lambda kv: kv[1]["batch"]):
                if g == ref or c.get("lr_rule") != rc.get("lr_rule") \
                        or c.get("group_size") != rc.get("group_size"):
                    continue
                pred = float(step_cost.r_q(th, [c["batch"]], rc["batch"])[0])
                cells.append(f"{pred:.2f} vs {c['r_q']:.2f}")
                e.append(abs(math.log(pred / c["r_q"])))
            what = f"{steps} after {warmup}" if steps else f"all after {warmup}"
            errs.setdefault(what, []).extend(e)
            print(f"| {name} | {what} | "
                  + (", ".join(f"{m['batch']:g}: {m['rel_err']:+.0%}" for m in miss) or "none")
                  + f" | {' / '.join(cells)} | {np.median(e):.3f} |")
    print()
    for what, e in errs.items():
        print(f"- step records ({what}): median |log(r_q fit / r_q pass)| {np.median(e):.3f}, "
              f"largest {max(e):.3f} over {len(e)} configs")


if __name__ == "__main__":
    main()
