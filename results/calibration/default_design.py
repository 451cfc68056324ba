"""The default study's design (12 seeds, 5 sqrt batches, exact evals every 1,024, the auto target
at 0.75 of the way) at several seed spreads and eval jitters, fast path, 400 sweeps per arm:
PYTHONPATH=. python results/calibration/default_design.py"""
import dataclasses
from jaxrl_scale.scaling import calibration as cal
B = "grpo_P128_G8_sqrt"
print("| seed spread (log N*) | exact-score jitter | null FWER | T/T0 coverage (null) | power r_N=1.3 | power r_N=1.5 | median min_detectable_r_N | median seeds for 1.3 |")
print("|---|---|---|---|---|---|---|---|")
for sd, jit in ((0.11, 0.0), (0.18, 0.0), (0.2, 0.0), (0.2, 0.002), (0.23, 0.0), (0.23, 0.002)):
    d = dataclasses.replace(cal.ONE_WARM_START_12, seed_sd=sd, eval_jitter=jit)
    n = cal.fast_rates(d, 400, seed=1)
    r3 = cal.fast_rates(d, 400, seed=2, r_N={B: 1.3})
    r5 = cal.fast_rates(d, 400, seed=3, r_N={B: 1.5})
    f = lambda x: f"{x['rate']:.3f} ± {x['mc_se']:.3f}"
    print(f"| {sd} | {jit} | {f(n['any_wrong'])} | {f(n['coverage_T'])} | {f(r3['slower'][B])} | "
          f"{f(r5['slower'][B])} | {r3['median_min_detectable_r_N']:.3f} | "
          f"{r3['median_seeds_for_target']:.0f} |", flush=True)
