"""The planner's link B_crit = B_simple / a: fit, predictive draws, the fitted file, the plan."""
import dataclasses
import math
import os
import sys

import numpy as np
import pytest

from jaxrl_scale.scaling import noise, planner_link

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _point(study, a, b_simple=6000.0, b0=128.0, batches=(64, 256, 512, 1024), se=0.01):
    """A study whose measured r_N is exactly McCandlish's at B_crit = b_simple / a."""
    bc = b_simple / a
    y = tuple(math.log(noise.predicted_r_n(b, b0, bc)) for b in batches)
    return planner_link.StudyPoint(study, "grpo", b0, b_simple, (b_simple,) * 10,
                                   tuple(float(b) for b in batches), y, (se,) * len(batches))


def test_kappa_and_a_recover_the_truth():
    for a in (0.7, 1.0, 2.5):
        p = _point("s", a)
        assert p.kappa_meas == pytest.approx(a / 6000.0, rel=1e-4)
        assert p.log_a == pytest.approx(math.log(a), abs=1e-4)


def test_fit_is_mean_and_sd_of_log_a_and_skips_studies_without_sample_cost():
    pts = [_point(f"s{i}", a) for i, a in enumerate((1.5, 2.0, 3.0))]
    flat = dataclasses.replace(pts[0], study="flat", log_r_N=(0.0,) * 4)   # no sample cost
    link = planner_link.fit_link(pts + [flat], "grpo")
    la = np.log([1.5, 2.0, 3.0])
    assert link.n == 3 and "flat" not in link.studies
    assert link.mu == pytest.approx(la.mean(), abs=1e-4)
    assert link.sd == pytest.approx(la.std(ddof=1), abs=1e-4)


def test_predictive_draws_have_the_t_spread():
    link = planner_link.Link(math.log(2.0), 0.5, 6)
    a = link.draws(200_000, np.random.default_rng(0))
    q = np.quantile(np.log(a), [0.05, 0.95])
    from scipy import stats
    half = 0.5 * math.sqrt(1 + 1 / 6) * stats.t.ppf(0.95, 5)
    np.testing.assert_allclose(q, [math.log(2) - half, math.log(2) + half], atol=0.01)
    bc, bc_R = planner_link.b_crit_draws(6000.0, np.full(1000, 6000.0), link)
    assert bc == pytest.approx(3000.0) and np.median(bc_R) == pytest.approx(3000.0, rel=0.05)
    assert planner_link.IDENTITY.draws(3, np.random.default_rng(0)).tolist() == [1.0] * 3


def test_link_for_falls_back_to_all_then_identity():
    links = {"all": planner_link.Link(0.5, 0.4, 7), "grpo": planner_link.Link(0.8, 0.5, 6)}
    assert planner_link.link_for("grpo", links).mu == 0.8
    assert planner_link.link_for("ppo", links).mu == 0.5
    assert planner_link.link_for("ppo", {}) == planner_link.IDENTITY


def test_committed_link_is_the_fit_of_the_recorded_studies():
    """planner_link.json is what results/planner_validation/fit_link.py fits from the recorded
    studies (their summaries and the reference runs' logs)."""
    sys.path.insert(0, os.path.join(ROOT, "results", "planner_validation"))
    try:
        import fit_link
        cwd = os.getcwd()
        os.chdir(ROOT)
        try:
            got = planner_link.fit_links(fit_link.points())
        finally:
            os.chdir(cwd)
    finally:
        sys.path.pop(0)
    want = planner_link.load_links()
    assert set(got) == set(want)
    for k in got:
        assert got[k].n == want[k].n and got[k].studies == want[k].studies
        assert got[k].mu == pytest.approx(want[k].mu, abs=1e-9)
        assert got[k].sd == pytest.approx(want[k].sd, abs=1e-9)
    assert 0.4 < math.exp(want["grpo"].mu) and want["grpo"].n >= 3


def test_first_block_plan_of_the_recorded_main_job(tmp_path):
    """The main job's analysis plans from its first warm-start block's reference runs and
    that block's timing pass, for every batch it ran, and the report puts the plan beside the
    measured verdicts."""
    from jaxrl_scale.experiment.analyze import analyze_and_report
    from jaxrl_scale.scaling import plan_compare
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        analyze_and_report("results/main_job/logs", "auto", out=str(tmp_path))
    finally:
        os.chdir(cwd)
    import json
    with open(tmp_path / plan_compare.FIRST_BLOCK_PLAN) as f:
        plan = json.load(f)
    fb = plan["first_block"]
    assert fb["block"] == "w0" and len(fb["probe_runs"]) == 2
    assert all(n.startswith("grpo_P16_G8_sqrt_") for n in fb["probe_runs"])
    assert [p["batch"] for p in plan["predictions"]] == [64.0, 128.0, 256.0, 512.0, 1024.0]
    assert plan["b_crit_link"]["n"] >= 3
    report = (tmp_path / "report.md").read_text()
    assert "Planner predictions vs measured (plan_first_block.json)" in report
    assert "reference runs of warm-start block w0 alone" in report


def test_separation_splits_the_variance_and_says_what_would_separate():
    rng = np.random.default_rng(0)
    n = 20_000
    probe, link, pas = (s * rng.standard_normal(n) for s in (0.10, 0.02, 0.05))
    point = 0.15
    parts = {"point": point, "joint": point + probe + link + pas, "probe": point + probe,
             "link": point + link, "pass": point + pas}
    out = planner_link.separation(parts, 0.9)
    z = 1.6448536269514722
    # total var 0.0129; to separate: (0.15 / z)^2 = 0.00832; without the probe 0.0029
    want_probe = 0.01 / ((point / z) ** 2 - 0.0029)
    assert out["probe_runs_x"] == pytest.approx(want_probe, abs=0.15)
    # the pass alone cannot: the probe's 0.01 already exceeds what separates
    assert out["pass_x"] is None
    far = dict(parts, point=1.0, joint=1.0 + probe + link + pas)
    assert planner_link.separation(far, 0.9) == {"probe_runs_x": 1.0, "pass_x": 1.0}
    stuck = dict(parts, link=point + 0.2 * rng.standard_normal(n),
                 joint=point + probe + 0.2 * rng.standard_normal(n) + pas)
    assert planner_link.separation(stuck, 0.9) == {"probe_runs_x": None, "pass_x": None}


def test_plan_refuses_step_records_its_fit_does_not_describe(tmp_path):
    """sweep_replicate's first updates per run: the linear step-time fit misses B = 64's timed
    seconds by +150%; jaxrl-plan says so in one line and exits 2 (results/planner_validation/
    throughput_sources.md has every recorded study)."""
    import subprocess
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "experiments", "plan.py"),
         "--probe_run=results/sweep_replicate/logs/grpo_P16_G8_sqrt_s12",
         "--step_times_from=results/sweep_replicate", "--target=0.27",
         f"--json_out={tmp_path}/plan.json"], cwd=ROOT, capture_output=True, text=True,
        timeout=300)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: step_times_from: the step-time fit "
                                                   "misses its own records at B=64"), lines
    assert not (tmp_path / "plan.json").exists()


def test_external_time_enters_r_q_as_the_hand_computation():
    from jaxrl_scale.scaling import step_cost
    theta = np.array([0.05, 1e-4, 2e-4, 0.01])          # d0, d1, gamma, overhead
    ext = step_cost.ExternalTime(2.0, 8, 4)              # 2 s per 32 responses
    b, b0 = np.array([64.0, 1024.0]), 128.0
    t = lambda x: theta[0] + theta[1] * x + theta[3] + theta[2] * x + 2.0 * math.ceil(x / 32)
    want = (b / np.array([t(64.0), t(1024.0)])) / (b0 / t(b0))
    np.testing.assert_allclose(step_cost.r_q(theta, b, b0, external=ext), want, rtol=1e-12)
    np.testing.assert_allclose(step_cost.r_q(theta, b, b0),
                               step_cost.r_q(theta, b, b0, external=None), rtol=0)
    assert ext.seconds([1, 32, 33]).tolist() == [2.0, 2.0, 4.0]


def test_any_warm_start_block_plans_from_its_own_reference_runs():
    """results/planner_validation/blocks.py's path: a block other than the first plans from its
    own two reference runs; a block that does not exist is refused with the blocks there are."""
    import json
    from jaxrl_scale.scaling import analysis, plan_compare
    from jaxrl_scale.scaling.summary import as_summary
    d = os.path.join(ROOT, "results", "main_job")
    with open(os.path.join(d, "summary.json")) as f:
        summary = as_summary(json.load(f))
    with open(os.path.join(d, "logs", "timing.json")) as f:
        timing = json.load(f)
    runs, _ = analysis.load_runs(os.path.join(d, "logs"), [])
    plan, why = plan_compare.first_block_plan(runs, summary, timing, n_boot=50, block="w3")
    assert plan is not None, why
    w3 = sorted(n for n, x in summary.runs.items()
                if x.block == "w3" and x.group == summary.reference_configs["grpo"])
    assert plan["first_block"]["block"] == "w3" and plan["first_block"]["probe_runs"] == w3
    none, why = plan_compare.first_block_plan(runs, summary, timing, n_boot=50, block="w9")
    assert none is None and "no warm-start block w9" in why and "w0" in why
