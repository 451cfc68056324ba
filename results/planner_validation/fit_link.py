"""Fit the planner's link B_crit = B_simple / a on the recorded studies and write it to
jaxrl_scale/scaling/planner_link.json (docs/science.md, The planner). Per study: the probe is
its reference config's runs (B_simple in the N* window), the measurement its summary's r_N.
Run from the repository root:

    python results/planner_validation/fit_link.py [--write]
"""
import json
import math
import sys

from jaxrl_scale.scaling import planner, planner_link

# Every recorded study with run logs whose configs vary the batch at one lr rule; the main
# jobs' SSE4_2 and AVX2 twins are other warm-start draws of the same design.
STUDIES = {"sweep_default": "results/sweep_default",
           "sweep_replicate": "results/sweep_replicate",
           "study_full": "results/study_full",
           "main_job_one_warm_start": "results/main_job_one_warm_start",
           "main_job": "results/main_job",
           "main_job_sse4_2": "results/main_job/reruns/sse4_2"}


def points(studies=STUDIES, n_boot: int = 1000) -> list:
    out = []
    for name, d in studies.items():
        with open(f"{d}/summary.json") as f:
            summary = json.load(f)
        runs = planner.sweep_runs(d)
        for algo in sorted(summary.get("reference_configs") or
                           {summary.get("primary_algo", "grpo"): 1}):
            p = planner_link.study_point(name, summary, runs, algo, n_boot=n_boot)
            if p is not None:
                out.append(p)
    return out


def main(write: bool) -> None:
    pts = points()
    print("| study | algo | B_simple (probe) | B_crit measured | a = B_simple / B_crit |")
    print("|---|---|---|---|---|")
    for p in pts:
        k = p.kappa_meas
        print(f"| {p.study} | {p.algo} | {p.b_simple:,.0f} | "
              f"{(1 / k if k > 0 else math.inf):,.0f} | {math.exp(p.log_a):.2f} |")
    links = planner_link.fit_links(pts)
    print()
    for k, v in links.items():
        print(f"- {k}: {v.describe()}; sd {v.sd:.3f}")
    if write:
        planner_link.save_links(links)
        print(f"\nwritten: {planner_link.LINK_JSON}")


if __name__ == "__main__":
    main("--write" in sys.argv[1:])
