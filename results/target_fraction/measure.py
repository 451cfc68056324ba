"""Where should the auto target sit? Re-analyse one recorded default study (the runs are fixed;
only the target moves) at several fractions of the way from the start to what every reference
seed reached, and print what decides the choice (evals before N*) beside what
it does to the design's power and to the verdicts.

    PYTHONPATH=. python results/target_fraction/measure.py [SWEEP_LOGS] > results/target_fraction/measure.txt

SWEEP_LOGS defaults to the record kept in the repository, results/sweep_default/logs; measure.txt
was made on results/sweep_default_2dfdd87/logs, which is no longer kept (in git at 74eee37).
"""
import sys
import warnings

from jaxrl_scale.scaling.analysis import analyze_sweep

LOGS = sys.argv[1] if len(sys.argv) > 1 else "results/sweep_default/logs"
warnings.filterwarnings("ignore")


def f3(x):
    return f"{x:.3g}"


print(f"sweep: {LOGS}")
for frac in (0.5, 0.6, 0.7, 0.75, 0.8):
    s = analyze_sweep(LOGS, target_fraction=frac)
    p = s["power"]["grpo"]
    e = p["evals_before_N_star"]
    print(f"\n## target fraction {frac}: J* = {s['target']}")
    print(f"evals before N*: fewest {e['min']}, median {e['median']:g}, runs with < 6: "
          f"{e['runs_below']} of {e['runs']} {e['configs_below']}")
    print(f"seed spread of log N* {f3(p['sigma_log_N'])} ({p['df']} df); min detectable r_N "
          f"{f3(s['min_detectable_r_N'])}, T/T0 {f3(s['min_detectable_T_over_T0'])}")
    for g, c in sorted(s["configs"].items(), key=lambda kv: kv[1]["batch"]):
        if c.get("is_reference"):
            print(f"  {g}: reference, N* {c['N_star']:.0f}")
            continue
        lo, hi = c["r_N_ci"]
        tl, th = c["T_over_T0_ci"]
        print(f"  {g}: N* {c['N_star']:.0f}, r_N {f3(c['r_N'])} [{f3(lo)}, {f3(hi)}], T/T0 "
              f"{f3(c['T_over_T0'])} [{f3(tl)}, {f3(th)}]: {c['verdict']}")
    ctb = s["critical_training_batch"]
    print(f"fastest set {s['best_set']}; critical training batch {ctb['batch']} "
          f"(cost detected at {ctb.get('cost_detected_at')})")
    print("findings: " + "; ".join(f"({x['id']}) {x['status']}" for x in s["findings"]))
