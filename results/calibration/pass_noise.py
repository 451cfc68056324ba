"""The noise of the recorded timing passes that calibration.PASS_NOISE simulates:
PYTHONPATH=. python results/calibration/pass_noise.py

Five passes of the default study's batches (B = 64..1024 against B0 = 128, 8 rounds each, no
blocks) were recorded by five studies (results/*/logs/timing.json). Per batch and pass: the
mean paired log ratio over rounds (log r_q) and its within-pass variance (round sd^2 / rounds).
Between passes (method of moments): var(log r_q over passes) - mean within-pass variance.
Per config (the paired ratio has two configs' noise): divide the variances by 2."""
import glob
import json
import math

import numpy as np

files = sorted(glob.glob("results/**/logs/timing.json", recursive=True))
per_batch: dict[int, list[tuple[float, float, int]]] = {}
for p in files:
    d = json.load(open(p))
    e = [x for x in (d["entries"] if isinstance(d, dict) else d) if x.get("algo", "grpo") == "grpo"]
    e0 = next(x for x in e if x["batch"] == 128)
    s0 = np.asarray(e0["step_s"])
    for x in e:
        if x is e0:
            continue
        s = np.asarray(x["step_s"])
        r = min(s.size, s0.size)
        dd = np.log(x["batch"] / s[:r]) - np.log(128 / s0[:r])
        per_batch.setdefault(x["batch"], []).append((dd.mean(), dd.var(ddof=1), r))
print(f"{len(files)} passes: {', '.join(files)}")
print("| B | passes | r_q per pass | round sd (paired) | between-pass sd (paired) |")
print("|---|---|---|---|---|")
rounds, between = [], []
for b in sorted(per_batch):
    m = np.array([x[0] for x in per_batch[b]])
    w = np.array([x[1] for x in per_batch[b]])
    n = np.array([x[2] for x in per_batch[b]])
    if m.size < 2:
        continue
    bv = max(0.0, m.var(ddof=1) - np.mean(w / n))
    rounds.append(np.mean(w))
    between.append(bv)
    print(f"| {b} | {m.size} | {', '.join(f'{math.exp(v):.3f}' for v in m)} | "
          f"{math.sqrt(np.mean(w)):.3f} | {math.sqrt(bv):.3f} |")
print(f"\nper config: round sd {math.sqrt(np.mean(rounds) / 2):.3f} (mean over batches), "
      f"between-pass sd {math.sqrt(max(between) / 2):.3f} (the largest batch's, B = 64: the "
      "conservative choice)")
