"""Intervals and verdicts tested like math: synthetic sweeps with a known answer.

Every run is one true learning curve J(N) plus binomial eval noise (eval_n graded samples per
eval) and jittered step times; the analysis must recover what was built in.
"""
import math
import os
import zlib

import numpy as np
import pytest

from jaxrl_scale import scaling
from jaxrl_scale.scaling import stats
from jaxrl_scale.scaling.synthetic import SyntheticRun, write_synthetic_run

EVAL_N = 4000


def curve(n, cost=1.0):
    """A saturating curve; cost > 1 needs cost x the responses for the same score."""
    return 0.3 + 0.3 * (1 - math.exp(-n / cost / 6000))


def write_config(root, name, batch, *, cost=1.0, seeds=3, q=300.0, base_batch=32, algo="grpo",
                 lr_rule="sqrt", budget=24000, noise=0, eval_n=EVAL_N, extra=None):
    for s in range(seeds):
        write_synthetic_run(
            root, SyntheticRun(
                f"{name}_s{s}", batch, 1, q, curve=lambda n: curve(n, cost), eval_n=eval_n,
            noise_seed=zlib.crc32(f"{name}/{s}/{noise}".encode()), steps=int(budget / batch),
            eval_every=max(1, 1024 // batch), step_jitter=0.1, seed=s, algo=algo,
            lr_rule=lr_rule, gen_s=(0.01, 1e-4),
            extra_config={"base_batch": base_batch, "max_grad_norm": 1.0, **(extra or {})}))


@pytest.mark.parametrize("trial", range(3))
def test_identical_configs_are_indistinguishable(tmp_path, trial):
    """(a) Six copies of one curve, 3 seeds each: at least 5 of 6 'indistinguishable' and no
    single config claimed best."""
    batches = (32, 64, 128, 256, 512, 1024)
    for b in batches:
        write_config(tmp_path, f"grpo_B{b}_sqrt", b, noise=trial)
    s = scaling.analyze_sweep(str(tmp_path))
    verdicts = [s["configs"][f"grpo_B{b}_sqrt"]["verdict"] for b in batches]
    assert verdicts.count("indistinguishable") >= 5, verdicts
    assert len(s["best_set"]) >= 2 and s["best"] == s["best_set"]
    assert s["reference_config"] == "grpo_B32_sqrt"
    assert s["signal_to_noise"] > 6 and s["eval_se_source"] == "eval_n"
    for b in batches:
        c = s["configs"][f"grpo_B{b}_sqrt"]
        lo, hi = c["r_N_ci"]
        assert lo <= c["r_N"] <= hi and c["seeds"] == 3 and c["seeds_reached"] == 3
    # The invariance band comes from the eval noise: copies of one curve stay inside it.
    within = [s["configs"][f"grpo_B{b}_sqrt"]["invariance"]["within"] for b in batches[1:]]
    assert within.count(True) >= 3, within


def test_known_sample_cost_is_detected(tmp_path):
    """(b) True r_N = 1.5 at B = 256 with 3 seeds: 'slower', and its r_N interval covers 1.5."""
    write_config(tmp_path, "grpo_B32_sqrt", 32)
    write_config(tmp_path, "grpo_B64_sqrt", 64)
    write_config(tmp_path, "grpo_B256_sqrt", 256, cost=1.5, budget=36000)
    s = scaling.analyze_sweep(str(tmp_path))
    c = s["configs"]["grpo_B256_sqrt"]
    assert c["verdict"] == "slower", c
    assert c["r_N_ci"][0] < 1.5 < c["r_N_ci"][1]
    # q is the same everywhere, so T/T0 tracks r_N, and r_q's interval covers 1.
    assert c["r_q_ci"][0] < 1 < c["r_q_ci"][1]
    ctb = s["critical_training_batch"]
    assert ctb["cost_detected_at"] == 256
    assert ctb["batch"] in (32, 64)
    assert s["best_set"] and "grpo_B256_sqrt" not in s["best_set"]


def test_point_estimates_are_the_centres_of_their_t_intervals(tmp_path):
    """r_N, r_q and T/T0 printed beside a t interval on the log ratio are that interval's
    centre (the geometric mean of the seed-paired ratios), not the ratio of seed means, which
    stays as *_ratio_of_means; T/T0 = r_N / r_q holds for the points."""
    write_config(tmp_path, "grpo_B32_sqrt", 32)
    write_config(tmp_path, "grpo_B128_sqrt", 128, cost=1.3, budget=36000, q=400.0)
    s = scaling.analyze_sweep(str(tmp_path))
    c = s["configs"]["grpo_B128_sqrt"]
    assert c["test"] == "paired t"
    for name in ("r_N", "r_q", "T_over_T0"):
        lo, hi = c[name + "_ci"]
        assert math.log(c[name]) == pytest.approx(0.5 * (math.log(lo) + math.log(hi)),
                                                  rel=1e-9, abs=1e-12)
        assert c[name] == c[name + "_geo"]
        assert c[name + "_ratio_of_means"] is not None
    n_star = [s["runs"][f"grpo_B128_sqrt_s{k}"]["N_star"] / s["runs"][f"grpo_B32_sqrt_s{k}"]
              ["N_star"] for k in range(3)]
    assert c["r_N"] == pytest.approx(math.exp(np.mean(np.log(n_star))), rel=1e-9)
    assert c["T_over_T0"] == pytest.approx(c["r_N"] / c["r_q"], rel=1e-9)


def test_auto_target_fraction_is_the_studys_own(tmp_path):
    """A study's target_fraction (sweep.json) sets the auto target when its directory is
    re-analysed; an explicit one wins; logs without a record get 0.5."""
    import json
    write_config(tmp_path, "grpo_B32_sqrt", 32)
    write_config(tmp_path, "grpo_B64_sqrt", 64)
    plain = scaling.analyze_sweep(str(tmp_path), n_boot=20)
    (tmp_path / "sweep.json").write_text(json.dumps({"sweep": {"target_fraction": 0.75}}))
    rec = scaling.analyze_sweep(str(tmp_path), n_boot=20)
    given = scaling.analyze_sweep(str(tmp_path), n_boot=20, target_fraction=0.5)
    r = rec["target_rule"]
    assert plain["target_rule"]["fraction"] == 0.5 and r["fraction"] == 0.75
    assert rec["target"] == pytest.approx(r["start"] + 0.75 * (r["reach"] - r["start"]),
                                          abs=5e-5)   # rounded to 4 places
    assert given["target"] == plain["target"] < rec["target"]


def test_reference_is_the_base_batch_not_the_smallest(tmp_path):
    """(c) base_batch = 64 in config.json picks B = 64 although B = 32 is in the sweep."""
    for b in (32, 64, 128):
        write_config(tmp_path, f"grpo_B{b}_sqrt", b, base_batch=64, seeds=1)
    s = scaling.analyze_sweep(str(tmp_path), target=0.45)
    assert s["reference_config"] == "grpo_B64_sqrt"
    assert s["configs"]["grpo_B64_sqrt"]["r_N"] == 1.0
    assert s["configs"]["grpo_B64_sqrt"]["r_N_ci"] == [1.0, 1.0]
    # --reference still overrides
    s = scaling.analyze_sweep(str(tmp_path), target=0.45, reference="grpo_B128_sqrt")
    assert s["reference_config"] == "grpo_B128_sqrt"


def test_ppo_and_grpo_have_their_own_references(tmp_path):
    """(d) One directory, two algorithms: each config is judged against its own algorithm's
    reference, and a PPO run is never the reference of GRPO runs."""
    for b in (32, 64, 128):
        write_config(tmp_path, f"grpo_P{b // 8}_G8_sqrt", b, base_batch=32, seeds=2)
    for b in (16, 64, 256):
        write_config(tmp_path, f"ppo_P{b}_G1_sqrt", b, base_batch=64, seeds=2, algo="ppo",
                     cost=2.0, budget=48000)
    s = scaling.analyze_sweep(str(tmp_path))
    assert s["reference_configs"] == {"grpo": "grpo_P4_G8_sqrt", "ppo": "ppo_P64_G1_sqrt"}
    assert s["reference_config"] == "grpo_P4_G8_sqrt"
    for g, c in s["configs"].items():
        assert c["reference"] == s["reference_configs"][c["algo"]]
    assert s["configs"]["ppo_P64_G1_sqrt"]["r_N"] == 1.0
    # PPO learns 2x slower than GRPO here: against GRPO's reference it would look slower.
    assert s["configs"]["ppo_P256_G1_sqrt"]["verdict"] != "slower"
    assert set(s["algos"]) == {"grpo", "ppo"}
    assert s["targets"]["grpo"] != s["targets"]["ppo"]


def test_reference_that_misses_the_target_is_reported(tmp_path):
    write_config(tmp_path, "grpo_B32_sqrt", 32, seeds=2)
    write_config(tmp_path, "grpo_B64_sqrt", 64, seeds=2)
    s = scaling.analyze_sweep(str(tmp_path), target=0.65)
    assert s["reference_reached"] is False
    assert all(c["verdict"] == "not reached" for c in s["configs"].values())
    assert s["best_set"] == []


def test_seeds_that_miss_are_not_dropped(tmp_path):
    """A config with one seed capped below the target keeps all 3 seeds: N* is 'not
    reached' (2/3 seeds), and the family-wise test, on lower bounds (the capped seed counts
    at its budget, far beyond the others' N*), calls it slower."""
    write_config(tmp_path, "grpo_B32_sqrt", 32)
    write_config(tmp_path, "grpo_B64_sqrt", 64, seeds=2)
    write_synthetic_run(tmp_path, SyntheticRun("grpo_B64_sqrt_s2", 64, 1, 300, curve=lambda n: 0.3,
                        eval_n=EVAL_N, noise_seed=5, steps=300, eval_every=16, seed=2,
                        extra_config={"base_batch": 32}))
    s = scaling.analyze_sweep(str(tmp_path), target=0.45)
    c = s["configs"]["grpo_B64_sqrt"]
    assert (c["verdict"], c["seeds"], c["seeds_reached"]) == ("slower", 3, 2)
    assert "lower bounds" in c["test"] and c["T_over_T0"] is None
    assert c["N_star"] is None and c["N_star_reached_mean"] > 0


def test_eval_noise_estimated_when_eval_n_is_absent(tmp_path):
    rng = np.random.default_rng(0)
    n = np.arange(0, 400) * 1000.0
    s = 0.3 + 1e-5 * n + 0.02 * rng.standard_normal(n.size)
    est = stats.noise_from_curve(n, s)
    assert 0.018 < est < 0.022
    for b in (32, 64):
        write_config(tmp_path, f"grpo_B{b}_sqrt", b, seeds=1, eval_n=None)
        # eval_n=None: no noise and no eval_n on the records
    summ = scaling.analyze_sweep(str(tmp_path), target=0.45)
    assert summ["eval_se_source"] == "estimated from the curve"


def test_critical_generation_batch_from_the_fit(tmp_path):
    """gen_s = 0.01 + 1e-4 B: d0, d1 recovered; doubling gains < 10% beyond 4.5 d0/d1."""
    for b in (32, 64, 128, 256):
        write_config(tmp_path, f"grpo_B{b}_sqrt", b, seeds=1)
    c = scaling.analyze_sweep(str(tmp_path))["critical_generation_batch"]
    assert c["d0"] == pytest.approx(0.01, rel=1e-6) and c["d1"] == pytest.approx(1e-4, rel=1e-6)
    assert c["batch"] == pytest.approx(4.5 * 0.01 / 1e-4)
    assert c["within_grid"] is False


def test_isotonic_and_quantiles():
    np.testing.assert_allclose(stats.isotonic([1, 3, 2, 4]), [1, 2.5, 2.5, 4])
    np.testing.assert_allclose(stats.isotonic([3, 2, 1]), [2, 2, 2])
    assert stats.first_crossing(np.array([0, 10, 20.]), np.array([0, .5, 1.]), 0.75) == 15
    assert stats.first_crossing(np.array([0, 10.]), np.array([0, .5]), 0.75) == math.inf
    lo, hi = stats.quantile_ci([1.0] * 90 + [math.inf] * 10, 0.9)
    assert lo == 1.0 and hi == math.inf
    # a ratio of "never" to "never" is undefined, not 1
    assert math.isnan(stats.ratio(np.inf, np.inf))


def test_analysis_is_deterministic(tmp_path):
    for b in (32, 64):
        write_config(tmp_path, f"grpo_B{b}_sqrt", b, seeds=2)
    a = scaling.analyze_sweep(str(tmp_path))
    b = scaling.analyze_sweep(str(tmp_path))
    assert a["configs"]["grpo_B64_sqrt"]["T_over_T0_ci"] == \
        b["configs"]["grpo_B64_sqrt"]["T_over_T0_ci"]
    assert os.path.basename(str(tmp_path))  # the sweep is untouched by the analysis


def test_config_ratios_keep_every_estimate_with_its_source():
    """Each stage's estimate stays as built (bootstrap, t test, timing pass); the headline is a
    rule, and summary.json's flat keys round-trip through the typed value."""
    from jaxrl_scale.scaling.values import BOOTSTRAP, TIMING_PASS, ConfigRatios, Ratio
    boot = {n: Ratio(v, [v * 0.9, v * 1.1], BOOTSTRAP)
            for n, v in (("r_N", 1.2), ("r_q", 1.5), ("T_over_T0", 0.8))}
    t = {n: Ratio(v, [v * 0.95, v * 1.05], "paired t", sci=[v * 0.9, v * 1.1])
         for n, v in (("r_N", 1.1), ("r_q", 1.4))}
    t["T_over_T0"] = Ratio(0.9, [0.85, 0.95], "paired t + interleaved r_q", sci=[0.8, 1.0])
    p = Ratio(1.25, [1.2, 1.3], TIMING_PASS)
    r = ConfigRatios(boot=boot, t=t, r_q_pass=p)
    assert r.headline("r_q") is p and r.in_run("r_q") is t["r_q"]
    assert r.headline("r_N") is t["r_N"] and r.headline("T_over_T0") is t["T_over_T0"]
    flat = r.flat()
    assert (flat["r_q"], flat["r_q_ci"]) == (1.25, [1.2, 1.3])
    assert (flat["r_q_in_run"], flat["r_q_in_run_ci"]) == (t["r_q"].value, t["r_q"].ci)
    assert flat["r_q_geo"] == 1.4 and flat["r_q_ratio_of_means"] == 1.5
    assert flat["r_N"] == 1.1 and flat["r_N_ci_boot"] == boot["r_N"].ci
    assert flat["T_over_T0_in_run"] == 0.8   # the bootstrap T/T0, from in-run q
    assert ConfigRatios.from_flat(flat, "paired t + interleaved r_q").flat() == flat
    only_boot = ConfigRatios(boot=boot)   # untested (e.g. one seed): the bootstrap's, no extras
    assert only_boot.flat() == {"r_N": 1.2, "r_q": 1.5, "T_over_T0": 0.8,
                                "r_N_ci": boot["r_N"].ci, "r_q_ci": boot["r_q"].ci,
                                "T_over_T0_ci": boot["T_over_T0"].ci}
    assert ConfigRatios.from_flat(only_boot.flat()) == only_boot
