"""GRPO k=1 vs k=2 on the built-in task, from the default study's SFT start and settings."""
import json, os, sys, time
from jaxrl_scale.experiment.config import TrainConfig
from jaxrl_scale.experiment.train import run_training
from jaxrl_scale.experiment.sweep import enable_compile_cache
enable_compile_cache()
d = json.load(open("/work/main/results/sweep_default/sweep.json"))
base = TrainConfig.from_json(d["base"])
out = sys.argv[1]
for seed in (0, 1):
    for k in (1, 2):
        cfg = base.replace(run_dir=f"{out}/grpo_P32_G8_sqrt{'_k2' if k > 1 else ''}_s{seed}",
                           prompts_per_step=32, group_size=8, lr_rule="sqrt", seed=seed,
                           base_batch=128, base_lr=d["base_lrs"]["grpo"], max_responses=15360,
                           max_steps=10**9, eval_every=20, checkpoint_every=40,
                           gen_batch_ratio=k)
        t = time.time()
        r = run_training(cfg, progress=False, eval0_cache=f"{out}/_eval0")
        print(k, seed, r, time.time() - t, flush=True)
