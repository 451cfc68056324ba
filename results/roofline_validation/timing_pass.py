"""Timing pass on this CPU: `time_batches` on rl_cpu with the built-in arithmetic task, then
`fit_step_times` (SCIENCE.md section 3 cost model), and a second pass at gen_batch_ratio k = 2
(the slot engine). Its per-update rollout seconds are listed next to t_gen(2B)/2 from the
k = 1 (`generate`) fit ("k2_vs_generate_fit"): that mixes two engines, so the clean check of
the t_gen(kB)/k term is partial_rollout_check.py (same engine at k = 1 and k = 2).

    python results/roofline_validation/timing_pass.py [out.json]
"""
import json
import os
import sys
import tempfile
import time

import numpy as np

from jaxrl_scale.experiment.config import TrainConfig
from jaxrl_scale.experiment.timing import time_batches
from jaxrl_scale.scaling.step_cost import COLUMNS as FIT_COLUMNS, fit_step_times, predict_r_q

BATCHES, BATCHES_K2 = [64, 128, 256, 512], [64, 128, 256]
WARMUP, STEPS = 2, 8


def jsonable_fit(fit):
    return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in fit.items()
            if k != "boot"}


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "timing_pass_rl_cpu.json")
    base = TrainConfig.make(model="rl_cpu", group_size=8, run_dir=tempfile.mkdtemp())
    t0 = time.time()
    k1 = time_batches(base, BATCHES, warmup=WARMUP, steps=STEPS)
    t1 = time.time()
    k2 = time_batches(base.replace(gen_batch_ratio=2), BATCHES_K2, warmup=WARMUP, steps=STEPS)
    t2 = time.time()
    fit = fit_step_times(k1)
    # k = 2 (engine) per-update rollout vs (d0 + d1 * 2B) / 2 from the k = 1 (generate) fit
    check = []
    for e in k2:
        B = e["batch"]
        pred = (fit["d0"] + fit["d1"] * 2 * B) / 2
        boot = (fit["boot"][:, 0] + fit["boot"][:, 1] * 2 * B) / 2
        check.append({"batch": B, "batch_gen": e["batch_gen"],
                      "measured_gen_s_mean": float(np.mean(e["gen_s"])),
                      "predicted_gen_s": pred,
                      "predicted_gen_s_ci": np.quantile(boot, [0.05, 0.95]).tolist(),
                      "sync_same_batch_gen_s_mean": next(
                          (float(np.mean(x["gen_s"])) for x in k1 if x["batch"] == B), None)})
    rq = predict_r_q(fit, BATCHES, BATCHES[0])
    measured_q = [e["batch"] / float(np.mean(e["step_s"])) for e in k1]
    out = {
        "command": "python " + " ".join(sys.argv),
        "config": {k: v for k, v in base.flat().items() if k not in ("run_dir",)},
        "warmup": WARMUP, "steps": STEPS, "interleaved": True,
        "wall_s": {"k1": t1 - t0, "k2": t2 - t1},
        "timings": k1, "fit": jsonable_fit(fit),
        "timings_k2": k2, "k2_vs_generate_fit": check,
        "r_q_vs_B0": {"batch0": BATCHES[0], "batches": BATCHES, "r_q": rq["r_q"].tolist(),
                      "r_q_ci": rq["r_q_ci"].tolist(),
                      "measured_r_q": (np.array(measured_q) / measured_q[0]).tolist()},
        "note": "fit['boot'] is not stored: fit_step_times(timings) (seed 0) reproduces it.",
    }
    with open(out_path, "w") as f:
        json.dump(out, f, indent=2, default=str)
    for c in FIT_COLUMNS:
        print(f"{c}: {fit[c]:.6g}  90% CI {fit[c + '_ci']}")
    for c in check:
        print(c)
    print("r_q", out["r_q_vs_B0"])
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
