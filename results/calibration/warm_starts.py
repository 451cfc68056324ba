"""Warm-starts and machine states in the calibration: the family-wise error, power and
coverage of the design before warm-start blocks (one warm-start, one timing pass) against
warm-starts as blocks (one timing pass per warm-start; the default study since), 400
simulated sweeps per arm through
`familywise.sweep_tests`, with Wilson 95% intervals. Run from the repository root:

    python results/calibration/warm_starts.py > results/calibration/warm_starts.md

tau = 0.08: the warm-start x config interaction sd in log N* (the size measured between the
two recorded default studies); state = 0.045: the rms difference of log r_q between a quiet
and a loaded timing pass of the recorded studies, applied to the pass only (the learning ran
in another machine state).
"""
import dataclasses

from jaxrl_scale.scaling import calibration as cal

N, BIG, TAU, STATE = 400, "grpo_P128_G8_sqrt", 0.08, 0.045
D = cal.ONE_WARM_START_12
DESIGNS = [
    ("1 warm-start x 12 seeds, one pass (the default before warm-start blocks)", D),
    ("the same, pass in another machine state", dataclasses.replace(D, state_sd=STATE)),
    ("the same, with the interaction tau", dataclasses.replace(D, state_sd=STATE, tau=TAU)),
    ("12 warm-starts x 1 seed, a pass per warm-start, tau, state",
     dataclasses.replace(D, state_sd=STATE, tau=TAU, warm_starts=12, seeds=1)),
    ("7 warm-starts x 3 seeds, a pass per warm-start, tau, state",
     dataclasses.replace(D, state_sd=STATE, tau=TAU, warm_starts=7, seeds=3)),
    ("**the default: 6 warm-starts x 2 seeds, a one-block pass per warm-start, tau, state, "
     "seed SD 0.11**", cal.DEFAULT),
    ("the default at seed SD 0.18 (the spread at a half-way target)",
     dataclasses.replace(cal.DEFAULT, seed_sd=0.18)),
    ("the default at tau 0.16 (twice the measured interaction)",
     dataclasses.replace(cal.DEFAULT, tau=2 * TAU)),
]


def cell(r):
    lo, hi = r["ci95"]
    return f"{r['rate']:.3f} [{lo:.3f}, {hi:.3f}]"


def main():
    print("| design | null FWER | T/T0 coverage (null) | power r_N 1.15 | power r_N 1.3 | "
          "power r_N 1.5 |")
    print("|---|---|---|---|---|---|")
    for i, (name, d) in enumerate(DESIGNS):
        null = cal.fast_rates(d, N, seed=100 + i)
        pw = [cal.fast_rates(d, N, seed=200 + 10 * i + j, r_N={BIG: e})["slower"][BIG]
              for j, e in enumerate((1.15, 1.3, 1.5))]
        print(f"| {name} | {cell(null['any_wrong'])} | {cell(null['coverage_T'])} | "
              + " | ".join(cell(p) for p in pw) + " |")
    print(f"\n{N} sweeps per cell; power: B = 1,024 called slower with that true r_N, the "
          "other configs null.")
    for n, seed in ((2000, 999), (5000, 5000)):
        big = cal.fast_rates(cal.DEFAULT, n, seed=seed)
        print(f"\nThe default's null family-wise error at {n:,} sweeps: "
              f"{cell(big['any_wrong'])}; T/T0 coverage {cell(big['coverage_T'])}.")


if __name__ == "__main__":
    main()
