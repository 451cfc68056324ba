"""Power vs seeds K at the powered eval cadence (fast path): PYTHONPATH=. python results/calibration/seeds.py"""
import dataclasses
from jaxrl_scale.scaling import calibration as c
B="grpo_P128_G8_sqrt"
for K in (5, 6, 12, 16):
    d=dataclasses.replace(c.POWERED, seeds=K)
    r13=c.fast_rates(d, 400, seed=21, r_N={B:1.3}); r15=c.fast_rates(d, 400, seed=22, r_N={B:1.5})
    print(K, "power1.3", r13["slower"][B]["rate"], "power1.5", r15["slower"][B]["rate"], "mde", round(r13["median_min_detectable_r_N"],3), flush=True)
