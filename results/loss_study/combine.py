"""The loss study, put together: three sweeps of the default design at the reference batch
only (B = 128, 6 SFT warm-starts x 2 seeds, each loss with its own lr tuning), one per loss:
the default (GRPO's clipped ratio, group-normalised advantages), `--policy_loss=cispo` and
`--adv_norm=batch`. Their runs go into one sweep directory under config names that say the
loss (the default's keep theirs, the others gain _cispo / _batchnorm), with the default sweep's
sweep.json (its target rule) and timing.json (all three train at B = 128 with the same model:
the losses differ by a few elementwise operations per token, so the reference's pass entry
times them all and r_q = 1; the runs' own update seconds per loss are printed beside, and
differ with the machine's load during each sweep, not with the loss), for `jaxrl-analyze` to
test each loss against the default with warm-starts as blocks. Then the final score (the last
eval, every run goes to the full budget) per loss with a 90% interval of the paired
difference to the default over warm-starts. Run from the repository root:

    python results/loss_study/combine.py SWEEPS_ROOT     # SWEEPS_ROOT/{default,cispo,batchnorm}
    python experiments/analyze.py --sweep_dir=results/loss_study/logs --out=results/loss_study
    python results/loss_study/combine.py --scores > results/loss_study/scores.md

With --u=2 the same for sweeps of two updates per rollout (the off-policy check, runs named
..._u2_s<seed>), into results/loss_study/off_policy/ (the losses whose sweeps are there).
"""
import json
import os
import re
import shutil
import sys

import numpy as np
from scipy import stats as sps

STUDY = os.path.dirname(os.path.abspath(__file__))
LOSSES = {"default": "", "cispo": "_cispo", "batchnorm": "_batchnorm"}
LEVEL = 0.9


def _where(u: int) -> tuple[str, str, str]:
    """(record directory, its logs, the runs' update tag) for u updates per rollout."""
    here = STUDY if u == 1 else os.path.join(STUDY, "off_policy")
    return here, os.path.join(here, "logs"), "" if u == 1 else f"_u{u}"


def combine(root: str, u: int = 1) -> None:
    here, logs, tag_u = _where(u)
    run = re.compile(rf"^grpo_P16_G8_sqrt{tag_u}_s(\d+)$")
    os.makedirs(logs, exist_ok=True)
    for loss, tag in LOSSES.items():
        src = os.path.join(root, loss)
        if not os.path.isdir(src):
            continue
        for name in sorted(os.listdir(src)):
            m = run.match(name)
            if not m:
                continue
            dst = os.path.join(logs, f"grpo_P16_G8_sqrt{tag}{tag_u}_s{m.group(1)}")
            os.makedirs(dst, exist_ok=True)
            for f in ("config.json", "metrics.jsonl", "DONE.json"):
                if os.path.isfile(os.path.join(src, name, f)):
                    shutil.copy(os.path.join(src, name, f), dst)
        if os.path.isfile(os.path.join(src, "lr_tune.json")):
            shutil.copy(os.path.join(src, "lr_tune.json"),
                        os.path.join(here, f"lr_tune_{loss}.json"))
    for f in ("sweep.json", "timing.json"):
        shutil.copy(os.path.join(root, "default", f), os.path.join(logs, f))


def _runs(u: int) -> dict:
    """{loss: {(warm-start, seed): (final score, median update_s)}}."""
    _, logs, tag_u = _where(u)
    out = {}
    for loss, tag in LOSSES.items():
        pat = re.compile(rf"^grpo_P16_G8_sqrt{tag}{tag_u}_s(\d+)$")
        for name in sorted(os.listdir(logs)):
            m = pat.match(name)
            if not m:
                continue
            d = os.path.join(logs, name)
            with open(os.path.join(d, "config.json")) as f:
                cfg = json.load(f)
            recs = [json.loads(x) for x in open(os.path.join(d, "metrics.jsonl"))]
            evals = [r["score"] for r in recs if "eval_mode" in r]
            upd = [r["update_s"] for r in recs if "update_s" in r]
            key = (cfg.get("init_checkpoint"), int(m.group(1)))
            out.setdefault(loss, {})[key] = (evals[-1], float(np.median(upd)))
    return out


def scores(u: int = 1) -> None:
    here, _, _ = _where(u)
    runs = _runs(u)
    base = runs["default"]
    print("| loss | tuned lr | runs | final score (mean) | paired difference to the default, "
          f"{LEVEL:.0%} over warm-starts | median update seconds |")
    print("|---|---|---|---|---|---|")
    for loss, r in runs.items():
        try:
            with open(os.path.join(here, f"lr_tune_{loss}.json")) as f:
                lr = f"{json.load(f)['tuned']['grpo']['lr']:g}"
        except OSError:       # no tuning: the lr given
            with open(os.path.join(here, "logs", "sweep.json")) as f:
                lr = f"{json.load(f)['base']['optim']['base_lr']:g} (given)"
        warm = sorted({w for w, _ in r})
        # per warm-start: mean over its seeds of (score - the default's at the same seed)
        d = np.array([np.mean([r[k][0] - base[k][0] for k in r if k[0] == w and k in base])
                      for w in warm])
        if loss == "default":
            diff = "-"
        else:
            se = d.std(ddof=1) / np.sqrt(d.size)
            t = sps.t.ppf(0.5 + LEVEL / 2, d.size - 1)
            diff = f"{d.mean():+.4f} [{d.mean() - t * se:+.4f}, {d.mean() + t * se:+.4f}]"
        print(f"| {loss} | {lr} | {len(r)} | {np.mean([v[0] for v in r.values()]):.4f} | "
              f"{diff} | {np.median([v[1] for v in r.values()]):.3f} |")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--u=")]
    u = int(next((a[4:] for a in sys.argv[1:] if a.startswith("--u=")), 1))
    if args == ["--scores"]:
        scores(u)
    else:
        combine(args[0], u)
