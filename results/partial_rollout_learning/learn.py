"""GRPO k=1 vs k=2 on the built-in task, from the default study's SFT start and settings.

    python results/partial_rollout_learning/learn.py OUT_DIR

Each run's settings are the recorded ones: the config.json of grpo_P32_G8_sqrt_s0 here (the
default study's base config of the time with P = 32, G = 8, the sqrt rule from 1e-4 at B0 = 128,
15,360 responses), only the seed and gen_batch_ratio changed. Needs the SFT warm-start that
config names (~/.cache/jaxrl_scale/sft/..., made by the main job)."""
import json, os, sys, time
from jaxrl_scale.experiment.config import TrainConfig
from jaxrl_scale.experiment.train import run_training
from jaxrl_scale.experiment.sweep import enable_compile_cache
HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "grpo_P32_G8_sqrt_s0", "config.json")) as f:
    base = TrainConfig.from_json(json.load(f))
if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    enable_compile_cache()
    out = sys.argv[1]
    for seed in (0, 1):
        for k in (1, 2):
            cfg = base.replace(run_dir=f"{out}/grpo_P32_G8_sqrt{'_k2' if k > 1 else ''}_s{seed}",
                               seed=seed, gen_batch_ratio=k)
            t = time.time()
            r = run_training(cfg, progress=False, eval0_cache=f"{out}/_eval0")
            print(k, seed, r, time.time() - t, flush=True)
