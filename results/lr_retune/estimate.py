"""What re-tuning the lr at every batch (`--retune_lr_per_batch`) would add to the default
study, from the per-run times recorded in results/sweep_default_latest/logs (code 3080cb5, a
machine shared with test runs). An estimate from measured times, not a run of the option:

    PYTHONPATH=. python results/lr_retune/estimate.py

A tuning run's wall time = training seconds to the tuning budget (interpolated from the
sweep's seed-0 run at that batch) + its evals (the mean logged eval_s of the recorded tuning
runs x their eval count), per lr tried (the grid plus the recorded number of extensions)."""
import glob
import json
import os

import numpy as np

ROOT = "results/sweep_default_latest/logs"
BUDGET = 6144


def records(d):
    return [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl")) if line.strip()]


tune = [records(d) for d in sorted(glob.glob(f"{ROOT}/_lr_tune/*"))]
evals = [r["eval_s"] for rs in tune for r in rs if "eval_s" in r]
per_run_evals = np.mean([sum("eval_s" in r for r in rs) for rs in tune])
eval_s = float(np.mean(evals)) * per_run_evals
lrs = len(tune)                      # the grid and its extensions at B0 in the recorded study
rows, total = [], 0.0
for d in sorted(glob.glob(f"{ROOT}/grpo_P*_G8_sqrt_s0"), key=lambda d: int(d.split("_P")[1].split("_")[0])):
    tr = [r for r in records(d) if "score" not in r and "time_s" in r]
    t = float(np.interp(BUDGET, [r["responses"] for r in tr], [r["time_s"] for r in tr]))
    B = int(tr[0]["batch_train"])
    rows.append((B, t, lrs * (t + eval_s)))
    total += rows[-1][2]
b0 = [r for r in rows if r[0] == 128][0][2]
print(f"{lrs} lrs per batch, each run: training to {BUDGET} responses + {per_run_evals:.0f} evals "
      f"x {np.mean(evals):.1f} s")
for B, t, c in rows:
    print(f"B={B}: training {t:.1f} s per run; tuning {c / 60:.1f} min")
print(f"all {len(rows)} batches: {total / 60:.1f} min of run time, against {b0 / 60:.1f} min "
      f"at B0 alone ({total / b0:.1f}x), before compile and setup")
