"""Check of the rollout-ratio term t_gen(k B) / k (step_cost.step_seconds) on this CPU.

`generate` (k = 1) and the slot engine (k > 1) are different engines with different cost
curves, so the k = 2 rollout times of timing_pass_rl_cpu.json are compared with the *same
engine* at k = 1 (`rollout="engine"`, synchronous): per update at k = 2 and batch B, the
prediction is t_engine(2B) / 2, with t_engine(2B) the engine's k = 1 rollout time at B = 2B
(measured directly, and from the line fitted to the engine's k = 1 pass).

    python results/roofline_validation/partial_rollout_check.py
"""
import json
import os
import sys
import tempfile

import numpy as np

from jaxrl_scale.experiment.config import TrainConfig
from jaxrl_scale.experiment.timing import time_batches
from jaxrl_scale.scaling.step_cost import fit_step_times

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    rec = json.load(open(os.path.join(HERE, "timing_pass_rl_cpu.json")))
    k2 = rec["timings_k2"]
    base = TrainConfig.make(model="rl_cpu", group_size=8, run_dir=tempfile.mkdtemp(),
                            rollout="engine")
    eng = time_batches(base, [e["batch_gen"] for e in k2], warmup=rec["warmup"],
                       steps=rec["steps"])
    fit = fit_step_times(eng)
    rows = []
    for e in k2:
        B, Bg = e["batch"], e["batch_gen"]
        same = next(x for x in eng if x["batch"] == Bg)
        boot = (fit["boot"][:, 0] + fit["boot"][:, 1] * Bg) / 2
        rows.append({"batch": B, "batch_gen": Bg,
                     "measured_k2_gen_s_mean": float(np.mean(e["gen_s"])),
                     "engine_k1_gen_s_mean_at_batch_gen": float(np.mean(same["gen_s"])),
                     "predicted_direct_s": float(np.mean(same["gen_s"])) / 2,
                     "predicted_fit_s": (fit["d0"] + fit["d1"] * Bg) / 2,
                     "predicted_fit_ci_s": np.quantile(boot, [0.05, 0.95]).tolist()})
        r = rows[-1]
        r["rel_error_direct"] = r["predicted_direct_s"] / r["measured_k2_gen_s_mean"] - 1
        r["rel_error_fit"] = r["predicted_fit_s"] / r["measured_k2_gen_s_mean"] - 1
    out = {"command": "python " + " ".join(sys.argv), "engine_k1_timings": eng,
           "engine_k1_fit": {k: v for k, v in fit.items() if k != "boot"}, "check": rows}
    with open(os.path.join(HERE, "partial_rollout_check.json"), "w") as f:
        json.dump(out, f, indent=2, default=str)
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
