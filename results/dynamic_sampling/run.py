"""DAPO dynamic sampling (--refill) against the plain and filtered update, from the default
study's warm-start: the reference config grpo_P16_G8_sqrt of results/sweep_default (its
config.json, the lr the study tuned) at 3 seeds per arm, then the analysis of the 9 runs.

    python results/dynamic_sampling/run.py OUT_DIR [--seeds=0,1,2] [--cap=4]

Arms, interleaved (each seed runs every arm before the next seed): plain (every group in the
loss), filter (--filter_zero_variance: zero-variance groups leave the loss, the batch
shrinks), refill (--refill --refill_cap=CAP: further rounds of P = 16 prompts until P groups
with a reward spread are kept), refillq4 (the same with rounds of 4 prompts after the first,
--refill_prompts=4). Each run stops at the study's response budget in
retained responses (max_responses), so a refill run generates more. Needs the warm-start the
main job made (~/.cache/jaxrl_scale/sft/...; the path is read from the study's config.json).
"""
import json
import os
import sys

from jaxrl_scale.experiment.config import TrainConfig
from jaxrl_scale.experiment.train import run_training

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "..", "sweep_default", "logs", "grpo_P16_G8_sqrt_s0", "config.json")
ARMS = {"plain": {}, "filter": dict(filter_zero_variance=True),
        "refill": dict(refill=True), "refillq4": dict(refill=True, refill_prompts=4)}


def main(out: str, seeds=(0, 1, 2), cap: int = 4) -> None:
    with open(SOURCE) as f:
        base = TrainConfig.from_json(json.load(f))
    # the recorded path is the recording machine's HOME; the cache key names the same params
    key = os.path.basename(os.path.dirname(base.init_checkpoint))
    ckpt = os.path.expanduser(os.path.join("~/.cache/jaxrl_scale/sft", key, "params"))
    base = base.replace(init_checkpoint=ckpt)
    if not os.path.exists(base.init_checkpoint):
        sys.exit(f"error: init_checkpoint: {base.init_checkpoint} is missing. Fix: run the "
                 "main job (python experiments/sweep_batch.py) once to make the warm-start.")
    for seed in seeds:
        for arm, kw in ARMS.items():
            if kw.get("refill"):
                kw = dict(kw, refill_cap=cap)
            cfg = base.replace(run_dir=os.path.join(out, f"{arm}_P16_G8_s{seed}"), seed=seed,
                               tensorboard=False, **kw)
            print(arm, seed, flush=True)
            run_training(cfg, progress=False)


if __name__ == "__main__":
    args = dict(a.lstrip("-").split("=") for a in sys.argv[2:])
    main(sys.argv[1], tuple(int(s) for s in args.get("seeds", "0,1,2").split(",")),
         int(args.get("cap", 4)))
