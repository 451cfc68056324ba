"""A timing pass whose r_q interval covers the spread between passes (blocks, a
stopping rule), the fastest set from the same r_q as the verdicts, in-run vs pass
disagreement, why no rerun-agreement figure, the power with r_q's error, and the calibration of exactly the
test the report uses (simulated passes through the same decision functions)."""
import dataclasses
import math

import numpy as np

from jaxrl_scale.scaling import calibration as cal
from jaxrl_scale.scaling import drift, familywise
from jaxrl_scale.scaling.summary import RunStats

BIG = "grpo_P128_G8_sqrt"
D11 = dataclasses.replace(cal.ONE_WARM_START_12, seed_sd=0.11)   # the measured seed spread at 0.75


def _entries(block_sd, round_sd, blocks, rounds, seed=0, log_rq=0.0):
    rng = np.random.default_rng(seed)
    blk = np.repeat(block_sd * rng.standard_normal(blocks), rounds)
    rnd = round_sd * rng.standard_normal(blocks * rounds)
    e0 = {"batch": 128, "step_s": [1.0] * (blocks * rounds)}
    e = {"batch": 64, "step_s": list(0.5 / math.exp(log_rq) * np.exp(blk + rnd)),
         "block": list(np.repeat(np.arange(blocks), rounds))}
    return e, e0


def test_pass_interval_is_between_blocks():
    """Units are block means (df = blocks - 1), so a block-level shift that rounds alone
    would hide widens the interval; a pass without blocks keeps rounds as units."""
    e, e0 = _entries(block_sd=0.1, round_sd=0.01, blocks=4, rounds=8)
    p = drift.pass_ratio(e, e0)
    assert p.unit == "block" and p.units.size == 4 and p.df == 3
    rounds = drift.pass_ratio({k: v for k, v in e.items() if k != "block"}, e0)
    assert rounds.unit == "round" and rounds.df == 31
    assert abs(p.log - rounds.log) < 1e-12          # the same mean
    assert p.se > 3 * rounds.se                      # blocks see the block-level spread
    # units are each block's mean paired log ratio: block 0 by hand
    d = -np.log(np.asarray(e["step_s"][:8]) / 0.5)
    assert abs(p.units[0] - d.mean()) < 1e-12


def test_block_intervals_cover_the_spread_between_passes():
    """Many simulated passes of one study, each with block-level noise: the 90% interval of
    log r_q covers the true value at its level (per-round intervals would not)."""
    hit_b, hit_r, n = 0, 0, 600
    for s in range(n):
        e, e0 = _entries(block_sd=0.06, round_sd=0.1, blocks=4, rounds=8, seed=s)
        for p, acc in ((drift.pass_ratio(e, e0), "b"),
                       (drift.pass_ratio({k: v for k, v in e.items() if k != "block"}, e0),
                        "r")):
            ok = abs(p.log) <= familywise.t_ppf(0.95, p.df) * p.se
            hit_b += ok and acc == "b"
            hit_r += ok and acc == "r"
    se = math.sqrt(0.9 * 0.1 / n)
    assert abs(hit_b / n - 0.9) < 3 * se, hit_b / n
    assert hit_r / n < 0.9 - 5 * se, hit_r / n      # rounds alone: far below 90%


def test_stopping_rule_first_narrow_enough_block_count():
    rng = np.random.default_rng(0)
    tight = 0.001 * rng.standard_normal((2, 8))
    assert drift.blocks_to_stop(tight, 4, 0.07, 0.9) == 4
    wide = rng.standard_normal((2, 8))
    assert drift.blocks_to_stop(wide, 4, 0.07, 0.9) == 8
    mixed = np.vstack([tight[0], np.r_[1, -1, 1, -1, 0.001, 0.002, 0.001, 0.002]])
    n = drift.blocks_to_stop(mixed, 4, 2.0, 0.9)
    assert n >= 4 and drift.half_width(mixed[1, :n], 0.9) <= 2.0
    assert all(drift.half_width(mixed[1, :k], 0.9) > 2.0 for k in range(4, n))


def test_calibrated_null_error_coverage_and_stated_power_with_the_pass():
    """The default design with its timing pass (block noise from the recorded passes, the
    stopping rule) through familywise.sweep_tests: family-wise error <= 10% and T/T0
    coverage >= 90% (each within 3 Monte Carlo SE), and the power the report states at
    r_N = 1.3 is the power measured (within 3 SE)."""
    n = 400
    null = cal.fast_rates(D11, n, seed=21)
    se = math.sqrt(0.1 * 0.9 / n)
    assert null["any_wrong"]["rate"] <= 0.10 + 3 * se, null["any_wrong"]
    cov = null["coverage_T"]
    assert cov["rate"] >= 0.90 - 3 * math.sqrt(0.09 / cov["n"]), cov
    eff = cal.fast_rates(D11, n, seed=22, r_N={BIG: 1.3})
    measured, stated = eff["slower"][BIG]["rate"], eff["median_stated_power"]["1.3"]
    assert abs(measured - stated) < 3 * math.sqrt(stated * (1 - stated) / n) + 0.02, \
        (measured, stated)
    # r_q's error costs power: the same sweeps without a pass detect more
    assert null["median_min_detectable_r_N"] > cal.fast_rates(
        dataclasses.replace(D11, timing_blocks=0), 100, seed=21)["median_min_detectable_r_N"]


def test_full_path_uses_the_pass_like_the_fast_path():
    """One simulated sweep through analyze_runs with its simulated timing.json entries: r_q
    and T/T0 come from the pass (test named so, blocks as units), the power line carries the
    pass's SE, and a large cost is called slower."""
    from jaxrl_scale.scaling.analysis import analyze_runs
    rng = np.random.default_rng(4)
    runs = cal.simulate_runs(D11, rng, r_N={BIG: 1.5})
    timing = cal.simulate_timing(D11, rng, {})
    s = analyze_runs(runs, "auto", n_boot=20, target_fraction=0.75, timing=timing)
    assert s["drift"]["controlled"] and s["drift"]["unit"] == "block"
    assert s["configs"][BIG]["test"] == "paired t + interleaved r_q"
    assert s["configs"][BIG]["verdict"] == "slower"
    p = s["power"]["grpo"]
    assert p["pass_se"] > 0 and p["min_detectable_r_N"] > p["min_detectable_r_N_learning_only"]
    for g, st in s["configs"].items():
        if st.get("r_q_in_run") is not None:   # the row holds T/T0 = r_N / r_q
            assert abs(st["T_over_T0"] - st["r_N"] / st["r_q"]) < 1e-9 * st["T_over_T0"]


def _two_configs(per_run_T, units):
    configs = {g: {"algo": "grpo", "runs": [f"{g}_s{k}" for k in range(6)], "reached": True,
                   "is_reference": g == "A", "T": float(np.mean(t))}
               for g, t in per_run_T.items()}
    per_run = {f"{g}_s{k}": RunStats(N_star=1000.0 * (1 + 0.01 * k), q=1000.0 / t[k], seed=k)
               for g, t in per_run_T.items() for k in range(6)}
    offsets = {g: drift.PassRatio(np.asarray(u, float), "block") for g, u in units.items()}
    return configs, per_run, offsets


def test_fastest_set_uses_the_same_r_q_as_the_verdicts():
    """In-run times say B is much faster (a busy spell slowed A's runs); the pass says B's
    throughput equals A's and the learning is equal: the fastest set holds both, as the
    verdicts (B indistinguishable) do. Without the pass, B alone."""
    t = {"A": [2.0, 2.02, 1.98, 2.01, 1.99, 2.0], "B": [1.0, 1.01, 0.99, 1.0, 1.02, 0.98]}
    configs, per_run, offsets = _two_configs(t, {"B": [0.01, -0.01, 0.005, -0.005]})
    fw = familywise.sweep_tests(configs, per_run, {}, {"grpo": "A"}, 0.9, offsets=offsets)
    assert fw["configs"]["B"].verdict == "indistinguishable"
    assert sorted(fw["best_sets"]["grpo"]) == ["A", "B"]
    no = familywise.sweep_tests(configs, per_run, {}, {"grpo": "A"}, 0.9)
    assert no["best_sets"]["grpo"] == ["B"]
    # and where the pass shows B faster by a clear margin, B alone
    configs, per_run, offsets = _two_configs(t, {"B": [0.7, 0.71, 0.69, 0.7]})
    fw = familywise.sweep_tests(configs, per_run, {}, {"grpo": "A"}, 0.9, offsets=offsets)
    assert fw["best_sets"]["grpo"] == ["B"] and fw["configs"]["B"].verdict == "faster"


def test_in_run_and_pass_disagreement_is_named():
    d = {"configs": {"B": {}, "C": {}}}
    offsets = {"B": drift.PassRatio(np.log([0.78, 0.79, 0.77, 0.78]), "block"),
               "C": drift.PassRatio(np.log([0.9, 0.89, 0.91, 0.9]), "block")}
    in_run = {"B": {"log_ratio": math.log(0.9), "se": 0.005, "df": 44},
              "C": {"log_ratio": math.log(0.9), "se": 0.005, "df": 44}}
    out = drift.with_disagreements(d, in_run, offsets, 0.9)
    assert out["disagree"] == ["B"]
    assert out["configs"]["B"]["in_run_vs_pass_disagree"] and \
        not out["configs"]["C"]["in_run_vs_pass_disagree"]
    assert d == {"configs": {"B": {}, "C": {}}}   # a new record: the input is not edited


def test_no_figure_of_the_estimate_predicts_rerun_agreement():
    """Why the report has no rerun-agreement figure: two independent studies agree with a
    probability that depends on the truth (about 0.5 at theta = 2 se, 0.95 at 0), while any
    figure computed from one study's estimate misses it by far more than 0.05 somewhere:
    observed power (the old figure) and the flat-prior predictive alike."""
    from jaxrl_scale.scaling.reproducibility import rerun_agreement_gap
    rows = rerun_agreement_gap([0.0, 1.0, 2.0, 3.0, 4.0], n=50_000)
    for key in ("observed_power", "predictive"):
        assert max(abs(r[key] - r["actual"]) for r in rows) > 0.1, (key, rows)
    assert min(r["actual"] for r in rows) < 0.6 < 0.9 < max(r["actual"] for r in rows)
    from jaxrl_scale.scaling.summary import ConfigStats
    assert "rerun_agreement" not in {f.name for f in dataclasses.fields(ConfigStats)}


def test_evals_before_n_star_leave_out_the_shared_step_0():
    from jaxrl_scale.scaling.analysis import analyze_runs
    rng = np.random.default_rng(3)
    runs = cal.simulate_runs(cal.SAMPLED_3_SEEDS, rng)
    s = analyze_runs(runs, "auto", n_boot=20)
    for r in runs:
        x = s["runs"][r.name]
        if x["reached"]:
            n = r.eval_curve()[0]
            assert x["evals_before_N_star"] == int(np.sum((n > 0) & (n < x["N_star"])))
            assert n[0] == 0


def test_a_pass_on_a_loaded_machine_is_named():
    """The pass records the machine's load after each block; above 1.1 x cores (another job
    beside the pass) the throughput line says r_q measured a shared machine. The loads are
    the recorded ones: the main job's pass alone (results/sweep_default) and with one busy
    loop beside it (results/sweep_default/reruns/74eee37_busy), 2 cores."""
    e, e0 = _entries(0.01, 0.01, 4, 8)
    quiet = [{**x, "load_1min": [1.72, 1.63, 1.53, 1.51, 1.53], "cpus": 2} for x in (e, e0)]
    busy = [{**x, "load_1min": [3.22, 3.10, 2.90, 2.71, 2.74], "cpus": 2} for x in (e, e0)]
    assert drift.pass_load(quiet)["loaded"] is False and drift.pass_load(busy)["loaded"]
    assert drift.pass_load([e, e0]) is None            # recorded before loads were
    cfg = {"A": {"algo": "grpo", "batch": 128, "r_q": 1.0},
           "B": {"algo": "grpo", "batch": 64, "r_q": 0.5}}
    refs = {"grpo": ("A", [])}
    d_busy, _ = drift.interleaved_r_q(busy, cfg, refs, 0.9)
    d_quiet, _ = drift.interleaved_r_q(quiet, cfg, refs, 0.9)
    assert "CAUTION: the machine was loaded" in d_busy["note"] and "2.9 on 2 cores" in \
        d_busy["note"]
    assert "CAUTION" not in d_quiet["note"]
