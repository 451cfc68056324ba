"""The analysis' decisions on simulated sweeps with a known truth.

CI version: vectorised simulation of the per-run estimates (monotone-cubic crossing of the auto
target, q = N* / t(N*)) pushed through `familywise.sweep_tests`, the function
`analysis.analyze_runs` takes its verdicts from; a few full `analyze_runs` sweeps check the
two paths agree. Slow version (-m slow): `calibration.calibrate`, every sweep through
`analyze_runs` (rates recorded in results/calibration/README.md).
"""
import dataclasses
import math

import numpy as np
import pytest

from jaxrl_scale.scaling import calibration as cal
from jaxrl_scale.scaling import familywise as fw
from jaxrl_scale.scaling.summary import RunStats

N = 300
BIG = "grpo_P128_G8_sqrt"


def _mc(r, z=2.0):
    return z * r["mc_se"]


@pytest.mark.parametrize("design", [cal.DEFAULT, cal.SAMPLED_3_SEEDS, cal.POWERED],
                         ids=["default", "sampled_3_seeds", "powered"])
def test_null_sweeps_name_a_winner_at_most_10_percent(design):
    r = cal.fast_rates(design, N, seed=11)
    assert r["any_wrong"]["rate"] <= 0.10 + _mc(r["any_wrong"]), r["any_wrong"]
    assert r["coverage_T"]["rate"] >= 0.88 - _mc(r["coverage_T"]), r["coverage_T"]
    assert r["coverage_r_N"]["rate"] >= 0.88 - _mc(r["coverage_r_N"])


def test_default_design_detects_r_N_1_3_with_80_percent_power():
    """The default study (5 sqrt-lr batches, 6 warm-starts x 2 seeds, exact evals every 1,024
    responses, a one-block timing pass per warm-start) with the interaction tau, each pass in
    its own machine state and the recorded seed spread at its target (0.11 in log N*): a
    true r_N = 1.3 at B = 1,024 is called slower >= 80% of the time, the other configs stay
    within the family-wise error."""
    r = cal.fast_rates(cal.DEFAULT, N, seed=17, r_N={BIG: 1.3})
    assert r["slower"][BIG]["rate"] >= 0.80 - _mc(r["slower"][BIG]), r["slower"][BIG]
    assert r["any_wrong"]["rate"] <= 0.10 + _mc(r["any_wrong"])
    assert r["median_min_detectable_r_N"] <= 1.3


def test_power_at_r_N_1_5_on_the_powered_design():
    """8 seeds, evals every 1,024 responses: a true r_N = 1.5 is called slower >= 80%; the
    other (null) configs stay within the family-wise error; its interval covers 1.5."""
    r = cal.fast_rates(cal.POWERED, N, seed=12, r_N={BIG: 1.5})
    assert r["slower"][BIG]["rate"] >= 0.80 - _mc(r["slower"][BIG]), r["slower"][BIG]
    assert r["any_wrong"]["rate"] <= 0.10 + _mc(r["any_wrong"])
    assert r["coverage_T_by_config"][BIG]["rate"] >= 0.88 - _mc(r["coverage_T_by_config"][BIG])


def test_sampled_3_seed_design_power_is_recorded_honestly():
    """The default before the powered design, 3 seeds, evals every 5,120: the power at r_N = 1.5 is well below 80% (about 0.4; the
    linear interpolation between two evals also biases r_N toward 1)."""
    r = cal.fast_rates(cal.SAMPLED_3_SEEDS, N, seed=13, r_N={BIG: 1.5})
    assert 0.2 < r["slower"][BIG]["rate"] < 0.7, r["slower"][BIG]


def test_full_analysis_agrees_with_the_fast_path():
    """A few sweeps through analyze_runs itself: no false call on a null sweep of a clear
    design, and a large effect (r_N = 2) is called slower."""
    rng = np.random.default_rng(0)
    d = cal.POWERED
    wrong = 0
    for _ in range(2):
        r = cal.one_sweep(d, rng, n_boot=20)
        wrong += any(c["verdict"] in ("faster", "slower") for c in r["configs"].values())
    assert wrong <= 1
    r = cal.one_sweep(d, rng, r_N={BIG: 2.0}, n_boot=20)
    assert r["configs"][BIG]["verdict"] == "slower"
    assert r["min_detectable_r_N"] and 1.0 < r["min_detectable_r_N"] < 2.0


def test_power_line_warns_when_few_evals_fall_before_n_star():
    """The analysis counts the evals before each run's N* (power[algo]["evals_before_N_star"],
    checked against the runs' own counts); the report warns when any run has fewer than 6
    and says N* was decided by evals when none has; a later target adds evals before N*."""
    from jaxrl_scale.scaling.analysis import analyze_runs
    from jaxrl_scale.report.design import power_lines
    rng = np.random.default_rng(3)
    s = analyze_runs(cal.simulate_runs(cal.SAMPLED_3_SEEDS, rng), "auto", n_boot=20)
    e = s["power"]["grpo"]["evals_before_N_star"]
    k = [x["evals_before_N_star"] for x in s["runs"].values()]
    assert e["needed"] == 6 and e["runs"] == len(k) == 24 and e["min"] == min(k)
    assert e["runs_below"] == sum(v < 6 for v in k) > 0 and e["median"] == np.median(k)
    line = power_lines(s)[0]
    assert line.startswith("Power [grpo]: with 3 seeds")
    assert f"Caution: {e['runs_below']} of 24 runs have fewer than 6 evals" in line
    runs = cal.simulate_runs(dataclasses.replace(cal.POWERED, eval_every=512), rng)
    early = analyze_runs(runs, "auto", n_boot=20, target_fraction=0.5)
    late = analyze_runs(runs, "auto", n_boot=20, target_fraction=0.75)
    assert late["target"] > early["target"] and late["target_rule"]["fraction"] == 0.75
    assert late["power"]["grpo"]["evals_before_N_star"]["min"] > \
        early["power"]["grpo"]["evals_before_N_star"]["min"]
    assert late["power"]["grpo"]["evals_before_N_star"]["runs_below"] == 0
    assert "Caution" not in power_lines(late)[0]
    assert "N* decided by evals: every run has >= 6 evals" in power_lines(late)[0]


def test_t_distribution_and_holm():
    assert fw.t_ppf(0.975, 1) == pytest.approx(12.7062, rel=1e-4)
    assert fw.t_ppf(0.95, 14) == pytest.approx(1.76131, rel=1e-4)
    assert float(fw.t_sf(2.0, 5)) == pytest.approx(0.05097, rel=1e-3)
    assert list(fw.holm([0.01, 0.04, 0.03, 0.5])) == pytest.approx([0.04, 0.09, 0.09, 0.5])


def test_paired_contrast_and_equivalence_on_known_data():
    """Seed effects shared by every config cancel in the paired design."""
    seeds = [0, 1, 2, 3]
    u = {0: 0.3, 1: -0.2, 2: 0.1, 3: -0.4}
    e = {0: 0.01, 1: -0.01, 2: 0.0, 3: 0.005}
    vals = {"ref": {k: u[k] for k in seeds},
            "a": {k: u[k] + math.log(1.5) + e[k] for k in seeds},
            "b": {k: u[k] - e[k] for k in seeds}}
    var = fw.pooled_variance(vals)
    assert var["paired"] and var["df"] == 6 and var["sigma"] < 0.02
    est, se = fw.contrast(vals, "a", "ref", var)
    assert est == pytest.approx(math.log(1.5), abs=0.01)
    t = fw.t_test(est, se, var["df"], 0.9, m=2)
    assert t["p"] < 1e-4 and t["sci"][0] > 1.3
    est, se = fw.contrast(vals, "b", "ref", var)
    assert fw.inside(fw.t_test(est, se, var["df"], 0.9, m=2)["sci"])   # alike
    # Unpaired (seed sets differ): one-way pooled variance, seed spread no longer cancels.
    vals["b"] = {10 + k: v for k, v in vals["b"].items()}
    assert not fw.pooled_variance(vals)["paired"]


@pytest.mark.slow
def test_calibration_through_analyze_runs_slow():
    r = cal.calibrate(cal.SAMPLED_3_SEEDS, 150, seed=0, effects=(1.5,), n_boot=50)
    assert r["null_fwer"]["rate"] <= 0.10 + _mc(r["null_fwer"])
    assert r["coverage_T"]["rate"] >= 0.88 - _mc(r["coverage_T"])


def test_seeds_needed_is_the_smallest_design_that_reaches_1_3():
    """Exact arithmetic: at the returned K the min detectable r_N is <= 1.3, at K - 1 it is
    not; fewer configs (a milder Holm step) never need more seeds; a hopeless spread is None."""
    lim = math.log(fw.DESIGN_TARGET_R_N)
    for sigma, c, m in ((0.18, 8, 7), (0.23, 8, 7), (0.2, 4, 3), (0.05, 8, 7), (0.31, 10, 13)):
        k = fw.seeds_needed(sigma, c, m, 0.1)
        mde = lambda kk: fw.min_detectable_log_ratio(sigma * math.sqrt(2 / kk),
                                                     (c - 1) * (kk - 1), 0.1, m)
        assert mde(k) <= lim and (k == 2 or mde(k - 1) > lim), (sigma, c, m, k)
        assert fw.seeds_needed(sigma, 4, 3, 0.1) <= k
    assert fw.seeds_needed(3.0, 8, 7, 0.1) is None
    d = fw.design_for_target({"configs": 8, "sigma_log_N": 0.23, "paired": True}, 7, 0.1, 3)
    assert d["this_family"]["runs"] == 8 * d["this_family"]["seeds"]
    assert d["small_family"]["configs"] == 4 and d["small_family"]["tests"] == 3
    assert d["this_family"]["runs_factor"] == pytest.approx(d["this_family"]["seeds"] / 3)


def test_the_seeds_the_power_line_asks_for_give_the_stated_power():
    """Simulated sweeps with a known truth: the seeds 3-seed sweeps ask for (median over
    sweeps of the power line's number) detect a true r_N = 1.3 with 80% power, within Monte
    Carlo error, and keep the family-wise error; 3 seeds detect it far less often."""
    k = cal.fast_rates(dataclasses.replace(cal.POWERED, seeds=3), 100, seed=14)[
        "median_seeds_for_target"]
    assert 10 <= k <= 20, k      # sigma about 0.2 in log N*: 14 at the recorded spread
    r = cal.fast_rates(dataclasses.replace(cal.POWERED, seeds=int(k)), N, seed=15,
                       r_N={BIG: 1.3})
    assert r["slower"][BIG]["rate"] >= 0.80 - _mc(r["slower"][BIG]), r["slower"][BIG]
    assert r["any_wrong"]["rate"] <= 0.10 + _mc(r["any_wrong"])
    r3 = cal.fast_rates(dataclasses.replace(cal.POWERED, seeds=3), N, seed=16, r_N={BIG: 1.3})
    assert r3["slower"][BIG]["rate"] < 0.4, r3["slower"][BIG]


def test_power_line_says_what_design_reaches_1_3():
    from jaxrl_scale.report.design import power_lines
    from jaxrl_scale.scaling.analysis import analyze_runs
    s = analyze_runs(cal.simulate_runs(cal.SAMPLED_3_SEEDS, np.random.default_rng(5)), "auto",
                     n_boot=20)
    d = s["power"]["grpo"]["design_for_target"]
    line = power_lines(s)[0]
    assert (f"To detect r_N >= 1.3 with 80% power at this spread it needs "
            f"{d['this_family']['seeds']} seeds per config") in line, line
    assert "with the reference and 3 other configs" in line


# Warm-starts: the SFT warm-start is a random draw whose interaction with the config
# (tau = 0.08 in log r_N between the two recorded default studies) no seed count averages out.
TAU = 0.08
ONE_WARM_START = dataclasses.replace(cal.DEFAULT_NO_PASS, tau=TAU)
TWELVE_WARM_STARTS = dataclasses.replace(ONE_WARM_START, warm_starts=12, seeds=1)
SEVEN_BY_THREE = dataclasses.replace(ONE_WARM_START, warm_starts=7, seeds=3)


def test_one_warm_start_names_false_winners_under_interaction():
    """12 seeds from one warm-start: the interaction is a fixed effect of that warm-start,
    so a null sweep names a faster or slower config far above alpha and T/T0 intervals miss
    the population's value (measured 0.51 and coverage 0.64 at 400 sweeps)."""
    r = cal.fast_rates(ONE_WARM_START, N, seed=21)
    assert r["any_wrong"]["rate"] > 0.3, r["any_wrong"]
    assert r["coverage_T"]["rate"] < 0.8, r["coverage_T"]


@pytest.mark.parametrize("design", [TWELVE_WARM_STARTS, SEVEN_BY_THREE], ids=["12x1", "7x3"])
def test_warm_start_blocks_hold_the_error_rate(design):
    """Warm-starts as blocks (each config's seed mean per warm-start is one unit of the
    paired test): the interaction is in the error term, the null family-wise error stays at
    alpha = 0.1 and T/T0 intervals cover the population's ratio; a true r_N = 1.3 at
    B = 1,024 is still called slower most of the time."""
    r = cal.fast_rates(design, N, seed=21)
    assert r["any_wrong"]["rate"] <= 0.10 + _mc(r["any_wrong"]), r["any_wrong"]
    assert r["coverage_T"]["rate"] >= 0.88 - _mc(r["coverage_T"]), r["coverage_T"]
    p = cal.fast_rates(design, N, seed=22, r_N={BIG: 1.3})
    assert p["slower"][BIG]["rate"] >= 0.70 - _mc(p["slower"][BIG]), p["slower"][BIG]


def test_interaction_sd_interval_covers_tau():
    """With seeds inside each warm-start the interaction sd is separable from the seed noise:
    its 90% interval covers the simulated tau at about its level."""
    r = cal.fast_rates(SEVEN_BY_THREE, N, seed=23)
    assert r["coverage_tau"]["rate"] >= 0.85 - _mc(r["coverage_tau"]), r["coverage_tau"]


def test_analysis_takes_warm_starts_as_blocks():
    """Runs whose configs name different warm-starts (init_checkpoint): analyze_runs sets
    the auto target per warm-start on its own reference runs, tests with warm-starts as the
    units (the interaction in the error term) and reports tau with its interval; one
    warm-start keeps the seeds as units."""
    from jaxrl_scale.scaling.analysis import analyze_runs
    design = dataclasses.replace(SEVEN_BY_THREE, warm_starts=4, seeds=2,
                                 configs=SEVEN_BY_THREE.configs[:3])
    s = analyze_runs(cal.simulate_runs(design, np.random.default_rng(5)), "auto", n_boot=50)
    fam = s["familywise"]["families"]["grpo"]
    assert fam["units"] == "warm-starts" and fam["warm_starts"] == 4 and fam["df"] == 2 * 3
    tau = fam["tau_log_N"]
    assert tau["ci"][0] <= tau["tau"] <= tau["ci"][1]
    blocks = {r["block"] for r in s["runs"].values()}
    assert blocks == {"w0", "w1", "w2", "w3"}
    targets = {r["block"]: r["target"] for r in s["runs"].values()}
    assert len(set(targets.values())) > 1            # each warm-start its own target
    one = analyze_runs(cal.simulate_runs(dataclasses.replace(design, warm_starts=1, seeds=4),
                                         np.random.default_rng(5)), "auto", n_boot=50)
    assert "units" not in one["familywise"]["families"]["grpo"]           # seeds as units
    assert all("block" not in r for r in one["runs"].values())


# A timing pass in another machine state than the learning: log r_q moves by N(0, 0.045) per
# config for the whole pass (the rms quiet-vs-loaded difference of the recorded passes).
STATE = 0.045


def test_one_pass_in_another_machine_state_inflates_the_error():
    """The default design's single pass: its machine state is a fixed effect of the study,
    and a null sweep names a faster or slower config well above alpha (0.23 at 400 sweeps)."""
    r = cal.fast_rates(dataclasses.replace(cal.ONE_WARM_START_12, state_sd=STATE), N, seed=31)
    assert r["any_wrong"]["rate"] > 0.15, r["any_wrong"]


def test_a_pass_per_warm_start_holds_the_error_rate_under_state_shifts():
    """12 warm-starts x 1 seed, each warm-start timed by its own pass in its own machine
    state (`sweep.run_sweep` runs the pass after that warm-start's runs), with the
    interaction tau: the state and the interaction vary with the units, the null
    family-wise error stays at alpha, intervals cover, r_N = 1.3 is found."""
    design = dataclasses.replace(cal.ONE_WARM_START_12, tau=TAU, state_sd=STATE, warm_starts=12,
                                 seeds=1)
    r = cal.fast_rates(design, N, seed=31)
    assert r["any_wrong"]["rate"] <= 0.10 + _mc(r["any_wrong"]), r["any_wrong"]
    assert r["coverage_T"]["rate"] >= 0.88 - _mc(r["coverage_T"]), r["coverage_T"]
    p = cal.fast_rates(design, N, seed=32, r_N={BIG: 1.3})
    assert p["slower"][BIG]["rate"] >= 0.70 - _mc(p["slower"][BIG]), p["slower"][BIG]


def test_a_pass_shared_by_warm_starts_is_not_each_ones(tmp_path):
    """block_timing: a tagged pass belongs to its warm-start; an untagged timing.json belongs
    to a block only when its directory holds no other block's runs (a pass shared by all
    warm-starts would not vary with them: the analysis then uses it as the one pass)."""
    import json
    from jaxrl_scale.scaling.analysis import block_timing
    from jaxrl_scale.scaling.io import make_run
    entry = {"batch": 64, "gen_batch_ratio": 1, "step_s": [0.1, 0.1]}
    def runs_in(d, names_blocks):
        return [make_run(n, [{"step": 0, "responses": 0, "time_s": 0.0, "score": 0.1}],
                         {"init_checkpoint": w}, path=str(d / n)) for n, w in names_blocks]
    shared = runs_in(tmp_path / "one", [("a_s0", "A"), ("a_s1", "B")])
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "timing.json").write_text(json.dumps([entry]))
    assert block_timing(shared, {"a_s0": "w0", "a_s1": "w1"}) == {}
    (tmp_path / "one" / "timing.json").write_text(json.dumps(
        {"entries": [dict(entry, warm_start="A"), dict(entry, warm_start="B")]}))
    got = block_timing(shared, {"a_s0": "w0", "a_s1": "w1"})
    assert [e["warm_start"] for e in got["w0"]] == ["A"] and len(got["w1"]) == 1
    apart = runs_in(tmp_path / "x", [("a_s0", "A")]) + runs_in(tmp_path / "y", [("a_s1", "B")])
    for d in ("x", "y"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "timing.json").write_text(json.dumps([entry]))
    assert set(block_timing(apart, {"a_s0": "w0", "a_s1": "w1"})) == {"w0", "w1"}


def test_runs_that_miss_the_target_count_at_their_budget():
    """A config some of whose runs do not reach the target is tested on lower bounds (such a
    run's N* and T at its budget) against the sigma of the configs that reached: "slower" is
    then conservative, nothing else is called. 6 warm-starts x 2 seeds, tau, half of the
    runs of a config with true r_N 2 censored: called slower nearly always; a null config
    censored at its own median N* is called slower at most alpha / 4 (its share of Holm)."""
    rng = np.random.default_rng(3)
    W, K, names = 6, 2, ["ref", "a", "b", "slow"]
    slower = {"b": 0, "slow": 0}
    for _ in range(N):
        inter = 0.08 * rng.standard_normal((len(names), W))
        per_run, configs = {}, {}
        for c, g in enumerate(names):
            mu = {"slow": math.log(2.0)}.get(g, 0.0)
            runs = []
            for k in range(W * K):
                n = 6000 * math.exp(mu + inter[c, k // K] + 0.11 * rng.standard_normal())
                cap = {"slow": 12000.0, "b": 6000.0}.get(g, math.inf)
                ok = n <= cap
                per_run[f"{g}_{k}"] = RunStats(N_star=n if ok else None, q=1000.0, seed=k,
                                               block=f"w{k // K}", reached=ok,
                                               censored_at=None if ok else cap)
                runs.append(f"{g}_{k}")
            reached = all(per_run[r].reached for r in runs)
            configs[g] = {"algo": "grpo", "runs": runs, "reached": reached,
                          "is_reference": g == "ref", "T": 6.0 if reached else None}
        out = fw.sweep_tests(configs, per_run, {}, {"grpo": "ref"}, 0.9)
        for g in slower:
            f = out["configs"].get(g)
            assert configs[g]["reached"] or f is None or f.verdict in (
                "slower", "not reached"), (g, f)
            slower[g] += bool(f and f.verdict == "slower")
    assert slower["slow"] / N >= 0.95, slower
    assert slower["b"] / N <= 0.1 / 4 + 2 * math.sqrt(0.025 * 0.975 / N), slower
