"""Do timing passes of one study agree within their intervals?

    PYTHONPATH=. python results/timing_passes/run.py SWEEP_DIR OUT_DIR [EXTRA_PASSES]

Runs EXTRA_PASSES (default 3) more timing passes of the study in SWEEP_DIR (its sweep.json:
the same configs, warm-start and pass settings as its own timing.json, each pass in a fresh
process state of blocks), writes them to OUT_DIR/pass_K.json, then compares them with the
study's own pass (pass_0 = SWEEP_DIR/timing.json, and any OUT_DIR/pass_*.json already there):
per batch, r_q with its 90% interval per pass; whether every pair of passes agrees (Welch test
of their difference at 10%, Bonferroni over the pairs); and the study's verdicts re-analysed
with each pass (same runs, same target). Writes OUT_DIR/passes.md.
"""
import dataclasses
import glob
import itertools
import json
import math
import os
import sys
import time

from jaxrl_scale.experiment.config import TrainConfig
from jaxrl_scale.experiment.sweep import SweepConfig, enable_compile_cache, plan
from jaxrl_scale.experiment.timing import timing_pass
from jaxrl_scale.numbers import write_json
from jaxrl_scale.scaling import drift
from jaxrl_scale.scaling.analysis import analyze_sweep
from jaxrl_scale.scaling.familywise import t_ppf, t_sf

sweep_dir, out = sys.argv[1], sys.argv[2]
extra = int(sys.argv[3]) if len(sys.argv) > 3 else 3
os.makedirs(out, exist_ok=True)
rec = json.load(open(os.path.join(sweep_dir, "sweep.json")))
fields = {f.name for f in dataclasses.fields(SweepConfig)}
sw = {k: (tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) else v)
      for k, v in rec["sweep"].items() if k in fields}
sweep = SweepConfig(**sw)
base = TrainConfig.from_json(rec["base"])
runs = plan(sweep, base, rec.get("base_lrs"))
enable_compile_cache()
have = sorted(glob.glob(os.path.join(out, "pass_*.json")))
for k in range(len(have) + 1, len(have) + 1 + extra):
    t0 = time.time()
    data = timing_pass(sweep, runs, progress=False)
    data["wall_s"] = time.time() - t0
    write_json(os.path.join(out, f"pass_{k}.json"), data, indent=2)
    print(f"pass {k}: {data['algos']['grpo']['blocks']} blocks, {data['wall_s']:.0f} s",
          flush=True)

passes = [("0 (the study's)", json.load(open(os.path.join(sweep_dir, drift.TIMING_FILE))))]
passes += [(os.path.basename(p)[5:-5], json.load(open(p)))
           for p in sorted(glob.glob(os.path.join(out, "pass_*.json")))]
B0 = sweep.base_prompts * (sweep.base_group or min(sweep.group_sizes))
lines = ["| B | " + " | ".join(f"pass {n}" for n, _ in passes) + " | every pair agrees |",
         "|---|" + "---|" * len(passes) + "---|"]
est = {}
for n, p in passes:
    ent = [e for e in p["entries"] if e.get("algo", "grpo") == "grpo"]
    e0 = next(e for e in ent if e["batch"] == B0)
    for e in ent:
        if e is not e0:
            est.setdefault(e["batch"], []).append(drift.pass_ratio(e, e0))
pairs = len(passes) * (len(passes) - 1) // 2
all_ok = True
for b, rs in sorted(est.items()):
    cells = []
    for r in rs:
        c = t_ppf(0.95, r.df) * r.se if r.df > 0 else math.inf
        cells.append(f"{math.exp(r.log):.3f} [{math.exp(r.log - c):.3f}, {math.exp(r.log + c):.3f}]"
                     f" ({r.units.size} {r.unit}s)")
    ok = True
    for a, z in itertools.combinations(rs, 2):
        se = math.sqrt(a.se ** 2 + z.se ** 2)
        df = se ** 4 / (a.se ** 4 / a.df + z.se ** 4 / z.df)
        p = 2 * float(t_sf(abs(a.log - z.log) / se, df))
        ok &= p * pairs >= 0.1
    all_ok &= ok
    lines.append(f"| {b} | " + " | ".join(cells) + f" | {'yes' if ok else 'NO'} |")
verd = ["", "Verdicts of the study re-analysed with each pass (the same runs and target):", "",
        "| config | " + " | ".join(f"pass {n}" for n, _ in passes) + " |",
        "|---|" + "---|" * len(passes)]
rows = {}
for n, p in passes:
    s = analyze_sweep(sweep_dir, n_boot=200, timing=p["entries"])
    for g, st in s["configs"].items():
        if st.get("is_reference"):
            continue
        t = st.get("T_over_T0_ci") or [None, None]
        rows.setdefault(g, []).append(
            f"{st['verdict']} {st['T_over_T0']:.3f} [{t[0]:.3f}, {t[1]:.3f}]"
            + (f" (rerun agreement {st['rerun_agreement']:.0%})"
               if st.get("rerun_agreement") is not None else ""))
for g, c in sorted(rows.items()):
    verd.append(f"| {g} | " + " | ".join(c) + " |")
text = "\n".join([f"# Timing passes of {sweep_dir}", "",
                  f"r_q against B0 = {B0} per pass (90% interval, between blocks); 'every pair "
                  f"agrees': no pair's Welch test of the difference rejects at 10% with "
                  f"Bonferroni over the {pairs} pairs.", ""] + lines + verd
                 + ["", f"All batches agree across passes: {'yes' if all_ok else 'NO'}."])
open(os.path.join(out, "passes.md"), "w").write(text + "\n")
print(text)
