"""Calibration of the analysis: simulated sweeps with a known truth through
the same `analysis.analyze_runs` a real sweep goes through, and the rates it achieves.

A simulated run of config c (cost r_N,c, throughput q_c) and seed k has the true curve

    J(N) = start + gain * (1 - exp(-N / (scale * r_N,c * exp(u_ck)))),   u_ck ~ N(0, seed_sd)

so its learning speed varies from seed to seed (about 0.18 in log N* in the recorded default
studies), evals are Binomial(eval_n, J) / eval_n at the design's eval points (the step-0 eval
shared by all configs of a seed, as the sweep shares it), and step seconds are B / q_c times
lognormal jitter (and, with `drift`, a slow spell of the machine that lands on whole configs,
as back-to-back seeds do). The truth is r_N,c and T/T0 = r_N,c / (q_c / q_0).

Rates (`calibrate`): the family-wise error of a null sweep (every config identical: any
"faster"/"slower" verdict is an error), the power to call a config with true r_N "slower",
and the coverage of the T/T0 (and r_N) intervals.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from jaxrl_scale.scaling import stats
from jaxrl_scale.scaling import drift
from jaxrl_scale.scaling.io import make_run, Run
from jaxrl_scale.scaling.summary import RunStats


@dataclasses.dataclass(frozen=True)
class Design:
    """A sweep design: configs as (name, batch, lr rule), the first is the reference."""
    configs: tuple[tuple[str, int, str], ...] = (
        ("grpo_P16_G8_sqrt", 128, "sqrt"), ("grpo_P8_G8_sqrt", 64, "sqrt"),
        ("grpo_P32_G8_sqrt", 256, "sqrt"), ("grpo_P64_G8_sqrt", 512, "sqrt"),
        ("grpo_P128_G8_sqrt", 1024, "sqrt"), ("grpo_P32_G8_fixed", 256, "fixed"),
        ("grpo_P64_G8_fixed", 512, "fixed"), ("grpo_P32_G4_sqrt", 128, "sqrt"))
    seeds: int = 3             # per warm-start
    # Warm-starts: each config runs `seeds` seeds from each of `warm_starts` SFT warm-starts;
    # a config's learning speed moves by N(0, tau) in log N* per warm-start (the warm-start x
    # config interaction, independent across configs and warm-starts).
    warm_starts: int = 1
    tau: float = 0.0
    max_responses: int = 15360
    eval_every: int = 5120
    eval_n: int = 1500 * 16     # samples per eval (binomial noise); 0: exact evals
    eval_jitter: float = 0.0    # sd of the policy's own step-to-step change in the exact score
    # truth of the learning curve and the noise, as recorded in results/sweep_default*
    start: float = 0.216
    gain: float = 0.07
    scale: float = 6000.0
    seed_sd: float = 0.18
    step_jitter: float = 0.05
    drift: float = 0.0          # sd of a per-config log slow-down (back-to-back seeds)
    q: float = 1000.0           # responses / s of every config (r_q = 1 unless q_ratio)
    target_fraction: float = 0.5   # the analysis' auto target (analysis.auto_target)
    # The timing pass r_q comes from: 0 blocks = none (r_q from in-run q). Per
    # block every config's log step time moves by N(0, pass_block_sd) (a fresh build at a
    # later minute), per round by N(0, pass_round_sd) (PASS_NOISE: from the recorded passes).
    timing_blocks: int = 0         # blocks before the stopping rule (experiment.timing)
    timing_max_blocks: int = 0     # ... at most (0: timing_blocks, no stopping rule)
    timing_tolerance: float = 0.07
    timing_rounds: int = 8
    pass_block_sd: float = 0.0
    pass_round_sd: float = 0.0
    # The machine state a pass runs in, which the learning did not share (a quiet pass for a
    # loaded study, or the reverse): every config's log step time moves by N(0, state_sd),
    # shared by all blocks and rounds of that pass. With several warm-starts each has its
    # own pass (`fast_rates`), so the state varies with the test's units.
    state_sd: float = 0.0

    @property
    def reference(self) -> str:
        return self.configs[0][0]


# Noise of the recorded timing passes (results/calibration/pass_noise.py reads them): per
# config, the sd of log step seconds between rounds of a pass and between passes of a study.
PASS_NOISE = {"pass_round_sd": 0.09, "pass_block_sd": 0.055}

# The default study before its powered design (8 configs, 3 seeds, 16 samples per prompt
# every 5,120 responses): recorded in results/calibration.
SAMPLED_3_SEEDS = Design()
# 8 seeds, evals every 1,024 responses (measured: 5 seeds give power 0.72 at r_N = 1.5,
# 6 seeds 0.79, 8 seeds 0.91; results/calibration).
POWERED = dataclasses.replace(SAMPLED_3_SEEDS, seeds=8, eval_every=1024)
# The default study before warm-starts as blocks: the sqrt-lr ladder B = 64..1024, one
# warm-start x 12 seeds, exact evals every 1,024 responses, one timing pass after the runs.
ONE_WARM_START_12 = dataclasses.replace(
    SAMPLED_3_SEEDS, configs=SAMPLED_3_SEEDS.configs[:5], seeds=12, eval_every=1024, eval_n=0,
    target_fraction=0.75, timing_blocks=4, timing_max_blocks=8, **PASS_NOISE)
# Its learning alone (r_q from in-run q): the design before the timing pass.
DEFAULT_NO_PASS = dataclasses.replace(ONE_WARM_START_12, timing_blocks=0)
# The warm-start x config interaction sd in log N* measured between the two recorded default
# studies, and the rms shift of log r_q between a quiet and a loaded timing pass of them (a
# pass in another machine state than its learning).
TAU, STATE_SD = 0.08, 0.045
# The seed spread of log N* at the default's target (three quarters of the way): 0.11
# (results/target_fraction), against 0.18 at half-way.
SEED_SD_AT_075 = 0.11
# The default study (experiment/study.py STUDIES["default"]): the same ladder from 6
# warm-starts x 2 seeds, a one-block timing pass after each warm-start, with the interaction
# and the machine-state shift of each pass in the simulation.
DEFAULT = dataclasses.replace(ONE_WARM_START_12, warm_starts=6, seeds=2, timing_blocks=1,
                              timing_max_blocks=1, tau=TAU, state_sd=STATE_SD,
                              seed_sd=SEED_SD_AT_075)


def _max_blocks(design: Design) -> int:
    return max(design.timing_blocks, design.timing_max_blocks)


def simulate_pass_units(design: Design, rng: np.random.Generator, q_ratio: dict,
                        n_sweeps: int) -> np.ndarray:
    """[S, C, max blocks] per-block log r_q that `drift.pass_ratio` computes from a simulated
    pass: each block's mean over rounds of the paired log ratio against the reference (the
    stopping rule, `drift.blocks_to_stop`, then takes the first n of them)."""
    C, nb, R = len(design.configs), _max_blocks(design), design.timing_rounds
    logq = np.log([q_ratio.get(c[0], 1.0) for c in design.configs])
    noise = (design.pass_block_sd * rng.standard_normal((n_sweeps, C, nb, 1))
             + design.pass_round_sd * rng.standard_normal((n_sweeps, C, nb, R)))
    if design.state_sd:
        noise = noise + design.state_sd * rng.standard_normal((n_sweeps, C, 1, 1))
    d = logq[None, :, None, None] - (noise - noise[:, :1])
    return d.mean(axis=3)


def simulate_timing(design: Design, rng: np.random.Generator, q_ratio: dict) -> list[dict]:
    """A simulated timing pass (timing.json's entries, `experiment.timing.time_blocks`): per
    block and round one step of every batch, B / q seconds times the design's noise (and a
    round-wide factor that the pairing cancels)."""
    C, nb, R = len(design.configs), _max_blocks(design), design.timing_rounds
    blk = design.pass_block_sd * rng.standard_normal((C, nb, 1))
    rnd = design.pass_round_sd * rng.standard_normal((C, nb, R))
    common = 0.1 * rng.standard_normal((1, nb, R))
    logt = blk + rnd + common
    units = (logt[:1] - logt[1:]).mean(axis=2)        # log r_q per block, q's truth aside
    nb = drift.blocks_to_stop(units, design.timing_blocks, design.timing_tolerance, 0.9)
    out = []
    for c, (name, batch, _) in enumerate(design.configs):
        q = design.q * q_ratio.get(name, 1.0)
        s = batch / q * np.exp(logt[c, :nb])
        out.append({"batch": batch, "algo": "grpo", "gen_batch_ratio": 1,
                    "step_s": s.reshape(-1).tolist(),
                    "block": np.repeat(np.arange(nb), R).tolist()})
    return out


def eval_scores(design: Design, p: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """What an eval reports for true scores p: Binomial(eval_n, p) / eval_n, or the exact
    score with the policy's own jitter (eval_n 0)."""
    if design.eval_n:
        return rng.binomial(design.eval_n, p) / design.eval_n
    return p + design.eval_jitter * rng.standard_normal(np.shape(p))


def simulate_runs(design: Design, rng: np.random.Generator,
                  r_N: dict[str, float] | None = None,
                  q_ratio: dict[str, float] | None = None) -> list[Run]:
    """One simulated sweep of `design` (all configs, warm-starts and seeds) as in-memory Runs;
    with two or more warm-starts each run's config names its own (init_checkpoint), and the
    seeds are numbered on across warm-starts (warm-start w holds seeds w * seeds, ...)."""
    r_N, q_ratio = r_N or {}, q_ratio or {}
    runs = []
    base = {"base_batch": design.configs[0][1], "algo": "grpo"}
    ev = np.arange(0, design.max_responses + 1, design.eval_every, dtype=float)
    W, K = design.warm_starts, design.seeds
    eval0 = eval_scores(design, np.full(W * K, design.start), rng)
    inter = (design.tau * rng.standard_normal((len(design.configs), W)) if design.tau
             else np.zeros((len(design.configs), W)))
    for c, (name, batch, rule) in enumerate(design.configs):
        q = design.q * q_ratio.get(name, 1.0)
        slow = math.exp(design.drift * rng.standard_normal()) if design.drift else 1.0
        steps = design.max_responses // batch
        for k in range(W * K):
            s = design.scale * r_N.get(name, 1.0) * math.exp(design.seed_sd *
                                                             rng.standard_normal()
                                                             + inter[c, k // K])
            p = design.start + design.gain * (1 - np.exp(-ev / s))
            sc = eval_scores(design, p, rng)
            sc[0] = eval0[k]
            dur = batch / q * slow * np.exp(design.step_jitter * rng.standard_normal(steps))
            t = np.cumsum(dur)
            recs = [{"step": i + 1, "responses": float((i + 1) * batch), "time_s": float(t[i])}
                    for i in range(steps)]
            recs += [{"step": int(n // batch), "responses": float(n), "score": float(v),
                      **({"eval_n": design.eval_n} if design.eval_n else {})}
                     for n, v in zip(ev, sc)]
            ws = {"init_checkpoint": f"warm_starts/{k // K}"} if W > 1 else {}
            runs.append(make_run(f"{name}_s{k}", recs, {**base, "name": f"{name}_s{k}",
                                                         "batch_train": batch,
                                                         "lr_rule": rule, "seed": k, **ws}))
    return runs


def one_sweep(design: Design, rng, r_N=None, q_ratio=None, n_boot: int = 50) -> dict:
    """Simulate one sweep and analyse it with `analysis.analyze_runs`; per non-reference
    config: verdict, truth, whether the T/T0 and r_N intervals cover it."""
    from jaxrl_scale.scaling.analysis import analyze_runs
    r_N, q_ratio = r_N or {}, q_ratio or {}
    runs = simulate_runs(design, rng, r_N, q_ratio)
    timing = simulate_timing(design, rng, q_ratio) if design.timing_blocks else None
    s = analyze_runs(runs, "auto", n_boot=n_boot, seed=int(rng.integers(2 ** 31)),
                     target_fraction=design.target_fraction, timing=timing)
    out = {}
    for name, _, _ in design.configs[1:]:
        st = s["configs"][name]
        truth_t = r_N.get(name, 1.0) / q_ratio.get(name, 1.0)
        cov = lambda ci, x: (ci[0] is not None and ci[1] is not None and ci[0] <= x <= ci[1])
        out[name] = {"verdict": st["verdict"], "T_truth": truth_t,
                     "cover_T": cov(st.get("T_over_T0_ci") or [None, None], truth_t),
                     "cover_r_N": cov(st.get("r_N_ci") or [None, None], r_N.get(name, 1.0)),
                     "T_over_T0": st.get("T_over_T0"), "alike_T": st.get("alike_T")}
    pw = ((s.get("power") or {}).get("grpo") or {}).get("power_r_N") or {}
    return {"configs": out, "best_set": s["best_set"],
            "min_detectable_r_N": s.get("min_detectable_r_N"), "stated_power": pw,
            "disagree": (s.get("drift") or {}).get("disagree")}


def calibrate(design: Design, n_sweeps: int, seed: int = 0, effects: Sequence[float] = (1.5,),
              n_boot: int = 50) -> dict:
    """Rates over `n_sweeps` null sweeps and `n_sweeps` sweeps per effect (one config, the
    largest sqrt batch, with that true r_N; the others null):

    null_fwer: share of null sweeps with any "faster"/"slower" verdict;
    power[e]: share of effect sweeps calling that config "slower" (T/T0 = r_N there);
    false_in_effect[e]: share of effect sweeps with a wrong verdict on another config;
    coverage_T / coverage_r_N: share of (sweep, config) intervals covering the truth, over
    all sweeps; mde: median reported min_detectable_r_N of the null sweeps.
    Each rate with its Monte Carlo SE."""
    rng = np.random.default_rng(seed)
    target_cfg = design.configs[4][0] if len(design.configs) > 4 else design.configs[-1][0]
    cov_T, cov_N, mde = [], [], []
    cov_by = {c[0]: [] for c in design.configs[1:]}
    null_err = []
    for _ in range(n_sweeps):
        r = one_sweep(design, rng, n_boot=n_boot)
        null_err.append(any(c["verdict"] in ("faster", "slower") for c in r["configs"].values()))
        cov_T += [c["cover_T"] for c in r["configs"].values()]
        cov_N += [c["cover_r_N"] for c in r["configs"].values()]
        for g, c in r["configs"].items():
            cov_by[g].append(c["cover_T"])
        if r["min_detectable_r_N"]:
            mde.append(r["min_detectable_r_N"])
    power, false_eff, cov_eff, stated = {}, {}, {}, {}
    for e in effects:
        hits, wrong = [], []
        for _ in range(n_sweeps):
            r = one_sweep(design, rng, r_N={target_cfg: e}, n_boot=n_boot)
            if r["stated_power"].get(f"{e:g}") is not None:
                stated.setdefault(f"{e:g}", []).append(r["stated_power"][f"{e:g}"])
            hits.append(r["configs"][target_cfg]["verdict"] == "slower")
            wrong.append(any(c["verdict"] in ("faster", "slower")
                             for g, c in r["configs"].items() if g != target_cfg))
            cov_T += [c["cover_T"] for c in r["configs"].values()]
            cov_N += [c["cover_r_N"] for c in r["configs"].values()]
            cov_eff.setdefault(f"{e:g}", []).append(r["configs"][target_cfg]["cover_T"])
        power[f"{e:g}"] = rate(hits)
        false_eff[f"{e:g}"] = rate(wrong)
    return {"design": dataclasses.asdict(design), "n_sweeps": n_sweeps, "seed": seed,
            "effect_config": target_cfg, "null_fwer": rate(null_err), "power": power,
            "false_in_effect": false_eff, "coverage_T": rate(cov_T),
            "coverage_r_N": rate(cov_N),
            "coverage_T_null_by_config": {g: rate(x) for g, x in cov_by.items()},
            "coverage_T_effect_config": {e: rate(x) for e, x in cov_eff.items()},
            "median_min_detectable_r_N": float(np.median(mde)) if mde else None,
            "median_stated_power": {e: float(np.median(x)) for e, x in stated.items()}}


def wilson(k: int, n: int, level: float = 0.95) -> list[float]:
    """Wilson score interval of a binomial rate k / n."""
    from jaxrl_scale.scaling.familywise import t_ppf
    if n == 0:
        return [math.nan, math.nan]
    z = t_ppf(1 - (1 - level) / 2, math.inf)
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [c - h, c + h]


def rate(x) -> dict:
    x = np.asarray(x, float)
    p = float(x.mean()) if x.size else math.nan
    return {"rate": p, "mc_se": float(math.sqrt(p * (1 - p) / x.size)) if x.size else math.nan,
            "n": int(x.size), "ci95": wilson(int(x.sum()), int(x.size)) if x.size else None}


# ----------------------------------------------------------------------------- fast path
# The CI version: the same simulation, vectorised over sweeps, with the per-run estimates of
# `run_stats.run_stats` (weighted isotonic fit, its monotone-cubic crossing of the auto target, q =
# N* / t(N*)) computed on arrays, then the same decision function `analyze_runs` calls
# (`familywise.sweep_tests`) per sweep. `one_sweep` / `calibrate` are the full path.


def isotonic_batch(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted isotonic (non-decreasing) fit of every row of y [R, E] (max-min formula:
    fit_i = max_{j <= i} min_{k >= i} mean_w(y[j..k]))."""
    R, E = y.shape
    cw = np.concatenate([np.zeros((R, 1)), np.cumsum(w, 1)], 1)
    cy = np.concatenate([np.zeros((R, 1)), np.cumsum(w * y, 1)], 1)
    j = np.arange(E)[:, None]
    k = np.arange(E)[None, :]
    with np.errstate(invalid="ignore", divide="ignore"):
        m = (cy[:, None, 1:] - cy[:, :E, None]) / (cw[:, None, 1:] - cw[:, :E, None])  # [R,j,k]
    m = np.where(k >= j, m, np.nan)
    out = np.empty((R, E))
    for i in range(E):
        inner = np.nanmin(m[:, : i + 1, i:], axis=2)          # min over k >= i, per j <= i
        out[:, i] = np.max(inner, axis=1)
    return out


def simulate_estimates(design: Design, n_sweeps: int, rng: np.random.Generator,
                       r_N: dict | None = None, q_ratio: dict | None = None,
                       target_fraction: float | None = None, min_se: float = 3.0) -> dict:
    """Per-run N* and q of n_sweeps simulated sweeps: {"N": [S, C, K], "q": [S, C, K]}."""
    r_N, q_ratio = r_N or {}, q_ratio or {}
    if target_fraction is None:
        target_fraction = design.target_fraction
    S, C, W = n_sweeps, len(design.configs), design.warm_starts
    K = W * design.seeds                      # runs per config, warm-start-major
    ev = np.arange(0, design.max_responses + 1, design.eval_every, dtype=float)
    E = ev.size
    scale = design.scale * np.array([r_N.get(c[0], 1.0) for c in design.configs])
    inter = (np.repeat(design.tau * rng.standard_normal((S, C, W)), design.seeds, axis=2)
             if design.tau else 0.0)    # no draw at tau = 0: the W = 1 stream as before
    s = scale[None, :, None] * np.exp(design.seed_sd * rng.standard_normal((S, C, K)) + inter)
    p = design.start + design.gain * (1 - np.exp(-ev / s[..., None]))
    sc = eval_scores(design, p, rng)
    sc[..., 0] = eval_scores(design, np.full((S, 1, K), design.start), rng)   # shared step 0
    y = sc.reshape(-1, E)
    if design.eval_n:
        c = np.clip(y, 0.5 / design.eval_n, 1 - 0.5 / design.eval_n)
        se = np.sqrt(c * (1 - c) / design.eval_n)
    else:        # analysis.eval_noise without a measured SE: the curve's jitter, or 1e-6
        se = np.full_like(y, 1e-6)
    if E >= 5:   # analysis.eval_noise: never below the curve's own jitter
        a = 0.5
        resid = y[:, 1:-1] - (a * y[:, :-2] + a * y[:, 2:])
        jit = np.sqrt(np.mean(resid ** 2 / 1.5, axis=1))
        se = np.maximum(se, jit[:, None])
    fit = isotonic_batch(y, 1 / se ** 2).reshape(S, C, K, E)
    se = se.reshape(S, C, K, E)
    # analysis.auto_target per warm-start block, on the block's reference runs: [S, W]
    blk = lambda x: x.reshape(S, W, design.seeds, *x.shape[2:])   # noqa: E731  [S, K..] -> [S, W, k..]
    start = blk(sc[:, 0, :, 0]).mean(2)
    reach = blk(fit[:, 0, :, -1]).min(2)
    se_ref = np.median(np.median(blk(se[:, 0]), axis=3), axis=2)
    target = np.round(start + np.maximum(target_fraction * (reach - start), min_se * se_ref), 4)
    per_run_target = np.repeat(target, design.seeds, axis=1)              # [S, K]
    N = stats.monotone_crossing_batch(ev, fit.reshape(-1, E), np.broadcast_to(
        per_run_target[:, None, :], (S, C, K)).reshape(-1)).reshape(S, C, K)
    q = np.empty((S, C, K))
    for c, (name, batch, _) in enumerate(design.configs):
        qc = design.q * q_ratio.get(name, 1.0)
        steps = design.max_responses // batch
        slow = np.exp(design.drift * rng.standard_normal((S, 1))) if design.drift else 1.0
        dur = batch / qc * np.exp(design.step_jitter * rng.standard_normal((S * K, steps)))
        dur = dur * np.repeat(slow, K, axis=0) if design.drift else dur
        cum = np.concatenate([np.zeros((S * K, 1)), np.cumsum(dur, 1)], 1)
        x = N[:, c].reshape(-1) / batch
        fin = np.isfinite(x)
        xi = np.clip(np.where(fin, x, 0), 0, steps)
        lo = np.minimum(np.floor(xi).astype(int), steps - 1)
        t = cum[np.arange(S * K), lo] + (xi - lo) * dur[np.arange(S * K), lo]
        with np.errstate(invalid="ignore", divide="ignore"):
            q[:, c] = np.where(fin & (t > 0), N[:, c].reshape(-1) / t, np.nan).reshape(S, K)
    return {"N": N, "q": q, "target": target}


def fast_rates(design: Design, n_sweeps: int, seed: int = 0, r_N: dict | None = None,
               q_ratio: dict | None = None, level: float = 0.9) -> dict:
    """Verdicts of `familywise.sweep_tests` on n_sweeps vectorised simulated sweeps: per
    config the share called faster / slower, the share of sweeps with any wrong call, and the
    coverage of the T/T0 and r_N intervals (over sweeps and non-reference configs)."""
    from jaxrl_scale.scaling import familywise
    r_N, q_ratio = r_N or {}, q_ratio or {}
    rng = np.random.default_rng(seed)
    est = simulate_estimates(design, n_sweeps, rng, r_N, q_ratio)
    W = design.warm_starts
    units = (simulate_pass_units(design, rng, q_ratio, n_sweeps * W).reshape(
        n_sweeps, W, len(design.configs), -1) if design.timing_blocks else None)
    names = [c[0] for c in design.configs]
    ref = names[0]
    truth = {g: r_N.get(g, 1.0) / q_ratio.get(g, 1.0) for g in names}
    calls = {g: [] for g in names[1:]}
    any_wrong, cov_T, cov_N, mde, need, stated, tau_cov = [], [], [], [], [], [], []
    cov_by = {g: [] for g in names[1:]}
    for i in range(n_sweeps):
        configs, per_run, offsets, block_offsets = sweep_inputs(design, est, units, i, level)
        fw = familywise.sweep_tests(configs, per_run, {}, {"grpo": ref}, level,
                                    offsets=offsets, block_offsets=block_offsets)
        wrong = False
        for g in names[1:]:
            f = fw["configs"].get(g)
            v = f.verdict if f else "not reached"
            calls[g].append(v)
            tr = truth[g]
            if v == "faster" and tr >= 1 or v == "slower" and tr <= 1:
                wrong = True
            ci = f.ratios["T_over_T0"].ci if f and "T_over_T0" in f.ratios else None
            cov_T.append(bool(ci and ci[0] <= tr <= ci[1]))
            cov_by[g].append(cov_T[-1])
            ci = f.ratios["r_N"].ci if f and "r_N" in f.ratios else None
            cov_N.append(bool(ci and ci[0] <= r_N.get(g, 1.0) <= ci[1]))
        any_wrong.append(wrong)
        tau = fw["families"].get("grpo", {}).get("tau_log_N")
        if tau:
            tau_cov.append(tau["ci"][0] <= design.tau <= tau["ci"][1])
        pw = familywise.power_fields(fw, level, "grpo")
        stated.append((pw["power"]["grpo"].get("power_r_N") or {}))
        if pw["min_detectable_r_N"]:
            mde.append(pw["min_detectable_r_N"])
            need.append((((pw["power"]["grpo"].get("design_for_target") or {})
                          .get("this_family") or {}).get("seeds")) or math.inf)
    return {"n_sweeps": n_sweeps, "seed": seed,
            "slower": {g: rate([v == "slower" for v in x]) for g, x in calls.items()},
            "faster": {g: rate([v == "faster" for v in x]) for g, x in calls.items()},
            "any_wrong": rate(any_wrong), "coverage_T": rate(cov_T),
            "coverage_r_N": rate(cov_N),
            "coverage_tau": rate(tau_cov) if tau_cov else None,
            "coverage_T_by_config": {g: rate(x) for g, x in cov_by.items()},
            "median_min_detectable_r_N": float(np.median(mde)) if mde else None,
            "median_seeds_for_target": float(np.median(need)) if need else None,
            "median_stated_power": {e: float(np.median([x[e] for x in stated if e in x]))
                                    for e in (stated[0] if stated else {})}}


def sweep_inputs(design: Design, est: dict, units: np.ndarray | None, i: int, level: float,
                 blocks: int | None = None, keep: Sequence[str] | None = None
                 ) -> tuple[dict, dict, dict | None, dict | None]:
    """What `familywise.sweep_tests` takes for simulated sweep i of `simulate_estimates`
    (and `simulate_pass_units`, [S, W, C, blocks]): (configs, per_run, offsets,
    block_offsets), on its first `blocks` blocks (all by default: warm-starts, or seeds of a
    one-warm-start design) and the configs in `keep` (all by default; the reference always)."""
    names = [c[0] for c in design.configs]
    ref = names[0]
    W = design.warm_starts if blocks is None or design.warm_starts == 1 else blocks
    n_runs = design.seeds * W if blocks is None or design.warm_starts > 1 else blocks
    per_run, configs = {}, {}
    for c, g in enumerate(names):
        if keep is not None and g != ref and g not in keep:
            continue
        runs = []
        for k in range(n_runs):
            n, q = float(est["N"][i, c, k]), float(est["q"][i, c, k])
            ok = math.isfinite(n)
            block = f"w{k // design.seeds}" if design.warm_starts > 1 else None
            per_run[f"{g}_s{k}"] = RunStats(N_star=n if ok else None, q=q, seed=k, reached=ok,
                                            block=block, censored_at=None if ok
                                            else design.max_responses)
            runs.append(f"{g}_s{k}")
        reached = all(per_run[r].reached for r in runs)
        nm = np.mean([per_run[r].N_star for r in runs]) if reached else math.inf
        qm = np.mean([per_run[r].q for r in runs])
        configs[g] = {"algo": "grpo", "runs": runs, "reached": reached,
                      "is_reference": g == ref, "T": nm / qm if reached else None}
    offsets, block_offsets = None, None
    if units is not None:     # one pass per warm-start, each to its stopping rule
        passes = []
        for w in range(W):
            nb = drift.blocks_to_stop(units[i, w, 1:], design.timing_blocks,
                                      design.timing_tolerance, level)
            passes.append({g: drift.PassRatio(units[i, w, c, :nb], "block")
                           for c, g in enumerate(names) if c > 0 and g in configs})
        if design.warm_starts > 1:
            block_offsets = {f"w{w}": p for w, p in enumerate(passes)}
        else:
            offsets = passes[0]
    return configs, per_run, offsets, block_offsets
