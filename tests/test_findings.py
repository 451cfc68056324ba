"""Findings as data (scaling/findings.py) from synthetic configs with a known answer, and from a
synthetic sweep through the analysis: statuses asserted on the Finding values, never on text."""

import numpy as np
import pytest

from jaxrl_scale.scaling import findings
from jaxrl_scale.scaling.findings import Finding
from jaxrl_scale.scaling.summary import AlgoSummary, ConfigStats

B0 = 128


def _cfg(batch, *, G=8, rule="sqrt", verdict="indistinguishable", t=1.0, t_ci=(0.9, 1.1),
         r_n=1.0, r_n_ci=(0.9, 1.1), r_q=1.0, ref=False, reached=True):
    return ConfigStats.from_json({"algo": "grpo", "batch": batch, "group_size": G, "lr_rule": rule,
            "gen_batch_ratio": 1, "reached": reached, "is_reference": ref,
            "N_star": 1000.0 * r_n, "r_N": r_n, "r_N_ci": list(r_n_ci), "r_q": r_q,
            "r_q_ci": [r_q * 0.95, r_q * 1.05], "T_over_T0": t, "T_over_T0_ci": list(t_ci),
            "verdict": "reference" if ref else verdict})


def _reps(ratio_lo, ratio_hi, n=400, seed=0):
    """Replicates of N* whose ratio to 1000 spans about [ratio_lo, ratio_hi] (90%)."""
    rng = np.random.default_rng(seed)
    return {"N": 1000.0 * rng.uniform(ratio_lo, ratio_hi, n)}


def _find(configs, creps=None, fid="larger_batch_faster"):
    info = AlgoSummary.from_json({"reference_config": "ref", "reference_reached": True,
                                  "grad_norm": {}, "critical_generation_batch": {}})
    creps = creps or {g: {"N": np.full(400, st.N_star)} for g, st in configs.items()}
    fs = findings.source_findings({"grpo": info}, configs, creps, 0.9, 0.25, "grpo", None)
    return findings.by_id(fs, fid, "grpo")


def test_faster_config_at_the_reference_batch_does_not_reproduce_larger_batch_faster():
    """G = 4 at B0 = 128 is faster; no config above B0 is: the finding is not reproduced
    (the recorded sweep_default_issue16 read it as reproduced: the batch filter bug)."""
    configs = {"ref": _cfg(B0, ref=True),
               "P32G4": _cfg(B0, G=4, verdict="faster", t=0.74, t_ci=(0.64, 0.87)),
               "P32G8": _cfg(256, verdict="slower", t=1.3, t_ci=(1.1, 1.5))}
    f = _find(configs)
    assert f.status == "not reproduced"
    assert [x["config"] for x in f.numbers] == ["P32G8"]


def test_faster_config_above_the_reference_batch_reproduces():
    configs = {"ref": _cfg(B0, ref=True),
               "P32G8": _cfg(256, verdict="faster", t=0.8, t_ci=(0.7, 0.9), r_q=1.3)}
    f = _find(configs)
    assert f.status == "reproduced" and f.numbers[0]["verdict"] == "faster"
    assert "largest measured r_q above B0 is 1.3" in f.detail


def test_equal_pg_alike_is_an_equivalence_test():
    """Overlapping but wide intervals are not "alike"; a narrow ratio interval inside
    [0.8, 1.25] is; a ratio interval excluding 1 is "differ"."""
    configs = {"ref": _cfg(B0, ref=True), "P32G4": _cfg(B0, G=4)}
    wide = {"ref": _reps(1, 1), "P32G4": _reps(0.6, 1.6)}
    assert _find(configs, wide, "equal_PG_alike").status == "undetermined"
    narrow = {"ref": _reps(1, 1), "P32G4": _reps(0.9, 1.1)}
    f = _find(configs, narrow, "equal_PG_alike")
    assert f.status == "reproduced" and f.numbers[0]["outcome"] == "alike"
    far = {"ref": _reps(1, 1), "P32G4": _reps(0.5, 0.7)}
    assert _find(configs, far, "equal_PG_alike").status == "not reproduced"


def test_fixed_lr_lags_uses_the_ratio_interval():
    configs = {"ref": _cfg(B0, ref=True), "s256": _cfg(256), "f256": _cfg(256, rule="fixed")}
    lags = {"ref": _reps(1, 1), "s256": _reps(1, 1), "f256": _reps(1.2, 1.5)}
    assert _find(configs, lags, "fixed_lr_lags").status == "reproduced"
    fewer = {"ref": _reps(1, 1), "s256": _reps(1, 1), "f256": _reps(0.5, 0.8)}
    assert _find(configs, fewer, "fixed_lr_lags").status == "not reproduced"
    open_ = {"ref": _reps(1, 1), "s256": _reps(1, 1), "f256": _reps(0.8, 1.3)}
    assert _find(configs, open_, "fixed_lr_lags").status == "undetermined"


def test_sqrt_lr_invariance_counts_batches_above_b0():
    configs = {"ref": _cfg(B0, ref=True), "s64": _cfg(64, r_n_ci=(0.5, 3.0)),
               "s256": _cfg(256, r_n_ci=(0.9, 1.2))}
    f = _find(configs, fid="sqrt_lr_invariance")
    assert f.status == "reproduced" and [x["config"] for x in f.numbers] == ["s256"]


def test_finding_round_trips_through_json():
    f = Finding("grad_norm_slope", "reproduced", "c", "t", "d", "grpo",
                ({"slope": -0.5, "slope_ci": [-0.6, -0.4]},))
    assert Finding.from_json(f.to_json()) == f


def test_critical_training_batch_is_defined_above_b0():
    from jaxrl_scale.scaling.configs import critical_training_batch
    ref = ConfigStats(algo="grpo", lr_rule="sqrt", batch=B0, gen_batch_ratio=1, N_star=1000.0,
                      N_star_ci=[900.0, 1100.0])
    configs = {"ref": _cfg(B0, ref=True, r_n_ci=(1.0, 1.0)),
               "s256": _cfg(256, r_n_ci=(1.4, 1.9), r_n=1.6)}
    ctb = critical_training_batch(configs, ref, 0.25)
    assert ctb["batch"] is None and ctb["cost_detected_at"] == 256
    configs["s256"] = _cfg(256, r_n_ci=(0.9, 1.2))
    assert critical_training_batch(configs, ref, 0.25)["batch"] == 256


if __name__ == "__main__":
    pytest.main([__file__, "-q"])


def test_summary_round_trips_and_recorded_summaries_load():
    """A summary from a synthetic sweep: to_json(from_json(d)) == d; every summary recorded
    under results/ loads (older layouts: clip_fraction, no findings)."""
    import glob
    import json
    import os
    import tempfile

    from jaxrl_scale.scaling import analyze_sweep
    from jaxrl_scale.scaling.summary import Summary
    from jaxrl_scale.scaling.synthetic import SyntheticRun, write_synthetic_run
    with tempfile.TemporaryDirectory() as root:
        for b, q in ((32, 100), (64, 160)):
            for s in (0, 1):
                write_synthetic_run(root, SyntheticRun(
                    f"grpo_P{b // 8}G8_sqrt_s{s}", b, 2000, q, steps=60,
                                    eval_every=5, seed=s, eval_n=400, noise_seed=s + b,
                                    gen_s=(0.1, 1e-3), extra_config={"base_batch": 32}))
        d = json.loads(json.dumps(analyze_sweep(root, "auto", n_boot=50)))
    s = Summary.from_json(d)
    assert s.to_json() == d and Summary.from_json(s.to_json()) == s
    assert d["reference"] == d["reference_config"] and d["best"] == d["best_set"]
    assert s.lr_tuning is None and s.min_detectable_r_N > 1   # no lr_tune.json; 2 seeds
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")
    paths = glob.glob(os.path.join(root, "**", "summary.json"), recursive=True)
    assert paths
    for p in paths:
        with open(p) as f:
            Summary.from_json(json.load(f))


def _hw(cgb):
    info = AlgoSummary.from_json({"reference_config": "ref", "reference_reached": True,
                                  "grad_norm": {}, "critical_generation_batch": cgb or None})
    return findings.by_id(findings.source_findings(
        {"grpo": info}, {"ref": _cfg(B0, ref=True)}, {}, 0.9, 0.25, "grpo",
        info.critical_generation_batch), "sublinear_collection")


def test_sublinear_collection_from_the_d0_interval():
    assert _hw({"d0": 0.1, "d0_ci": [0.05, 0.15], "sync_batches": 3}).status == "reproduced"
    assert _hw({"d0": -0.1, "d0_ci": [-0.2, -0.05], "sync_batches": 3}).status == \
        "not reproduced"
    assert _hw({"d0": 0.01, "d0_ci": [-0.05, 0.07], "sync_batches": 3}).status == \
        "undetermined"
    assert _hw({"d0": 0.1, "d0_ci": [0.05, 0.15], "sync_batches": 1}).status == "undetermined"
    assert _hw({}).status == "undetermined"


def _grad(slope_ci, flat=None):
    info = AlgoSummary.from_json({
        "reference_config": "ref", "reference_reached": True, "critical_generation_batch": {},
        "grad_norm": {"actor_grad_norm": {
            "batches": [64, 128, 256], "slope": sum(slope_ci) / 2, "slope_ci": slope_ci,
            "flattens_after": flat, "flat_threshold": -0.25, "lr_rule": "sqrt"}}})
    fs = findings.source_findings({"grpo": info}, {"ref": _cfg(B0, ref=True)}, {}, 0.9, 0.25,
                                  "grpo", None)
    return findings.by_id(fs, "grad_norm_slope", "grpo")


def test_grad_norm_slope_from_its_interval():
    assert _grad([-0.6, -0.4]).status == "reproduced"
    assert _grad([-0.3, -0.1]).status == "not reproduced"
    assert _grad([-0.3, -0.1], flat=128).status == "undetermined"
    assert _grad([-0.6, -0.4]).numbers[0]["slope_ci"] == [-0.6, -0.4]


def _timed_runs(gen_per_row, upd_per_row, batches=(64, 128, 256), seeds=2, d0=0.02):
    """Runs with a known step cost: gen_s = d0 + gen_per_row * B, train_s = upd_per_row * B,
    curves that reach the auto target (so the analysis runs end to end)."""
    from jaxrl_scale.scaling.io import make_run
    runs = []
    for B in batches:
        for k in range(seeds):
            g, u = d0 + gen_per_row * B, upd_per_row * B
            recs, t = [], 0.0
            for i in range(1, 4096 // B + 1):
                t += g + u + 0.001
                recs.append({"step": i, "responses": i * B, "time_s": t, "gen_s": g,
                             "train_s": u})
            recs += [{"step": n // B, "responses": n, "score": 0.2 + 0.1 * (1 - np.exp(
                -n / (1500.0 * (1 + 0.05 * k)))), "eval_n": 24000} for n in range(0, 4097, 512)]
            runs.append(make_run(f"grpo_P{B // 8}_G8_sqrt_s{k}", recs, {
                "algo": "grpo", "base_batch": 128, "batch_train": B, "lr_rule": "sqrt",
                "seed": k}))
    return runs


@pytest.mark.parametrize("gen,upd,want", [(4e-3, 1e-3, "generation-bound"),
                                          (5e-4, 3e-3, "update-bound")])
def test_regime_is_stated_before_any_verdict(gen, upd, want):
    from jaxrl_scale.report.design import design_lines
    from jaxrl_scale.scaling.analysis import analyze
    s = analyze(_timed_runs(gen, upd), "auto", n_boot=50)
    r = s.algos["grpo"].regime
    B = 128
    step = 0.02 + gen * B + upd * B + 0.001
    assert r.regime == want and r.batch == B and r.runs == 2
    assert r.gen_share == pytest.approx((0.02 + gen * B) / step, rel=1e-6)
    assert r.update_share == pytest.approx(upd * B / step, rel=1e-6)
    assert r.d1 == pytest.approx(gen, rel=1e-6) and r.d0 == pytest.approx(0.02, abs=1e-6)
    first = design_lines(s)[0]
    assert first.startswith(f"Regime [grpo]: {want} at the reference batch B = 128")
    assert s.to_json()["algos"]["grpo"]["regime"]["regime"] == want


def test_regime_unknown_without_generation_times():
    from jaxrl_scale.report.design import regime_lines
    from jaxrl_scale.scaling import calibration as cal
    from jaxrl_scale.scaling.analysis import analyze
    s = analyze(cal.simulate_runs(cal.SAMPLED_3_SEEDS, np.random.default_rng(0)), "auto", n_boot=20)
    assert s.algos["grpo"].regime.regime == "unknown"
    assert "gen_s" in s.algos["grpo"].regime.reason and regime_lines(s) == []


def test_report_says_which_configs_trained_lora():
    """Runs whose config.json has lora_rank > 0: summary "lora" names their configs, and the
    report's first lines say their lr is the adapters'."""
    import dataclasses as dc
    from jaxrl_scale.report.design import design_lines
    from jaxrl_scale.scaling import calibration as cal
    from jaxrl_scale.scaling.analysis import analyze
    runs = cal.simulate_runs(cal.SAMPLED_3_SEEDS, np.random.default_rng(0))
    lora = {"lora_rank": 8, "lora_alpha": 16.0, "lora_targets": ["q", "v"]}
    runs = [dc.replace(r, config={**r.config, **lora}) if r.group == "grpo_P8_G8_sqrt" else r
            for r in runs]
    s = analyze(runs, "auto", n_boot=20)
    assert s.lora == {"grpo_P8_G8_sqrt": {"rank": 8, "alpha": 16.0, "targets": ["q", "v"]}}
    line = [x for x in design_lines(s) if x.startswith("LoRA:")]
    assert line == ["LoRA: 1 of 8 configs trained adapters on a frozen base, their lr the "
                    "adapters': grpo_P8_G8_sqrt (rank 8, alpha 16, q,v)."]
    assert s.to_json()["lora"]["grpo_P8_G8_sqrt"]["rank"] == 8
    plain = analyze(cal.simulate_runs(cal.SAMPLED_3_SEEDS, np.random.default_rng(0)), "auto", n_boot=20)
    assert plain.lora is None and not any(x.startswith("LoRA") for x in design_lines(plain))
