"""Measured rates of the analysis on simulated sweeps; writes rates.json.

    PYTHONPATH=. python results/calibration/run.py [--fast_sweeps=2000] [--full_sweeps=200]

fast: vectorised per-run estimates through familywise.sweep_tests (what the CI test runs);
full: every sweep through analysis.analyze_runs (n_boot=50)."""
import argparse
import json
import os
import time

from jaxrl_scale.numbers import write_json
from jaxrl_scale.scaling import calibration as cal

BIG = "grpo_P128_G8_sqrt"
ap = argparse.ArgumentParser()
ap.add_argument("--fast_sweeps", type=int, default=2000)
ap.add_argument("--full_sweeps", type=int, default=200)
ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "rates.json"))
a = ap.parse_args()
out = {}
for name, d in (("default", cal.ONE_WARM_START_12), ("sampled_3_seeds", cal.SAMPLED_3_SEEDS),
                ("powered", cal.POWERED)):
    t0 = time.time()
    row = {"fast": {"null": cal.fast_rates(d, a.fast_sweeps, seed=100)}}
    for e in (1.3, 1.5):
        row["fast"][f"r_N={e}"] = cal.fast_rates(d, a.fast_sweeps, seed=101, r_N={BIG: e})
    row["fast_s"] = time.time() - t0
    if a.full_sweeps:
        t0 = time.time()
        row["full"] = cal.calibrate(d, a.full_sweeps, seed=7, effects=(1.3, 1.5))
        row["full_s"] = time.time() - t0
    out[name] = row
    print(name, json.dumps({k: v for k, v in row.items() if k != "full"})[:300], flush=True)
    write_json(a.out, out, indent=1)   # atomic: a finished design survives a crash
