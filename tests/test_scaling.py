"""Time-to-target analysis: the worked examples of docs/science.md, Time to target, and
synthetic sweeps with known answers."""

import json
import os

import numpy as np
import pytest

from jaxrl_scale import scaling
from jaxrl_scale.scaling import io as sio, time_to_target as ttt
from jaxrl_scale.scaling.synthetic import SyntheticRun, write_synthetic_run
from jaxrl_scale.scaling.step_cost import fit_linear_time
from jaxrl_scale.scaling.throughput import critical_generation_batch, throughput_gains

TARGET = 0.5


@pytest.mark.parametrize("r_n,r_q,expected", [
    (1.2, 1.5, 0.80), (1.2, 1.1, 1.09), (1.0, 1.41, 0.71), (1.6, 1.30, 1.23), (1.6, 1.36, 1.18)])
def test_worked_examples(r_n, r_q, expected):
    assert round(scaling.time_ratio(r_n, r_q), 2) == expected


def test_n_star_interpolates_first_crossing():
    n = [0, 100, 200, 300, 400]
    s = [0.1, 0.3, 0.5, 0.4, 0.9]
    assert scaling.n_star(n, s, 0.4) == pytest.approx(150.0)
    assert scaling.n_star(n, s, 0.5) == pytest.approx(200.0)
    assert scaling.n_star(n, s, 0.05) == 0.0  # first eval already above target
    assert scaling.n_star(n, s, 0.95) is None
    assert scaling.n_star([], [], 0.5) is None
    assert scaling.n_star([0, 10, 20], [0.0, np.nan, 1.0], 0.5) == pytest.approx(10.0)


def test_throughput_and_time_at():
    recs = [{"responses": 100 * k, "time_s": 10.0 * k} for k in range(1, 6)]
    assert scaling.throughput(recs, 250.0) == pytest.approx(10.0)
    assert scaling.time_at(recs, 50.0) == pytest.approx(5.0)  # (0, 0) anchors the start
    assert scaling.time_at(recs, 600.0) == pytest.approx(60.0)  # last rate extended
    assert scaling.throughput(recs, None) is None


def _sweep(root, seeds=False):
    write_synthetic_run(root, SyntheticRun("grpo_B512_sqrt_s0", 512, 10000, 10))
    write_synthetic_run(root, SyntheticRun("grpo_B1024_sqrt_s0", 1024, 10000, 15))
    write_synthetic_run(root, SyntheticRun("grpo_B2048_sqrt_s0", 2048, 12000, 24))
    write_synthetic_run(root, SyntheticRun("grpo_B4096_sqrt_s0", 4096, 12000, 30, cap=0.4))
    write_synthetic_run(root, SyntheticRun("grpo_B1024_fixed_s0", 1024, 16000, 15, lr_rule="fixed"))
    if seeds:
        write_synthetic_run(root, SyntheticRun("grpo_B1024_sqrt_s1", 1024, 12000, 15, seed=1))
    os.makedirs(os.path.join(root, "crashed"))
    return str(root)


def test_synthetic_sweep_numbers(tmp_path):
    """Noise-free linear curves: N*, q and the ratios come out exact, intervals collapse."""
    s = scaling.analyze_sweep(_sweep(tmp_path), TARGET, tolerance=0.1)
    assert s["reference"] == s["reference_config"] == "grpo_B512_sqrt"
    assert s["target"] == TARGET and s["eval_se_source"] == "estimated from the curve"
    runs, configs = s["runs"], s["configs"]
    want = {  # config: (N*, q, r_N, r_q, T/T0, verdict)
        "grpo_B512_sqrt": (10000, 10, 1.0, 1.0, 1.0, "indistinguishable"),
        "grpo_B1024_sqrt": (10000, 15, 1.0, 1.5, 1 / 1.5, "faster"),
        "grpo_B2048_sqrt": (12000, 24, 1.2, 2.4, 0.5, "faster"),
        "grpo_B1024_fixed": (16000, 15, 1.6, 1.5, 1.6 / 1.5, "slower"),
    }
    for name, (ns, q, rn, rq, tt, verdict) in want.items():
        c, x = configs[name], runs[name + "_s0"]
        assert c["reached"] is True and x["reached"] is True
        got = [c["N_star"], c["q"], c["r_N"], c["r_q"], c["T_over_T0"]]
        np.testing.assert_allclose(got, [ns, q, rn, rq, tt], rtol=1e-9)
        np.testing.assert_allclose([x["N_star"], x["q"], x["r_N"]], [ns, q, rn], rtol=1e-9)
        np.testing.assert_allclose(c["T_over_T0_ci"], [tt, tt], rtol=1e-3)
        assert c["verdict"] == verdict, name
        assert x["T"] == pytest.approx(ns / q)
        assert x["updates_to_target"] == pytest.approx(ns / x["batch"])
    assert configs["grpo_B2048_sqrt"]["updates_ratio"] == pytest.approx(0.3)
    miss = configs["grpo_B4096_sqrt"]
    assert miss["reached"] is False and miss["verdict"] == "not reached"
    assert all(miss[k] is None for k in ("N_star", "r_N", "T_over_T0"))
    assert runs["grpo_B4096_sqrt_s0"]["N_star"] is None
    assert s["best_set"] == ["grpo_B2048_sqrt"]
    ctb = s["critical_training_batch"]
    assert ctb["batch"] == 1024 and ctb["cost_detected_at"] == 2048
    assert s["skipped"] == [{"dir": "crashed", "reason": "no metrics.jsonl"}]
    assert s["grad_norm"]["actor_grad_norm"]["slope"] == pytest.approx(-0.5)
    assert configs["grpo_B1024_sqrt"]["invariance"]["within"] is True
    assert configs["grpo_B1024_fixed"]["invariance"]["within"] is False
    # summary.json is strict JSON (no NaN)
    path = scaling.write_summary(str(tmp_path), s)
    with open(path) as f:
        back = json.loads(f.read(), parse_constant=lambda c: pytest.fail(c))
    assert set(back) >= {"reference", "target", "runs", "best", "ci_level", "eval_se",
                         "signal_to_noise", "reference_config", "configs", "best_set",
                         "critical_training_batch", "critical_generation_batch"}


def test_seed_mean_std_and_group_reference(tmp_path):
    s = scaling.analyze_sweep(_sweep(tmp_path, seeds=True), TARGET,
                              reference="grpo_B1024_sqrt")
    assert s["reference_runs"] == ["grpo_B1024_sqrt_s0", "grpo_B1024_sqrt_s1"]
    g = s["configs"]["grpo_B1024_sqrt"]
    assert g["seeds"] == 2 and g["seeds_reached"] == 2
    assert g["N_star"] == pytest.approx(11000) and g["N_star_std"] == pytest.approx(1000)
    assert s["runs"]["grpo_B1024_sqrt_s1"]["r_N"] == pytest.approx(12000 / 11000)
    assert g["r_N"] == pytest.approx(1.0) and g["is_reference"] is True
    # seed resampling: the interval spans the two seeds' N*
    assert g["N_star_ci"][0] == pytest.approx(10000, rel=1e-3)
    assert g["N_star_ci"][1] == pytest.approx(12000, rel=1e-3)
    assert s["configs"]["grpo_B4096_sqrt"]["reached"] is False


def test_batch_from_increments_without_config(tmp_path):
    d = write_synthetic_run(tmp_path, SyntheticRun("ext_run", 256, 5000, 7, config=False))
    # drop every other training record: batch must still be 256 per step
    lines = open(os.path.join(d, "metrics.jsonl")).read().splitlines()
    kept = [ln for ln in lines if "score" in ln or json.loads(ln)["step"] % 2 == 0]
    open(os.path.join(d, "metrics.jsonl"), "w").write("\n".join(kept) + "\n")
    run = sio.read_run(d)
    assert run.batch == 256 and run.batch_source == "increments"
    assert run.seed is None and run.group == "ext_run"
    cfg = sio.make_run("x", [], {"prompts_per_step": 64, "group_size": 8})
    assert cfg.batch == 512 and cfg.batch_source == "config"
    ppo = sio.make_run("y", [], {"trainer": {"prompts_per_step": 256, "algo": "ppo"}})
    assert ppo.batch == 256


def test_run_name_conventions():
    assert sio.strip_seed("grpo_P64_G8_sqrt_s0") == "grpo_P64_G8_sqrt"
    assert sio.strip_seed("ppo_P256_fixed_seed12") == "ppo_P256_fixed"
    r = sio.make_run("grpo_P64_G8_sqrt_s3", [])
    assert (r.seed, r.group, r.lr_rule) == (3, "grpo_P64_G8_sqrt", "sqrt")


def test_csv_import(tmp_path):
    p = tmp_path / "verl_run.csv"
    rows = ["global_step,samples,wall,val_acc"]
    for k in range(1, 21):
        acc = "" if k % 4 else f"{0.5 * k * 100 / 1500:.6f}"
        rows.append(f"{k},{k * 100},{k * 100 / 20},{acc}")
    p.write_text("\n".join(rows) + "\n")
    run = scaling.read_csv_run(str(p), "step:global_step,responses:samples,time_s:wall,"
                               "score:val_acc")
    assert run.batch == 100 and len(run.evals) == 5 and len(run.train) == 20
    x = scaling.analyze_runs([run], 0.5)["runs"]["verl_run"]
    assert x["N_star"] == pytest.approx(1500, rel=1e-5) and x["q"] == pytest.approx(20)
    with pytest.raises(ValueError, match="not in CSV header"):
        scaling.read_csv_run(str(p), "score:nope")
    # a CSV run joins a sweep
    s = scaling.analyze_sweep(_sweep(tmp_path / "sw"), TARGET, extra_runs=[run])
    assert s["runs"]["verl_run"]["N_star"] == pytest.approx(1500, rel=1e-5)


def test_clear_errors(tmp_path):
    with pytest.raises(scaling.AnalysisError, match="does not exist"):
        scaling.analyze_sweep(str(tmp_path / "nope"), TARGET)
    (tmp_path / "empty" / "a").mkdir(parents=True)
    with pytest.raises(scaling.AnalysisError, match="no runs.*a: no metrics.jsonl"):
        scaling.analyze_sweep(str(tmp_path / "empty"), TARGET)
    sw = _sweep(tmp_path / "sw")
    with pytest.raises(scaling.AnalysisError, match="not found; available runs.*grpo_B512"):
        scaling.analyze_sweep(sw, TARGET, reference="nope")
    with pytest.raises(scaling.AnalysisError, match="target: must be a number"):
        scaling.analyze_sweep(sw, "high")
    # a reference that misses the target is a finding, not an error
    assert scaling.analyze_sweep(sw, 0.5, reference="grpo_B4096_sqrt_s0")[
        "reference_reached"] is False
    d = tmp_path / "noeval" / "r"
    d.mkdir(parents=True)
    (d / "metrics.jsonl").write_text('{"step": 1, "responses": 8, "time_s": 1.0}\n')
    with pytest.raises(scaling.AnalysisError, match="no run has eval records"):
        scaling.analyze_sweep(str(tmp_path / "noeval"), TARGET)
    # one run without evals in a good sweep: kept, flagged, not reached
    d2 = tmp_path / "sw" / "zz_no_eval"
    d2.mkdir()
    (d2 / "metrics.jsonl").write_text('{"step": 1, "responses": 8, "time_s": 1.0}\n')
    s = scaling.analyze_sweep(sw, TARGET)
    assert s["runs"]["zz_no_eval"]["reached"] is False
    assert any("zz_no_eval: no eval records" in w for w in s["warnings"])


def test_default_reference_prefers_sqrt(tmp_path):
    write_synthetic_run(tmp_path, SyntheticRun("a_fixed", 256, 10000, 10, lr_rule="fixed"))
    write_synthetic_run(tmp_path, SyntheticRun("b_sqrt", 512, 10000, 10))
    write_synthetic_run(tmp_path, SyntheticRun("c_sqrt", 1024, 10000, 10))
    assert scaling.analyze_sweep(str(tmp_path), TARGET)["reference"] == "b_sqrt"


@pytest.mark.parametrize("use_scipy", [True, False])
def test_sigmoid_fit_recovers_n_star(use_scipy):
    if use_scipy:
        pytest.importorskip("scipy")
    n = np.linspace(500, 40000, 30)
    true = dict(r0=0.1, a=0.8, log_nmid=np.log(8000.0), b=2.0)
    s = ttt.sigmoid_curve(n, **true) + np.random.default_rng(0).normal(0, 0.005, n.size)
    fit = scaling.fit_sigmoid(n, s, 0.6, use_scipy=use_scipy)
    exact = ttt.sigmoid_n_star(0.1, 0.8, np.log(8000.0), 2.0, 0.6)
    assert fit["A"] == pytest.approx(0.8, abs=0.03)
    assert fit["N_star"] == pytest.approx(exact, rel=0.05)
    assert 0 < fit["N_star_std"] < 0.1 * exact
    assert scaling.fit_sigmoid(n, s, 0.95, use_scipy=use_scipy)["N_star"] is None  # above A
    assert scaling.fit_sigmoid(n[:3], s[:3], 0.6) is None


def test_fit_linear_time():
    b = np.array([64, 128, 256, 512])
    d0, d1 = fit_linear_time(b, 3.0 + 0.01 * b)
    assert d0 == pytest.approx(3.0) and d1 == pytest.approx(0.01)


def test_critical_generation_batch_saturating():
    b = np.array([32, 64, 128, 256, 512, 1024, 2048])
    tp = b / (1.0 + b / 128.0)  # roofline-like: linear, then flat above ~128
    gains = throughput_gains(b, tp)
    assert np.all(np.diff(gains) < 0)
    cgb = critical_generation_batch(b, tp, 0.10)
    # gain per doubling B -> 2B is 1 / (1 + 2B/128): 0.11 at 512, 0.06 at 1024
    assert cgb == 1024
    # non-doubling grid: gains normalised by log2 ratio
    b2 = np.array([32, 100, 300, 1000, 3000])
    assert critical_generation_batch(b2, b2 / (1 + b2 / 128.0), 0.10) == 1000
    assert critical_generation_batch(b[:3], b[:3] * 1.0) is None  # linear: never plateaus
    assert critical_generation_batch([2048, 32, 1024, 512, 256, 128, 64],
                                     [tp[-1], tp[0], *tp[5:0:-1]]) == 1024  # unsorted input


def test_time_interleaved_round_robin_and_last_outputs():
    from jaxrl_scale import bench
    calls = []
    fns = {"a": lambda: calls.append("a") or len(calls), "b": lambda: calls.append("b") or -len(calls)}
    times, last = bench.time_interleaved(fns, repeats=2, warmup=1, skip_warmup=("b",))
    assert calls == ["a", "a", "b", "a", "b"]  # warm-up skips b; then alternating rounds
    assert {k: len(v) for k, v in times.items()} == {"a": 2, "b": 2}
    assert last == {"a": 4, "b": -5}
    assert len(bench.time_calls(lambda: 0, repeats=3, warmup=0)) == 3
