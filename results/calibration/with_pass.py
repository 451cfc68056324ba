"""The default design calibrated with exactly the test the report uses: r_q
and T/T0 from a simulated timing pass (blocks with the noise of the recorded passes,
calibration.PASS_NOISE; the stopping rule of experiment.timing.time_blocks) through
`analysis.analyze_runs` (the full path), 400 sweeps per arm; then the vectorised fast path
(familywise.sweep_tests, the same decision function) at two seed spreads, with and without the
pass. PYTHONPATH=. python results/calibration/with_pass.py > results/calibration/with_pass.md"""
import dataclasses
import time

from jaxrl_scale.scaling import calibration as cal

B = "grpo_P128_G8_sqrt"
N = 400
ci = lambda x: f"{x['rate']:.3f} [{x['ci95'][0]:.3f}, {x['ci95'][1]:.3f}]"

print("## Full path: simulated sweeps and timing passes through analysis.analyze_runs\n")
print(f"Design: calibration.ONE_WARM_START_12 (5 sqrt batches x 12 seeds, exact evals every 1,024, target "
      f"0.75; timing pass of 4-8 blocks of 8 rounds, tolerance 0.07) at the measured seed "
      f"spread 0.11; {N} sweeps per arm; rates with 95% Wilson intervals.\n")
t0 = time.time()
d = dataclasses.replace(cal.ONE_WARM_START_12, seed_sd=0.11)
r = cal.calibrate(d, N, seed=38, effects=(1.15, 1.3, 1.5), n_boot=50)
print("| arm | rate | stated by the report (median) |")
print("|---|---|---|")
print(f"| null: family-wise error (any faster/slower) | {ci(r['null_fwer'])} | <= 0.10 |")
for e in ("1.15", "1.3", "1.5"):
    print(f"| r_N = {e} at B = 1,024: called slower | {ci(r['power'][e])} | "
          f"{r['median_stated_power'].get(e, float('nan')):.3f} |")
    print(f"| r_N = {e}: a wrong call on another config | {ci(r['false_in_effect'][e])} | "
          f"<= 0.10 |")
print(f"| T/T0 interval coverage (all sweeps, all configs) | {ci(r['coverage_T'])} | 0.90 |")
print(f"| r_N interval coverage | {ci(r['coverage_r_N'])} | 0.90 |")
print(f"\nmedian min detectable r_N (null sweeps): {r['median_min_detectable_r_N']:.3f}; "
      f"wall {time.time() - t0:.0f} s\n")

print("## Fast path (familywise.sweep_tests on vectorised simulations), 400 sweeps per arm\n")
print("| seed spread | timing pass | null FWER | T/T0 coverage | power r_N=1.15 (stated) "
      "| power r_N=1.3 (stated) | power r_N=1.5 (stated) | median min detectable r_N |")
print("|---|---|---|---|---|---|---|---|")
for sd in (0.11, 0.18):
    for blocks in (4, 0):
        dd = dataclasses.replace(cal.ONE_WARM_START_12, seed_sd=sd, timing_blocks=blocks,
                                 timing_max_blocks=8 if blocks else 0)
        n = cal.fast_rates(dd, N, seed=1)
        cells = []
        for i, e in enumerate((1.15, 1.3, 1.5)):
            x = cal.fast_rates(dd, N, seed=2 + i, r_N={B: e})
            cells.append(f"{ci(x['slower'][B])} ({x['median_stated_power'][f'{e:g}']:.3f})")
        print(f"| {sd} | {'4-8 blocks' if blocks else 'none (in-run r_q)'} | "
              f"{ci(n['any_wrong'])} | {ci(n['coverage_T'])} | {' | '.join(cells)} | "
              f"{n['median_min_detectable_r_N']:.3f} |", flush=True)
