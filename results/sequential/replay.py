"""The sequential rule replayed on the recorded studies (`scaling/replay.py`): blocks in the
order they ran (the warm-starts of the main job's records; the seeds of the one-warm-start
studies, whose verdicts hold for that warm-start only), the full analysis at every look, and
the share of runs, responses and run seconds it would have used against the whole study.
Run from the repository root:

    python results/sequential/replay.py > results/sequential/replay.md

Each run is charged up to its target stop (3 evals after its N* at the whole study's target;
the reference runs and runs that never reached in full) on both sides.
"""
import os
import sys

from jaxrl_scale.scaling import sequential as sq
from jaxrl_scale.scaling.analysis import load_runs
from jaxrl_scale.scaling.replay import block_order, replay

STUDIES = ["results/main_job/logs", "results/main_job/reruns/sse4_2/logs",
           "results/sweep_default/logs",
           "results/sweep_replicate/logs", "results/main_job_one_warm_start/logs",
           "results/study_full/logs"]
SPENDINGS = [("O'Brien-Fleming", "obf", (1 / 2, 2 / 3, 1.0)),
             ("Pocock", "pocock", (1 / 3, 1 / 2, 2 / 3, 5 / 6, 1.0))]


def looks(n: int, fractions) -> tuple[int, ...]:
    out = []
    for f in fractions:
        w = max(2, round(f * n))
        if not out or w > out[-1]:
            out.append(w)
    return tuple(out)


def short(g: str) -> str:
    return g.replace("grpo_", "").replace("_G8", "").replace("_sqrt", "")


def main():
    print("| study | plan (looks at blocks) | sequential verdicts (blocks when decided) | "
          "whole study | runs | responses | run seconds |")
    print("|---|---|---|---|---|---|---|")
    for d in sys.argv[1:] or STUDIES:
        if not os.path.isdir(d):
            continue
        runs, _ = load_runs(d)
        n = len(block_order(runs)[1])
        for name, kind, fr in SPENDINGS:
            plan = sq.Plan(looks=looks(n, fr), spending=kind)
            r = replay(runs, plan, sweep_dir=d, n_boot=200)
            c = r["cost"]
            seq = "; ".join(f"{short(g)} {x.verdict}" + (f" ({x.blocks})" if x.blocks else "")
                            + (f" {x.ratio:.3g}" if x.ratio else "")
                            for g, x in sorted(r["decisions"].items()))
            fixed = "; ".join(f"{short(g)} {v}" for g, v in sorted(r["fixed"].items()))
            share = lambda k: f"{c['sequential'][k] / c['fixed'][k]:.2f}"
            print(f"| {d.replace('/logs', '')} | {name} {plan.looks} | {seq} | {fixed} | "
                  f"{c['sequential']['runs']}/{c['fixed']['runs']} | {share('responses')} | "
                  f"{share('seconds')} |", flush=True)


if __name__ == "__main__":
    main()
