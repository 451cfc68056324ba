"""The tables of README.md from rates.json: PYTHONPATH=. python results/n_star/table.py"""
import json
import os

d = json.load(open(os.path.join(os.path.dirname(__file__), "rates.json")))
print("| shape | true r_N | chord, every 5,120 | cubic, every 5,120 | chord, every 1,024 | "
      "cubic, every 1,024 |\n|---|---|---|---|---|---|")
rows = {}
for r in d["noise_free"]:
    rows.setdefault((r["shape"], r["r_N_true"]), {})[r["eval_every"]] = r
for (shape, rt), v in rows.items():
    print(f"| {shape} | {rt:g} | " + " | ".join(f"{v[e][k]:.3f}" for e in (5120, 1024)
                                               for k in ("chord", "cubic")) + " |")
print("\n| design | estimator | null FWER | power r_N=1.5 | T/T0 coverage (null / effect) | "
      "bias of log r_N | sd / RMSE of log r_N | seed spread seen (truth 0.18) | "
      "median evals before N0* |\n|---|---|---|---|---|---|---|---|---|")
for r in d["designs"]:
    f = lambda x: f"{x['rate']:.3f} ± {x['mc_se']:.3f}"
    b = r["log_r_N_bias"]
    print(f"| {r['design']} | {r['estimator']} | {f(r['null_fwer'])} | {f(r['power_r_N_1.5'])} "
          f"| {r['coverage_T_null']['rate']:.3f} / {r['coverage_T_effect']['rate']:.3f} | "
          f"{b['mean']:+.3f} ± {b['mc_se']:.3f} | {r['log_r_N_sd']:.3f} / "
          f"{r['log_r_N_rmse']:.3f} | {r['seed_spread_log_N_reference']:.3f} | "
          f"{r['median_evals_before_reference_N_star']:g} |")
