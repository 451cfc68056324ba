"""The sequential study against the fixed design on the same simulated studies: family-wise
error, power, wrong stops and cost, 400 studies per arm (the default design: 6 warm-starts x
2 seeds, tau 0.08, each warm-start's pass in its own machine state, seed SD 0.11), through
`familywise.sweep_tests` at every look. Run from the repository root:

    python results/sequential/calibrate.py > results/sequential/calibration.md

Arms: a null (every config identical) and B = 1,024 with true r_N 1.15, 1.3, 1.5 (the
others null). Cost: warm-starts (one SFT each), runs and responses, each run charged up to its
target stop (3 evals after its N*; reference runs to the budget), means over the studies.
"""
import sys

from jaxrl_scale.scaling import calibration as cal
from jaxrl_scale.scaling import sequential as sq
from jaxrl_scale.scaling.calibration_sequential import sequential_rates

N = int(sys.argv[1]) if len(sys.argv) > 1 else 400
BIG = "grpo_P128_G8_sqrt"
PLANS = [("**O'Brien-Fleming, looks at 3, 4, 6, futility 0.9 (the default)**",
          sq.Plan(looks=(3, 4, 6))),
         ("O'Brien-Fleming, looks at 3, 4, 6, no futility stop",
          sq.Plan(looks=(3, 4, 6), futility=None)),
         ("Pocock, looks at 2, 3, 4, 5, 6, futility 0.9",
          sq.Plan(looks=(2, 3, 4, 5, 6), spending="pocock"))]
ARMS = [("null", {}), ("r_N 1.15", {BIG: 1.15}), ("r_N 1.3", {BIG: 1.3}), ("r_N 1.5", {BIG: 1.5})]


def cell(r):
    lo, hi = r["ci95"]
    return f"{r['rate']:.3f} [{lo:.3f}, {hi:.3f}]"


def main():
    print(f"{N} simulated studies per arm (cal.DEFAULT); Wilson 95% intervals.\n")
    print("| plan | arm | FWER sequential | FWER fixed | B=1,024 slower: sequential | "
          "slower or not faster by the margin | slower: fixed | wrong stops | "
          "runs seq / fixed | responses seq / fixed | warm-starts seq | "
          "ended after (warm-starts: share) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for i, (name, plan) in enumerate(PLANS):
        for j, (arm, r_N) in enumerate(ARMS):
            r = sequential_rates(cal.DEFAULT, plan, N, seed=1000 + 10 * i + j, r_N=r_N)
            none = {"rate": 0.0, "ci95": [0.0, 0.0]}
            slow = lambda d: r[d][BIG].get("slower", none)
            against = slow("sequential")["rate"] + r["sequential"][BIG].get(
                "not faster by the margin", none)["rate"]
            c = r["cost"]
            print(f"| {name} | {arm} | {cell(r['fwer_sequential'])} | {cell(r['fwer_fixed'])} | "
                  f"{cell(slow('sequential'))} | {against:.3f} | {cell(slow('fixed'))} | "
                  f"{cell(r['wrong_stop'])} | {c['sequential']['runs'] / c['fixed']['runs']:.2f} | "
                  f"{c['sequential']['responses'] / c['fixed']['responses']:.2f} | "
                  f"{c['sequential']['warm_starts']:.2f} | "
                  + ", ".join(f"{k}: {v:.2f}" for k, v in r["looks"].items()) + " |",
                  flush=True)
    print("\nFWER: share of studies calling any config faster or slower against the truth's "
          "side (null: any call). Wrong stops: a config stopped as equivalent with its truth "
          "outside [0.8, 1.25], or as not faster by the margin with a truth below 0.9.")


if __name__ == "__main__":
    main()
