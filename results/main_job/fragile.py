"""The fragile mark (docs/science.md, Reproducibility of a verdict) of the two recorded main
jobs beside what decides it: each config's T/T0 statistic and the band of its Holm step,
recomputed from summary.json (log ratio, SE, df, the Holm order of the p-values) and checked
against the summary's own `fragile`; then, for each verdict that differs between the runs and is
not marked, the band that would mark it and what that band costs in calibration (its largest
gap to the rerun agreement, against the unconstrained band's). Run from the repository root:

    python results/main_job/fragile.py
"""
import json
import pathlib

from jaxrl_scale.scaling import reproducibility as rep

HERE = pathlib.Path(__file__).parent
BATCH = {"grpo_P8_G8_sqrt": 64, "grpo_P32_G8_sqrt": 256, "grpo_P64_G8_sqrt": 512,
         "grpo_P128_G8_sqrt": 1024}


def marks(path: pathlib.Path) -> dict:
    s = json.loads(path.read_text())
    alpha = 1 - s["ci_level"]
    tested = {g: c for g, c in s["configs"].items() if c.get("T_over_T0_test")}
    steps = dict(zip(tested, rep.holm_steps([c["p_value"] for c in tested.values()])))
    out = {}
    for g, c in tested.items():
        t = c["T_over_T0_test"]
        stat = t["log_ratio"] / t["se"]
        band = rep.fragile_band(t["df"], steps[g], alpha)
        frag = rep.is_fragile(stat, t["df"], steps[g], alpha)
        assert frag == c.get("fragile"), (path, g, frag, c.get("fragile"))
        out[BATCH.get(g, g)] = (c["verdict"], stat, band, frag, t["df"], steps[g])
    return out


def main():
    print("| B | run | verdict | T (log T/T0 / SE) | fragile band of its Holm step | fragile |")
    print("|---|---|---|---|---|---|")
    runs = (("quiet", HERE / "summary.json"), ("SSE4_2", HERE / "reruns/sse4_2/summary.json"))
    rows = {name: marks(p) for name, p in runs}
    for b in sorted(BATCH.values()):
        for name, _ in runs:
            v, stat, band, frag, _, _ = rows[name][b]
            print(f"| {b:,} | {name} | {v} | {stat:.2f} | [{band.lo:.2f}, {band.hi:.2f}] | "
                  f"{'yes' if frag else 'no'} |")
    alpha = 1 - json.loads(runs[0][1].read_text())["ci_level"]
    print("\n| B | unmarked differing verdict | df | Holm step | band that marks it | its max gap "
          "| the band's own max gap |")
    print("|---|---|---|---|---|---|---|")
    for b in sorted(BATCH.values()):
        if len({rows[name][b][0] for name, _ in runs}) == 1:
            continue
        for name, _ in runs:
            v, stat, band, frag, df, step = rows[name][b]
            if not frag:
                wide = rep.band_marking(stat, df, step, alpha)
                print(f"| {b:,} | {name}: {v}, T {stat:.2f} | {df:.1f} | {step} | "
                      f"[{wide.lo:.2f}, {wide.hi:.2f}] | {wide.max_gap:.3f} | {band.max_gap:.3f} |")


if __name__ == "__main__":
    main()
