"""What a slow reward does to the best batch: the plan from the recorded main job's reference
runs (its 12 probe runs, target J* of the study, its six timing passes pooled), without and
with a simulated LLM judge that answers requests of R responses, c at once, in s seconds each
(`--external_s`, `--external_batch`, `--external_concurrency` of jaxrl-plan). Run from the
repository root:

    python results/planner_validation/judge.py > results/planner_validation/judge.md
"""
import json

from jaxrl_scale.numbers import fmt, fmt_ci
from jaxrl_scale.scaling import plan_compare, planner, step_cost

STUDY = "results/main_job"
JUDGES = [None, step_cost.ExternalTime(2.0, 8, 4), step_cost.ExternalTime(2.0, 64, 4),
          step_cost.ExternalTime(2.0, 8, 64)]


def main():
    with open(f"{STUDY}/summary.json") as f:
        s = json.load(f)
    with open(f"{STUDY}/logs/timing.json") as f:
        entries = json.load(f)["entries"]
    ref = s["reference_config"]
    probe = [r for r in planner.sweep_runs(STUDY) if r.group == ref]
    fit = step_cost.fit_step_times(entries, n_boot=1000, seed=0)
    batches = [64.0, 128.0, 256.0, 512.0, 1024.0]
    n_star = sum(s["runs"][r.name]["N_star"] for r in probe) / len(probe)
    print("| judge (s per request, responses per request, in flight) | external s per update "
          "at B = 64 / 128 / 1,024 | T/T0 at 64 / 256 / 512 / 1,024 | recommended | cannot "
          "separate from it |")
    print("|---|---|---|---|---|")
    for ext in JUDGES:
        plan = planner.batch_plan(probe, fit, batches, n_star=n_star, n_boot=1000, seed=0,
                                  external=ext)
        rows = {p["batch"]: p for p in plan["predictions"]}
        rec = plan["recommended"]
        name = "none" if ext is None else f"{ext.request_s:g} s, {ext.per_request}, " \
                                          f"{ext.concurrency}"
        secs = "-" if ext is None else " / ".join(
            f"{x:g}" for x in ext.seconds([64, 128, 1024]))
        print(f"| {name} | {secs} | " + " / ".join(
            fmt_ci(rows[b]["T_over_T0"], rows[b]["T_over_T0_ci"]) for b in (64, 256, 512, 1024))
              + f" | {fmt(rec['batch'])} | {plan_compare.separation_text(rec)} |")
    print(f"\nProbe: {len(probe)} reference runs of {STUDY} (B0 = 128), N* window at their mean "
          f"N* {n_star:,.0f}; step-time fit: the six timing passes of the study pooled; the "
          "link B_crit = B_simple / a of planner_link.json. The judge's seconds are added to "
          "every update, not overlapped with decoding (an upper bound).")


if __name__ == "__main__":
    main()
