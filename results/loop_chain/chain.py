"""Trace one GRPO batch (generate path) from prompt to optimizer update, eagerly (jax.disable_jit),
recording every Python call in jaxrl_scale/*. Prints the calls made from experiment/train.py in
order (the loop's plain function calls), the files visited, and the returns to train.py."""
import json, os, sys, tempfile
import jax
root = sys.argv[1]
sys.path.insert(0, root)
from jaxrl_scale.experiment.config import TrainConfig
from jaxrl_scale.experiment.train import Run
tmp = tempfile.mkdtemp()
cfg = TrainConfig.make(run_dir=tmp + "/run", data_dir=tmp + "/data", model="tiny", num_train_examples=200,
                       num_test_examples=32, prompts_per_step=4, group_size=4, max_new_tokens=4,
                       eval_prompts=8, eval_samples=2, base_lr=1e-3, base_batch=16)
run = Run(cfg)
new_api = hasattr(run, "initial_state")
pkg = os.path.join(root, "jaxrl_scale") + os.sep
rel = lambda f: f[len(root) + 1:]
files, calls, returns_to_train = [], [], 0
TRAIN = os.path.join(pkg, "experiment", "train.py")
def prof(frame, event, arg):
    global returns_to_train
    f = frame.f_code.co_filename
    if not f.startswith(pkg):
        return
    if event == "call":
        if rel(f) not in files:
            files.append(rel(f))
        caller = frame.f_back
        if caller is not None and caller.f_code.co_filename == TRAIN and f != TRAIN:
            calls.append(f"{rel(f)}:{frame.f_code.co_qualname}")
        elif f == TRAIN and caller is not None and caller.f_code.co_filename == TRAIN:
            calls.append(f"{rel(f)}:{frame.f_code.co_qualname}")
    elif event == "return":
        caller = frame.f_back
        if f != TRAIN and caller is not None and caller.f_code.co_filename == TRAIN:
            returns_to_train += 1
with jax.disable_jit():
    sys.setprofile(prof)
    if new_api:
        run.train_step(run.initial_state())
    else:
        run.train_step(1)
    sys.setprofile(None)
# collapse consecutive duplicates
out = []
for c in calls:
    if not out or out[-1][0] != c:
        out.append([c, 1])
    else:
        out[-1][1] += 1
print(json.dumps({"files": files, "n_files": len(files), "returns_to_train": returns_to_train,
                  "calls_from_train": [f"{c} x{n}" if n > 1 else c for c, n in out]}, indent=1))
