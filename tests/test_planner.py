"""Noise scale from logged gradient norms (known answers) and the batch-size planner
(docs/science.md, The planner). Numpy only, except the CLI rows (subprocess)."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from jaxrl_scale.scaling import io as sio
from jaxrl_scale.scaling import noise, planner, planner_link, step_cost
from jaxrl_scale.scaling.synthetic import SyntheticRun, write_synthetic_run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------------------------
# Records exactly as the loop logs them (rl/steps.py; docs/api.md, Gradient-norm fields).


def _records_from_micro_grads(micro_UMD, b_small, start_step=1, batch=None):
    """Training records from micro-batch mean gradients [U, M, D]: per-micro squared norms,
    the squared norm of their mean (the full-batch gradient), micro_batch_size."""
    n_micro = micro_UMD.shape[1]
    batch = batch or b_small * n_micro
    sq_micro_UM = np.sum(micro_UMD ** 2, -1)
    sq_full_U = np.sum(micro_UMD.mean(1) ** 2, -1)
    return [{"step": start_step + u, "responses": (start_step + u) * batch,
             "time_s": float(start_step + u), "actor_grad_sqnorm_micro": sq_micro_UM[u].tolist(),
             "actor_grad_sqnorm": float(sq_full_U[u]),
             "actor_grad_norm": float(np.sqrt(sq_full_U[u])), "micro_batch_size": b_small}
            for u in range(micro_UMD.shape[0])]


def _linreg_micro_grads(rng, n_updates, n_micro, b_small, delta_D, sigma2):
    """Micro-batch mean gradients of 0.5 (x.w - y)^2 with y = x.w* + eps, x ~ N(0, I),
    eps ~ N(0, sigma2), at w = w* + delta: per-example g = x (x.delta - eps)."""
    d = delta_D.size
    x = rng.standard_normal((n_updates, n_micro, b_small, d))
    eps = rng.standard_normal((n_updates, n_micro, b_small)) * math.sqrt(sigma2)
    g = x * (x @ delta_D - eps)[..., None]
    return g.mean(2)


def test_b_simple_on_linear_regression_with_known_answer():
    # G = E[x x^T] delta = delta; E[g g^T] = |delta|^2 I + 2 delta delta^T + sigma2 I (Gaussian
    # fourth moment), so tr(Sigma) = (d + 1)|delta|^2 + d sigma2 and B_simple = tr(Sigma)/|G|^2.
    d, sigma2 = 8, 4.0
    rng = np.random.default_rng(0)
    delta = rng.standard_normal(d)
    delta /= np.linalg.norm(delta)           # |G|^2 = 1
    g2_true = 1.0
    trace_true = (d + 1) * g2_true + d * sigma2
    b_true = trace_true / g2_true            # 41
    b_small, n_micro = 16, 4
    recs = _records_from_micro_grads(
        _linreg_micro_grads(rng, 1000, n_micro, b_small, delta, sigma2), b_small)

    est = noise.per_update_estimates(recs, batch=b_small * n_micro)
    assert est["g2_U"].size == 1000 and np.all(est["b_small_U"] == b_small)
    assert est["g2_U"].mean() == pytest.approx(g2_true, rel=0.1)
    assert est["trace_U"].mean() == pytest.approx(trace_true, rel=0.1)
    out = noise.bootstrap_b_simple(est["g2_U"], est["trace_U"], n_boot=1000, seed=0)
    assert out["b_simple"] == pytest.approx(b_true, rel=0.15)
    lo, hi = out["ci"]
    assert lo <= b_true <= hi
    assert hi - lo < b_true                  # not trivially wide
    assert out["frac_unbounded"] == 0 and out["block"] == noise.default_block(1000)


def test_b_simple_interval_coverage_over_repeats():
    # The 90% interval covers the truth in about 90% of independent repeats (fixed seed).
    d, sigma2, b_small, n_micro = 4, 1.0, 8, 2
    delta = np.ones(d) / 2.0
    b_true = ((d + 1) * 1.0 + d * sigma2) / 1.0
    rng = np.random.default_rng(1)
    covered, widths = 0, []
    for _ in range(30):
        recs = _records_from_micro_grads(
            _linreg_micro_grads(rng, 300, n_micro, b_small, delta, sigma2), b_small)
        est = noise.per_update_estimates(recs, batch=b_small * n_micro)
        out = noise.bootstrap_b_simple(est["g2_U"], est["trace_U"], n_boot=400,
                                       rng=np.random.default_rng(int(rng.integers(1 << 30))))
        covered += out["ci"][0] <= b_true <= out["ci"][1]
        widths.append(out["ci"][1] - out["ci"][0])
    assert 24 <= covered <= 30
    assert np.median(widths) < b_true


def test_block_bootstrap_keeps_neighbours_together():
    idx = noise.block_bootstrap_indices(10, 3, 50, np.random.default_rng(0))
    assert idx.shape == (50, 10) and idx.min() >= 0 and idx.max() <= 9
    # every block of 3 is a run of consecutive updates
    blocks = idx[:, :9].reshape(50, 3, 3)
    assert np.all(np.diff(blocks, axis=-1) == 1)
    # +inf replicates (mean |G|^2 <= 0) are kept: the interval is unbounded above
    out = noise.bootstrap_b_simple([0.1, -0.2, 0.05, -0.1], [5.0, 6.0, 5.5, 4.0], n_boot=200,
                                   seed=0)
    assert out["b_simple"] == math.inf and out["unbounded"] and out["ci"][1] == math.inf


def test_trajectory_and_n_star_window_follow_a_growing_noise_scale():
    # |G|^2 falls over training at constant tr(Sigma): B_simple grows (the loss falls).
    rng = np.random.default_rng(2)
    n_updates, n_micro, b_small, dim, trace = 600, 4, 32, 256, 256.0
    micro, g2_U = [], np.linspace(4.0, 0.5, n_updates)
    for g2 in g2_U:
        g = np.full(dim, math.sqrt(g2 / dim))
        micro.append(g + rng.standard_normal((n_micro, dim)) * math.sqrt(trace / dim / b_small))
    recs = _records_from_micro_grads(np.array(micro), b_small)
    run = sio.make_run("probe", recs, {"batch_train": b_small * n_micro})
    est = noise.pooled_estimates([run])
    traj = noise.noise_scale_trajectory(est, n_windows=4, n_boot=200, seed=0)
    assert len(traj) == 4
    bs = [w["b_simple"] for w in traj]
    assert all(a < b for a, b in zip(bs, bs[1:]))
    # the window around N* estimates the B_simple of those updates
    n_star = 300 * b_small * n_micro
    lo, hi = noise.n_star_window(n_star, 0.1)
    win = noise.noise_scale_window(est, lo, hi, n_boot=200, seed=0)
    m = (np.arange(1, n_updates + 1) * b_small * n_micro >= lo) & \
        (np.arange(1, n_updates + 1) * b_small * n_micro <= hi)
    assert win["n_updates"] == m.sum()
    assert win["b_simple"] == pytest.approx(trace / g2_U[m].mean(), rel=0.15)
    assert win["ci"][0] <= trace / g2_U[m].mean() <= win["ci"][1]


# ---------------------------------------------------------------------------------------------
# Planner on a probe with a known B_crit and a known linear step-time model.

B0, B_CRIT, N_MICRO, DIM = 128, 512.0, 4, 2048
THETA = {"d0": 2.0, "d1": 0.001, "gamma": 0.002, "overhead": 0.1}  # generation-bound at small B
CANDIDATES = [64, 128, 256, 512, 1024, 2048]


def _write_probe(root, steps=400, seed=0):
    """Synthetic probe at B0 (N* = half the run) whose logged norms have |G|^2 = 1 and
    tr(Sigma) = B_CRIT: B_simple = B_crit = 512."""
    n_star = steps * B0 / 2
    d = write_synthetic_run(str(root), SyntheticRun(
        "probe_s0", B0, n_star=n_star, q=100.0, steps=steps,
                            eval_every=10, extra_config={"micro_batches": N_MICRO,
                                                         "group_size": 8}))
    rng = np.random.default_rng(seed)
    b_small = B0 // N_MICRO
    g = np.full(DIM, 1 / math.sqrt(DIM))
    micro = g + rng.standard_normal((steps, N_MICRO, DIM)) * math.sqrt(B_CRIT / DIM / b_small)
    norms = {r["step"]: r for r in _records_from_micro_grads(micro, b_small, batch=B0)}
    path = os.path.join(d, "metrics.jsonl")
    with open(path) as f:
        recs = [json.loads(line) for line in f]
    with open(path, "w") as f:
        for r in recs:
            if "score" not in r and r.get("step") in norms:
                n = norms[r["step"]]
                r.update({k: n[k] for k in ("actor_grad_sqnorm_micro", "actor_grad_sqnorm",
                                            "micro_batch_size")})
            f.write(json.dumps(r) + "\n")
    return d, n_star


def _timings(batches=(64, 128, 256, 512)):
    """A timing pass of the exact linear step-time model, 3 steps per batch."""
    t = THETA
    return [{"batch": b, "batch_gen": b, "gen_s": [t["d0"] + t["d1"] * b] * 3,
             "train_s": [t["overhead"] + t["gamma"] * b] * 3} for b in batches]


def _analytic_t_over_t0(b):
    """(1 + B/B_crit)/(1 + B0/B_crit) / (q(B)/q(B0)), q(B) = B / (d0 + d1 B + c + gamma B)."""
    t = THETA
    step = lambda x: t["d0"] + t["d1"] * x + t["overhead"] + t["gamma"] * x
    r_n = (1 + b / B_CRIT) / (1 + B0 / B_CRIT)
    r_q = (b / step(b)) / (B0 / step(B0))
    return r_n / r_q, r_n, r_q


def test_predict_r_q_formula_with_async_ratio():
    th = np.array([THETA[k] for k in step_cost.COLUMNS])
    b = np.array([64.0, 128.0, 512.0])
    for k in (1, 2):
        step = lambda x: (THETA["d0"] + THETA["d1"] * k * x) / k + THETA["overhead"] + \
            THETA["gamma"] * x
        want = (b / step(b)) / (B0 / step(B0))
        np.testing.assert_allclose(step_cost.r_q(th, b, B0, k), want, rtol=1e-12)
    reps = np.stack([th, th * 1.1])
    assert step_cost.r_q(reps, b, B0).shape == (2, 3)
    np.testing.assert_allclose(step_cost.r_q(reps, [B0], B0), 1.0)


def test_planner_recommends_the_analytic_optimum(tmp_path):
    d, n_star = _write_probe(tmp_path)
    runs = planner.read_runs([d])
    fit = step_cost.fit_step_times(_timings(), n_boot=200, seed=0)
    for k in step_cost.COLUMNS:
        assert fit[k] == pytest.approx(THETA[k], rel=1e-6)
    out = planner.batch_plan(runs, fit, CANDIDATES, target=0.5, n_boot=500, seed=0,
                             link=planner_link.IDENTITY)   # the analytic B_crit = B_simple

    assert out["n_star"] == pytest.approx(n_star)
    assert out["reference_batch"] == B0
    assert out["B_simple"] == pytest.approx(B_CRIT, rel=0.05)   # coverage: tests above
    analytic = {b: _analytic_t_over_t0(b) for b in CANDIDATES}
    best = min(CANDIDATES, key=lambda b: analytic[b][0])
    assert best == 512   # interior optimum: throughput gain vs sample cost
    assert out["recommended"]["batch"] == best
    for p in out["predictions"]:
        t, r_n, r_q = analytic[p["batch"]]
        assert p["r_q"] == pytest.approx(r_q, rel=1e-6)
        assert p["r_N"] == pytest.approx(r_n, rel=0.03)
        assert p["T_over_T0"] == pytest.approx(t, rel=0.03)
        assert p["T_over_T0_ci"][0] <= t <= p["T_over_T0_ci"][1]
    lo, hi = out["recommended"]["range"]
    assert lo <= best <= hi
    assert out["recommended"]["batches"] == [p["batch"] for p in out["predictions"]
                                             if p["in_range"]]
    # far from the optimum the paired interval excludes "as fast as the best"
    assert 64 not in out["recommended"]["batches"] and 2048 not in out["recommended"]["batches"]


def test_compare_marks_measured_points_inside_predicted_intervals():
    plan = {"algo": "grpo", "lr_rule": "sqrt", "gen_batch_ratio": 1, "predictions": [
        {"batch": 128.0, "r_N": 1.0, "r_N_ci": [1.0, 1.0], "r_q": 1.0, "r_q_ci": [1.0, 1.0],
         "T_over_T0": 1.0, "T_over_T0_ci": [1.0, 1.0]},
        {"batch": 256.0, "r_N": 1.1, "r_N_ci": [1.0, None], "r_q": 1.3, "r_q_ci": [1.2, 1.4],
         "T_over_T0": 0.85, "T_over_T0_ci": [0.8, 0.9]}]}
    summary = {"configs": {
        "grpo_P16_G8_sqrt": {"algo": "grpo", "batch": 128.0, "lr_rule": "sqrt",
                             "is_reference": True, "r_N": 1.0, "r_N_ci": [1.0, 1.0],
                             "r_q": 1.0, "r_q_ci": [1.0, 1.0], "T_over_T0": 1.0,
                             "T_over_T0_ci": [1.0, 1.0]},
        "grpo_P32_G8_sqrt": {"algo": "grpo", "batch": 256.0, "lr_rule": "sqrt",
                             "r_N": 5.0, "r_N_ci": [4.0, 6.0], "r_q": 1.5, "r_q_ci": [1.35, 1.6],
                             "T_over_T0": 3.0, "T_over_T0_ci": [2.0, 4.0]},
        "grpo_P32_G8_fixed": {"algo": "grpo", "batch": 256.0, "lr_rule": "fixed"},
        "ppo_P64_G1_sqrt": {"algo": "ppo", "batch": 64.0, "lr_rule": "sqrt"},
        "grpo_P4_G8_sqrt": {"algo": "grpo", "batch": 32.0, "lr_rule": "sqrt", "r_N": 0.9}}}
    rows = planner.compare(plan, summary)
    assert [r["config"] for r in rows] == ["grpo_P4_G8_sqrt", "grpo_P16_G8_sqrt",
                                           "grpo_P32_G8_sqrt"]
    no_pred, ref, r = rows
    assert no_pred["r_N_pred"] is None and no_pred["r_N_inside"] is None
    assert ref["is_reference"] and ref["T_over_T0_inside"]
    assert r["r_N_inside"] is True            # null upper end: unbounded
    assert r["r_q_inside"] is False and r["r_q_overlap"] is True
    assert r["T_over_T0_inside"] is False and r["T_over_T0_overlap"] is False
    counts = planner.compare_counts(rows)
    assert counts["r_N"] == {"n": 1, "inside": 1, "overlap": 1,
                             "median_abs_log_error": pytest.approx(abs(math.log(1.1 / 5.0)))}
    assert planner.compare_counts(rows, group_size=16)["r_N"]["n"] == 0
    check = planner.recommendation_check(
        dict(plan, recommended={"batch": 256.0, "range": [128.0, 256.0]}),
        dict(summary, best_set=["grpo_P16_G8_sqrt"]), rows)
    assert check["measured_fastest"] == "grpo_P16_G8_sqrt"
    assert check["measured_best_set_batches"] == [128.0]
    assert check["recommended_in_best_set"] is False
    md = planner.format_compare(rows)
    assert md.count("\n") == 4 and "grpo_P16_G8_sqrt (ref)" in md


# ---------------------------------------------------------------------------------------------
# The command, end to end.


def _plan_cmd(*args):
    return subprocess.run([sys.executable, os.path.join(REPO, "experiments", "plan.py"), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})


def test_plan_cli_end_to_end_and_bad_input(tmp_path):
    d, n_star = _write_probe(tmp_path / "runs", steps=200)
    tj = tmp_path / "timings.json"
    tj.write_text(json.dumps(_timings()))
    summary = tmp_path / "summary.json"
    t, r_n, r_q = _analytic_t_over_t0(256)   # a sweep that measured the truth
    summary.write_text(json.dumps({"configs": {"probe": {
        "algo": "grpo", "batch": 256.0, "lr_rule": "sqrt", "r_N": r_n, "r_N_ci": [1.0, 1.4],
        "r_q": r_q, "r_q_ci": [1.5, 2.5], "T_over_T0": t, "T_over_T0_ci": [0.5, 0.9]}}}))
    out = tmp_path / "out"
    res = _plan_cmd(f"--probe_run={d}", f"--timings_json={tj}", f"--n_star={n_star}",
                    "--batches=64,128,256,512,1024", "--n_boot=200", f"--out_dir={out}",
                    f"--compare={summary}")
    assert res.returncode == 0, res.stderr[-2000:]
    plan = json.loads((out / "plan.json").read_text())
    assert {"reference_batch", "B_simple", "B_simple_ci", "predictions",
            "recommended"} <= set(plan)
    assert plan["reference_batch"] == B0 and len(plan["B_simple_ci"]) == 2
    assert [p["batch"] for p in plan["predictions"]] == [64, 128, 256, 512, 1024]
    for p in plan["predictions"]:
        assert {"batch", "r_N", "r_N_ci", "r_q", "T_over_T0", "T_over_T0_ci"} <= set(p)
    assert {"batch", "range"} <= set(plan["recommended"])
    assert len(plan["recommended"]["range"]) == 2
    assert plan["recommended"]["batch"] == 512
    assert (out / "plan.png").stat().st_size > 1000
    comp = json.loads((out / "compare.json").read_text())
    assert comp["rows"]["actor"][0]["config"] == "probe"
    assert "recommended B = 512" in res.stdout
    # what the report does with a plan.json read back (nulls for unbounded ends)
    rows = planner.compare(plan, json.loads(summary.read_text()))
    assert rows[0]["T_over_T0_inside"] is True
    assert os.path.isfile(planner.plot_plan(plan, str(tmp_path / "report_plan.png"), rows))

    # a sweep's own timing.json ({"entries": [...]}, other algorithms' left out) plans the same
    sweep_tj = tmp_path / "timing.json"
    sweep_tj.write_text(json.dumps({"entries": [{**e, "algo": "grpo"} for e in _timings()]
                                    + [{**_timings()[0], "algo": "ppo", "batch": 7}]}))
    same = _plan_cmd(f"--probe_run={d}", f"--timings_json={sweep_tj}", f"--n_star={n_star}",
                     "--batches=64,128,256,512,1024", "--n_boot=200", f"--out_dir={out}2")
    assert same.returncode == 0, same.stderr[-2000:]
    assert json.loads((tmp_path / "out2" / "plan.json").read_text())["predictions"] == \
        plan["predictions"]

    bad = _plan_cmd(f"--probe_run={d}", f"--timings_json={tj}", "--batches=64,abc",
                    f"--out_dir={out}")
    assert bad.returncode == 2
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: batches: ") and "Fix: " in lines[0]


def test_planner_bad_inputs_name_the_flag(tmp_path):
    d, _ = _write_probe(tmp_path, steps=40)
    fit = step_cost.fit_step_times(_timings(), n_boot=50)
    probe = planner.read_runs([d])
    cases = [
        (lambda: planner.read_runs([str(tmp_path / "nope")]), "probe_run: "),
        (lambda: step_cost.fit_step_times(_timings(batches=(128,)), n_boot=50), "timings_json: "),
        (lambda: planner.batch_plan(probe, fit, target=2.0), "target: "),
        (lambda: planner.batch_plan(probe, fit, who="critic"), "probe_run: "),
        (lambda: planner.batch_plan(probe, fit, n_star=1e9), "n_star: "),
        (lambda: planner.batch_plan(probe, fit, [64, -1]), "batches: "),
    ]
    for fn, start in cases:
        with pytest.raises(planner.PlanError) as e:
            fn()
        assert str(e.value).startswith(start) and ". Fix: " in str(e.value)


def test_report_puts_predictions_beside_measured(tmp_path):
    """A plan*.json in the report's directory adds a predictions-vs-measured section and
    figure (the recorded validation: GRPO plan from study_full's reference runs)."""
    import shutil
    from jaxrl_scale.report import render
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")
    shutil.copy(os.path.join(root, "planner_validation", "grpo", "plan.json"), tmp_path)
    with open(os.path.join(root, "study_full", "summary.json")) as f:
        summary = json.load(f)
    md = open(render(summary, str(tmp_path))).read()
    assert "## Planner predictions vs measured (plan.json)" in md
    assert "plan_vs_measured.png" in md and (tmp_path / "plan_vs_measured.png").is_file()


def test_critic_schedule_from_its_own_noise_scale():
    """PPO: the critic's recommended batch becomes critic_minibatches at the actor's batch
    (a power of two, >= 1, each critic update near its own recommended batch)."""
    assert planner.critic_schedule(256, 64)["critic_minibatches"] == 4
    assert planner.critic_schedule(256, 100)["critic_minibatches"] == 2
    assert planner.critic_schedule(256, 40)["critic_minibatches"] == 4     # 6 -> 4
    assert planner.critic_schedule(64, 177)["critic_minibatches"] == 1
