"""Markdown table of rates.json (written by run.py): PYTHONPATH=. python results/calibration/table.py"""
import json
import os

B = "grpo_P128_G8_sqrt"
r = json.load(open(os.path.join(os.path.dirname(__file__), "rates.json")))


def f(x):
    return f"{x['rate']:.3f} ± {x['mc_se']:.3f}"


print("| design | path | sweeps/arm | null FWER | power r_N=1.3 | power r_N=1.5 | coverage T/T0 "
      "(all) | coverage T/T0 (config with r_N=1.5) | coverage r_N | median min_detectable_r_N |")
print("|---|---|---|---|---|---|---|---|---|---|")
for name, row in r.items():
    x = row["fast"]
    cov = x["r_N=1.5"]["coverage_T_by_config"][B]
    print(f"| {name} | fast (sweep_tests) | {x['null']['n_sweeps']} | {f(x['null']['any_wrong'])} | "
          f"{f(x['r_N=1.3']['slower'][B])} | {f(x['r_N=1.5']['slower'][B])} | "
          f"{f(x['null']['coverage_T'])} | {f(cov)} | {f(x['null']['coverage_r_N'])} | "
          f"{x['null']['median_min_detectable_r_N']:.3g} |")
    if "full" in row:
        u = row["full"]
        print(f"| {name} | full (analyze_runs) | {u['n_sweeps']} | {f(u['null_fwer'])} | "
              f"{f(u['power']['1.3'])} | {f(u['power']['1.5'])} | {f(u['coverage_T'])} | "
              f"{f(u['coverage_T_effect_config']['1.5'])} | {f(u['coverage_r_N'])} | "
              f"{u['median_min_detectable_r_N']:.3g} |")
