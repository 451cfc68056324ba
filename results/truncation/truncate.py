"""What stopping non-reference runs at the target does to N*: recorded full-budget studies,
each non-reference run cut the way `--target_stop_evals=k` stops it (`records.target_stop`:
once the isotonic fit of its evals reached its target k evals ago), then analysed again at
the same targets. Run from the
repository root:

    python results/truncation/truncate.py > results/truncation/README.md

Per study and k: how many runs' N* moved by more than its standard error (the bootstrap 90%
interval's half-width / 1.645), the largest move in SEs, the verdicts before and after, and
the responses the cut saves (the reference runs are not cut: they set the target).
"""
import json
import math
import os
import shutil
import sys
import tempfile

from jaxrl_scale.experiment.records import target_stop
from jaxrl_scale.scaling.analysis import analyze_sweep

STUDIES = ["results/main_job_one_warm_start/logs",
           "results/sweep_default/logs", "results/sweep_replicate/logs"]
KS = (1, 2, 3)


def cut(records: list[dict], target: float, k: int) -> list[dict]:
    """The records a run with --target=target --target_evals=k would have written: up to
    the first eval at which `experiment.records.target_stop` lets it stop."""
    scores = []
    for r in records:
        if "score" in r:
            scores.append(r["score"])
            if r["step"] > 0 and target_stop(tuple(scores), target, k):
                return [x for x in records if x["step"] <= r["step"]]
    return records


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    print("# Stopping non-reference runs at the target: what it moves\n")
    print("`python results/truncation/truncate.py` (its docstring says what it does).\n")
    print("| study | k | runs cut | N* moved > 1 SE | largest move (SE) | median move (SE) | "
          "responses saved | verdicts (full budget -> cut) |")
    print("|---|---|---|---|---|---|---|---|")
    for study in STUDIES:
        if not os.path.isdir(study):
            continue
        full = analyze_sweep(study, target="auto", n_boot=400)
        ref = full["reference"] if isinstance(full.get("reference"), str) else None
        refs = {c for c, st in full["configs"].items() if st.get("is_reference")}
        for k in KS:
            tmp = tempfile.mkdtemp()
            dst = os.path.join(tmp, "logs")
            shutil.copytree(study, dst)
            saved = total = n_cut = 0
            for name, r in full["runs"].items():
                d = os.path.join(dst, name)
                recs = read(os.path.join(d, "metrics.jsonl"))
                total += max(x.get("responses", 0) for x in recs)
                if r["group"] in refs or r.get("target") is None:
                    continue
                kept = cut(recs, r["target"], k)
                if len(kept) < len(recs):
                    n_cut += 1
                    saved += (max(x.get("responses", 0) for x in recs)
                              - max(x.get("responses", 0) for x in kept))
                    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
                        f.writelines(json.dumps(x) + "\n" for x in kept)
            after = analyze_sweep(dst, target="auto", n_boot=400)
            moves = []
            for name, r in full["runs"].items():
                a = after["runs"][name]
                if r.get("N_star") and a.get("N_star") and r.get("N_star_ci"):
                    lo, hi = r["N_star_ci"]
                    se = (hi - lo) / (2 * 1.645) if math.isfinite(hi) else math.inf
                    moves.append(abs(a["N_star"] - r["N_star"]) / se if se > 0 else 0.0)
                elif bool(r.get("N_star")) != bool(a.get("N_star")):
                    moves.append(math.inf)
            moves.sort()
            v0 = ", ".join(f"{c.split('_')[1]} {st['verdict']}"
                           for c, st in full["configs"].items() if not st.get("is_reference"))
            v1 = ", ".join(f"{c.split('_')[1]} {st['verdict']}"
                           for c, st in after["configs"].items() if not st.get("is_reference"))
            print(f"| {study.replace('/logs', '')} | {k} | {n_cut} | "
                  f"{sum(m > 1 for m in moves)} of {len(moves)} | {moves[-1]:.2f} | "
                  f"{moves[len(moves) // 2]:.2f} | {saved:,} of {total:,} | "
                  f"{v0} -> {'same' if v0 == v1 else v1} |", flush=True)
            shutil.rmtree(tmp)
    print("\nSE: the run's bootstrap 90% interval of N* at full budget, half-width / 1.645.")
    # The main job ran with the first rule (stop k evals after the first raw eval at or above
    # the target): the runs it stopped whose monotone fit never reached the target.
    with open("results/truncation/first_rule/summary.json") as f:
        s = json.load(f)
    with open("results/truncation/first_rule/sweep.json") as f:
        budget = json.load(f)["sweep"]["max_responses"]
    cut_short = [(n, r) for n, r in sorted(s["runs"].items())
                 if not r["reached"] and r["responses_total"] < budget]
    print(f"\nThe first main job (3b05fc0; its summary in first_rule/) ran with the first rule (stop k = 3 evals after the first raw "
          f"eval at or above the target): {len(cut_short)} of its runs stopped so and read "
          "\"not reached\" (their fit pools the eval above the target down): " + "; ".join(
              f"{n} ({r['block']}: best eval {r['max_score']:.4f}, target {r['target']:.4f}, "
              f"stopped at {r['responses_total']:,.0f} of {budget:,})" for n, r in cut_short)
          + ". The rule since (`records.target_stop`) stops on the fit, the curve N* is read "
          "from; on the recorded studies above both rules cut the same runs.")


if __name__ == "__main__":
    sys.exit(main())
