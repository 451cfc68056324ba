"""Exact vs sampled eval on the study's policies: scores and cost, interleaved in one process.

    PYTHONPATH=. python results/exact_eval/measure.py RUN_DIR [RUN_DIR ...] --rounds=3

For the warm-start (step 0 of the first RUN_DIR's config) and the newest checkpoint of each
RUN_DIR: the exact score (rl/exact_eval.py), and `rounds` sampled evals of the study's size
(eval_prompts x eval_samples, sampling seeds differing per round), alternating exact and
sampled so that machine drift lands on both. Prints one JSON line per policy."""
import argparse
import json
import os
import time

import numpy as np

from jaxrl_scale.checkpoint import Checkpointer
from jaxrl_scale.experiment.config import TrainConfig
from jaxrl_scale.experiment.train import Run, trained_part
from jaxrl_scale.rl.rollout import LoopState

ap = argparse.ArgumentParser()
ap.add_argument("run_dirs", nargs="+")
ap.add_argument("--rounds", type=int, default=3)
a = ap.parse_args()


def policies():
    for i, d in enumerate(a.run_dirs):
        with open(os.path.join(d, "config.json")) as f:
            cfg = TrainConfig.from_json(json.load(f))
        runs = {m: Run(cfg.replace(run_dir=f"/tmp/exact_eval_{m}_{i}", eval_mode=m))
                for m in ("exact", "sampled")}
        loop = LoopState(states=runs["exact"].init_states)
        if i == 0:
            yield "warm-start", runs, loop
        ck = Checkpointer(os.path.join(d, "checkpoints"))
        states, meta = ck.restore(None, trained_part(loop.states))
        yield f"{os.path.basename(d)} step {meta['counters']['step']}", runs, loop.replace(
            states=tuple(states))


for name, runs, loop in policies():
    rec = {"policy": name, "exact": [], "sampled": [], "exact_s": [], "sampled_s": []}
    for r in range(a.rounds + 1):            # round 0 compiles; not timed
        for m in ("exact", "sampled"):
            t = time.perf_counter()
            _, e = runs[m].evaluate(loop.replace(step=r))
            if r:
                rec[m].append(e["score"])
                rec[m + "_s"].append(time.perf_counter() - t)
    s = np.array(rec["sampled"])
    rec["sampled_mean"], rec["sampled_se"] = float(s.mean()), float(s.std(ddof=1) / np.sqrt(s.size))
    rec["gap"] = rec["sampled_mean"] - rec["exact"][0]
    rec["time_ratio"] = float(np.median(rec["sampled_s"]) / np.median(rec["exact_s"]))
    print(json.dumps(rec), flush=True)
