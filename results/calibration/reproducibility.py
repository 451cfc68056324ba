"""The fragile mark against the rerun agreement it stands for: pairs of independent studies
simulated through `familywise.sweep_tests` (the default design, the calibration's fast path) at
the same truth; per config the share of pairs whose verdicts agree and the share of studies
whose verdict is not marked fragile. Two families of truths: one config (B = 1,024) at r_N,
the others null; every config at r_N. Run from the repository root:

    python results/calibration/reproducibility.py > results/calibration/reproducibility.md
"""
import math

from jaxrl_scale.scaling import calibration as cal
from jaxrl_scale.scaling import reproducibility as rep

PAIRS, TRUTHS = 400, (1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3)


def main():
    d = cal.DEFAULT
    names = [c[0] for c in d.configs]
    for df in (5, 10, 20, math.inf):
        b = rep.fragile_band(df, 4, 0.1)
        print(f"- df {df}, m = 4, alpha 0.1: fragile when |T| in [{b.lo:.2f}, {b.hi:.2f}] "
              f"(c = {b.c:.2f}); one test, every truth: max gap {b.max_gap:.3f}")
    lp = rep.rerun_agreement_bound(8.0)
    print(f"- any figure g(|T|) in [0, 1] (normal, m = 4, linear program): best max gap "
          f"{lp['max_gap']:.3f}; power at the estimate and flat-prior predictive: "
          + ", ".join(f"{max(abs(r[k] - r['actual']) for r in rep.rerun_agreement_gap([0, 1, 2, 3, 4], n=50_000)):.3f}"
                      for k in ("observed_power", "predictive")))
    print(f"\n{PAIRS} pairs of studies per row; agreement / share not marked fragile "
          "(gap); `all`: every config at that r_N, `one`: B = 1,024 only.\n")
    print("| truth | " + " | ".join(n.replace("_G8_sqrt", "") for n in names[1:]) + " |")
    print("|---|" + "---|" * (len(names) - 1))
    worst = 0.0
    for mode in ("one", "all"):
        for i, t in enumerate(TRUTHS):
            r_N = {g: t for g in names[1:]} if mode == "all" else {names[-1]: t}
            out = rep.rerun_pairs(d, PAIRS, seed=1000 * (mode == "all") + i, r_N=r_N)
            cells = []
            for g in names[1:]:
                a, nf = out[g]["agreement"], out[g]["not_fragile"]
                worst = max(worst, abs(a - nf))
                cells.append(f"{a:.3f} / {nf:.3f} ({nf - a:+.3f})")
            print(f"| {mode} r_N {t} | " + " | ".join(cells) + " |")
    print(f"\nLargest |gap|: {worst:.3f} (binomial SE of one cell's agreement about 0.02).")


if __name__ == "__main__":
    main()
