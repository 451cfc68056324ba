"""Timing pass, step-time fit, r_q prediction and the roofline (docs/science.md, Step-cost
model)."""
import math

import numpy as np
import pytest

from jaxrl_scale import bench
from jaxrl_scale.models.config import ModelConfig, get_config
from jaxrl_scale.scaling import roofline
from jaxrl_scale.scaling.step_cost import COLUMNS as FIT_COLUMNS
from jaxrl_scale.scaling.step_cost import fit_step_times, predict_r_q
from jaxrl_scale.scaling.step_cost import step_seconds as step_seconds_model

# A Llama-2-7B-shaped decoder (no GQA), weights and compute in bf16.
LLAMA7B = ModelConfig(vocab_size=32000, hidden_size=4096, num_layers=32, num_heads=32,
                      num_kv_heads=32, head_dim=128, intermediate_size=11008, max_seq_len=4096,
                      param_dtype="bfloat16", dtype="bfloat16")


# ----------------------------------------------------------------------------- time_batches

@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("data"))


def _tiny_base(tmp_path, data_dir, **kw):
    from jaxrl_scale.experiment.config import TrainConfig
    return TrainConfig.make(run_dir=str(tmp_path / "unused"), data_dir=data_dir, model="tiny",
                            num_train_examples=200, num_test_examples=32, group_size=4,
                            max_new_tokens=4, eval_prompts=8, filter_zero_variance=True, **kw)


def _check_entries(out, batches, steps, k):
    assert [e["batch"] for e in out] == batches
    for e in out:
        assert e["batch_gen"] == k * e["batch"] and e["gen_batch_ratio"] == k
        assert e["prompts_per_step"] * e["group_size"] == e["batch"]
        assert e["compile_s"] > 0
        for key in ("gen_s", "train_s", "decode_s", "update_s", "step_s"):
            assert len(e[key]) == steps and all(math.isfinite(x) and x > 0 for x in e[key]), key
        # the update ran (filter_zero_variance is turned off for timing) and sits inside train_s
        assert all(u <= t for u, t in zip(e["update_s"], e["train_s"]))
        assert all(d <= g for d, g in zip(e["decode_s"], e["gen_s"]))


def test_time_batches_structure(tmp_path, data_dir):
    from jaxrl_scale.experiment.timing import time_batches
    base = _tiny_base(tmp_path, data_dir)
    out = time_batches(base, [8], warmup=1, steps=2, progress=False)   # (the fit: synthetic)
    _check_entries(out, [8], 2, 1)
    assert "env_s" not in out[0]
    assert not (tmp_path / "unused").exists()   # nothing written to the run directory


@pytest.mark.slow   # one more engine compile; the structure test covers the loop
def test_time_batches_partial_rollout_one_at_a_time(tmp_path, data_dir):
    from jaxrl_scale.experiment.timing import time_batches
    base = _tiny_base(tmp_path, data_dir, gen_batch_ratio=2)
    out = time_batches(base, [8], warmup=2, steps=2, progress=False, interleave=False)
    _check_entries(out, [8], 2, 2)


def test_time_batches_records_environment_seconds_of_multi_turn_runs(tmp_path, data_dir):
    """--env: each timed step's env_s is in its entry (inside gen_s); a single-turn pass has
    no env_s key at all (test_time_batches_structure's entries are as before)."""
    from jaxrl_scale.experiment.timing import time_batches
    base = _tiny_base(tmp_path, data_dir, env="jaxrl_scale.data.envs:retry", env_max_turns=2)
    (e,) = time_batches(base, [8], warmup=1, steps=2, progress=False)
    _check_entries([e], [8], 2, 1)
    assert len(e["env_s"]) == 2
    assert all(0 <= v <= g for v, g in zip(e["env_s"], e["gen_s"]))


def test_time_batches_rejects_batches_off_the_group_size(tmp_path, data_dir):
    from jaxrl_scale.experiment.timing import time_batches
    with pytest.raises(ValueError, match="multiple of group_size"):
        time_batches(_tiny_base(tmp_path, data_dir), [8, 10], progress=False)


# ----------------------------------------------------------------------------- fit + r_q

TRUTH = dict(d0=0.8, d1=0.002, gamma=0.004, overhead=0.05)


def _synthetic(batches, k, steps, rng, noise=0.03):
    """Per-update gen_s = t_gen(kB)/k and train_s = overhead + gamma B, times lognormal noise."""
    out = []
    for B in batches:
        gen = (TRUTH["d0"] + TRUTH["d1"] * k * B) / k
        train = TRUTH["overhead"] + TRUTH["gamma"] * B
        out.append({"batch": B, "batch_gen": k * B,
                    "gen_s": (gen * np.exp(noise * rng.standard_normal(steps))).tolist(),
                    "train_s": (train * np.exp(noise * rng.standard_normal(steps))).tolist()})
    return out


def test_fit_step_times_recovers_known_costs():
    rng = np.random.default_rng(1)
    timings = _synthetic([64, 128, 256, 512], 1, 12, rng) + _synthetic([64, 256], 2, 12, rng)
    fit = fit_step_times(timings, n_boot=1000, seed=0)
    assert fit["boot"].shape == (1000, 4) and fit["n_steps"] == 72
    for j, c in enumerate(FIT_COLUMNS):
        lo, hi = fit[c + "_ci"]
        assert lo <= TRUTH[c] <= hi, (c, fit[c], fit[c + "_ci"])
        assert fit[c] == pytest.approx(TRUTH[c], rel=0.15), c
        assert np.nanmedian(fit["boot"][:, j]) == pytest.approx(fit[c], rel=0.1), c
    # noise-free timings: exact recovery and zero-width intervals
    exact = fit_step_times(_synthetic([64, 128, 512], 1, 3, rng, noise=0.0), n_boot=20)
    for c in FIT_COLUMNS:
        assert exact[c] == pytest.approx(TRUTH[c], rel=1e-9)
        assert exact[c + "_ci"] == pytest.approx([TRUTH[c]] * 2, rel=1e-9)


def _two_rollout_ratios(seed):
    """Noise-free timings at k = 1 and 2."""
    rng = np.random.default_rng(seed)
    return _synthetic([64, 128, 512], 1, 3, rng, noise=0.0) + \
        _synthetic([64, 256], 2, 4, rng, noise=0.0)


def _record_line(timings, field, d0, d1):
    """Each step's `field` seconds on the line d0 + d1 B_gen (per update: / k)."""
    for t in timings:
        k = t["batch_gen"] / t["batch"]
        t[field] = [(d0 + d1 * t["batch_gen"]) / k] * len(t["gen_s"])


def test_reward_time_is_measured_as_part_of_generation():
    """A pass that records reward_s: its line is fitted like t_gen's (here 0.2 + 0.001 B_gen s,
    exact on noise-free steps, at k = 1 and 2) and changes no other coefficient; a pass without
    reward_s (older timing.json) has no reward line."""
    timings = _two_rollout_ratios(0)
    plain = fit_step_times(timings, n_boot=20)
    _record_line(timings, "reward_s", 0.2, 0.001)
    fit = fit_step_times(timings, n_boot=20)
    assert fit["reward_d0"] == pytest.approx(0.2, rel=1e-9)
    assert fit["reward_d1"] == pytest.approx(0.001, rel=1e-9)
    assert all(fit[c] == plain[c] for c in FIT_COLUMNS)
    assert "reward_d0" not in plain
    timings[0]["reward_s"][0] = float("nan")      # one step without it: no line, no guess
    assert "reward_d0" not in fit_step_times(timings, n_boot=20)


def test_environment_and_reward_time_make_one_external_line():
    """A multi-turn pass records env_s beside reward_s: the external line is fitted to their
    sum (exact on noise-free steps: 0.5 + 0.003 B_gen s), the reward line stays the reward's,
    and the step-time coefficients do not move; a single-turn pass has no external line."""
    timings = _two_rollout_ratios(1)
    plain = fit_step_times(timings, n_boot=20)
    _record_line(timings, "reward_s", 0.2, 0.001)
    assert "external_d0" not in fit_step_times(timings, n_boot=20)
    _record_line(timings, "env_s", 0.3, 0.002)
    fit = fit_step_times(timings, n_boot=20)
    assert fit["external_d0"] == pytest.approx(0.5, rel=1e-9)
    assert fit["external_d1"] == pytest.approx(0.003, rel=1e-9)
    assert fit["reward_d1"] == pytest.approx(0.001, rel=1e-9)
    assert all(fit[c] == plain[c] for c in FIT_COLUMNS)


def test_fit_step_times_needs_two_batches():
    with pytest.raises(ValueError, match="2 distinct"):
        fit_step_times([{"batch": 8, "batch_gen": 8, "gen_s": [1.0, 1.1], "train_s": [1, 1]}])


def test_predict_r_q_by_hand():
    # d0 = 1 s, d1 = 0.01 s/row, gamma = 0.02 s/row, overhead = 0.5 s
    fit = {"d0": 1.0, "d1": 0.01, "gamma": 0.02, "overhead": 0.5}
    fit["boot"] = np.array([[1.0, 0.01, 0.02, 0.5], [2.0, 0.01, 0.02, 0.5]])
    # k = 1: t(100) = 1 + 1 + 0.5 + 2 = 4.5 s; t(400) = 1 + 4 + 0.5 + 8 = 13.5 s
    r = predict_r_q(fit, [100, 400], 100)
    assert r["t_step_s"] == pytest.approx([4.5, 13.5])
    assert r["r_q"] == pytest.approx([1.0, (400 / 13.5) / (100 / 4.5)])   # 4/3
    # replicate 2 (d0 = 2): t(100) = 5.5, t(400) = 14.5
    assert r["boot"].shape == (2, 2)
    assert r["boot"][1, 1] == pytest.approx((400 / 14.5) / (100 / 5.5))
    assert r["r_q_ci"].shape == (2, 2)
    assert r["r_q_ci"][1, 0] <= r["r_q"][1] <= r["r_q_ci"][1, 1] + 1e-12
    # k = 2: t(100) = (1 + 2) / 2 + 0.5 + 2 = 4.0 s; t(400) = (1 + 8) / 2 + 0.5 + 8 = 13.0 s
    r2 = predict_r_q(fit, [100, 400], 100, gen_batch_ratio=2)
    assert r2["t_step_s"] == pytest.approx([4.0, 13.0])
    assert r2["r_q"] == pytest.approx([1.0, (400 / 13.0) / (100 / 4.0)])
    # partial rollout at B = 100 against the synchronous reference: 4.5 s / 4.0 s
    r3 = predict_r_q(fit, [100], 100, gen_batch_ratio=2, gen_batch_ratio0=1)
    assert r3["r_q"] == pytest.approx([4.5 / 4.0])
    assert step_seconds_model(np.array([1.0, 0.01, 0.02, 0.5]), np.array([400.0]), 2) == \
        pytest.approx([13.0])


# ----------------------------------------------------------------------------- roofline

def test_chip_table_has_the_six_chips_with_sources():
    for name in ("H100", "H200", "A100", "TPU v5e", "TPU v5p", "TPU v6e"):
        c = bench.CHIPS[name]
        assert c["flops"]["bfloat16"] > 1e14 and c["hbm_bytes_per_s"] > 5e11, name
        assert c["source"] and c["url"].startswith("https://"), name
    # docs/science.md, Step-cost model: the bf16 ridge (peak FLOP/s over HBM bandwidth) ~206
    # on an H200, ~240 on a TPU v5e
    ridge = lambda n: bench.CHIPS[n]["flops"]["bfloat16"] / bench.CHIPS[n]["hbm_bytes_per_s"]
    assert ridge("H200") == pytest.approx(206, abs=1) and ridge("TPU v5e") == pytest.approx(240, abs=1)
    with pytest.raises(ValueError, match="no published float32"):
        bench.chip_entry("TPU v5e", "float32")
    with pytest.raises(ValueError, match="unknown chip"):
        bench.chip_entry("Z80")


def test_cpu_this_machine_measures_peaks():
    e = bench.chip_entry(bench.CPU_THIS_MACHINE, "float32")
    assert e["flops"]["float32"] > 1e8 and e["hbm_bytes_per_s"] > 1e8 and "measured" in e["source"]
    p = roofline.predict_step_times(get_config("tiny"), bench.CPU_THIS_MACHINE, 4, 8, 4,
                                    dtype="float32")
    assert p["decode_s"] > 0 and p["update_s"] > 0


def test_roofline_7b_on_h100_memory_bound_at_batch_1():
    p = roofline.predict_step_times(LLAMA7B, "H100", 1, 128, 128)
    weight_bytes = 2 * (LLAMA7B.num_params() - 32000 * 4096)   # bf16 matmul weights, no lookup
    assert weight_bytes == pytest.approx(13.21e9, rel=1e-3)
    assert p["bound"] == "memory" and set(p["step_bound"]) == {"memory"}
    # ~3.9 ms per token: the weights once per step at 3.35 TB/s (the KV cache adds < 1%)
    assert p["decode_step_s"][0] == pytest.approx(weight_bytes / 3.35e12, rel=0.01)
    assert p["decode_s"] == pytest.approx(np.sum(p["decode_step_s"]))
    assert p["decode_steps"] == 128
    # the ridge batch ~ peak / bandwidth (bf16: 2 FLOPs per 2-byte weight) = 295 on an H100
    short = roofline.predict_step_times(LLAMA7B, "H100", 1, 1, 1)
    assert short["ridge_batch"] == pytest.approx(989 / 3.35, rel=0.02)


def test_roofline_compute_bound_at_large_batch_and_count():
    cfg = get_config("qwen2.5-0.5b")
    B = 1 << 16
    p = roofline.predict_step_times(cfg, "H100", B, 16, 16)
    assert p["bound"] == "compute" and p["ridge_batch"] < B
    flops0 = bench.decode_step_flops(cfg.replace(dtype="bfloat16"), B, 16)
    assert p["decode_step_s"][0] == pytest.approx(flops0 / 989e12, rel=1e-9)
    p8 = roofline.predict_step_times(cfg, "H100", B, 16, 16, count=8)
    assert p8["decode_s"] == pytest.approx(p["decode_s"] / 8)
    assert p8["update_s"] == pytest.approx(p["update_s"] / 8)
    half = roofline.predict_step_times(cfg, "H100", B, 16, 16, flops_efficiency=0.5)
    assert half["decode_s"] == pytest.approx(2 * p["decode_s"])


def test_roofline_update_and_prefill_by_hand():
    cfg = get_config("tiny")            # float32 params; matmul params = all but the lookup
    chip = bench.measured_chip(1e12, 1e11, "float32")
    B, prompt, resp = 4, 8, [2, 5, 3, 4]
    p = roofline.predict_step_times(cfg, chip, B, prompt, resp, dtype="float32")
    T = prompt + 5                      # padded row: prompt + longest response
    p_mm = cfg.num_params() - 128 * 64  # untied: the LM head is a matmul, the table is not
    attn = 4 * 2 * 4 * 16 * T * (T + 1) / 2
    flops = 3 * B * (2 * p_mm * T + attn)
    assert p["update_flops"] == pytest.approx(flops)
    assert p["update_s"] == pytest.approx(flops / 1e12 + 7 * 4 * cfg.num_params() / 1e11)
    # prefill: 7 prompt tokens through the layers, no LM head (compute: tiny bytes per FLOP)
    assert p["prefill_flops"] == pytest.approx(bench.prefill_flops(cfg, B, prompt - 1))
    assert p["prefill_s"] == pytest.approx(max(p["prefill_flops"] / 1e12,
                                               p["prefill_bytes"] / 1e11))


def test_decode_schedule_modes():
    off, b, w = roofline.decode_schedule([2, 5, 3, 4], 4, "generate")
    assert off.tolist() == [0, 1, 2, 3, 4] and b.tolist() == [4] * 5 and w.tolist() == [1] * 5
    _, b, _ = roofline.decode_schedule([2, 5, 3, 4], 4, "shrink")
    assert b.tolist() == [4, 4, 3, 2, 1]
    off, b, w = roofline.decode_schedule([2, 4], 8, "refill")     # a distribution, mean 3
    assert w.sum() == pytest.approx(3) and b.tolist() == [8] * 3
    assert off[0] == pytest.approx((1 + 6) / 2 / 3)               # E[L(L-1)/2] / E[L]
    # samples of a distribution (size != batch): P(the longest of B draws > t)
    _, _, w = roofline.decode_schedule([1, 3, 3], 2, "generate")
    assert w.tolist() == pytest.approx([1, 1 - (1 / 3) ** 2, 1 - (1 / 3) ** 2])
    with pytest.raises(ValueError):
        roofline.decode_schedule([0, 2], 2)


def test_compare_decode_bench_on_its_own_prediction():
    cfg = get_config("tiny")
    bw, peak = 2e10, 1e11
    rows = []
    for B in (1, 64):
        chip = bench.measured_chip(peak, bw, "float32")
        p = roofline.predict_step_times(cfg, chip, B, 16, 8, dtype="float32",
                                        param_dtype="float32")
        rows.append({"batch": B, "decode_step_s": p["decode_s"] / 8,
                     "prefill_s": p["prefill_s"] + p["decode_step_s"][0],
                     "matmul_peak_flops_per_s": peak})
    record = {"model": {**cfg.__dict__, "num_params": cfg.num_params()},
              "flags": {"prompt_len": 16, "new_tokens": 8, "dtype": "float32"},
              "machine": {"copy": {"bytes_per_s": bw}}, "results": rows}
    out = roofline.compare_decode_bench(record)
    assert [r["batch"] for r in out] == [1, 64]
    assert all(abs(r["rel_error"]) < 1e-9 and abs(r["prefill_rel_error"]) < 1e-9 for r in out)


def test_roofline_fit_feeds_predict_r_q():
    cfg = get_config("qwen2.5-0.5b")
    fit = roofline.roofline_fit(cfg, "H200", [64, 128, 256], 128, 256)
    assert fit["d0"] > 0 and fit["d1"] > 0 and fit["gamma"] > 0
    r = predict_r_q(fit, [64, 256], 64)
    assert r["r_q"][0] == pytest.approx(1.0) and r["r_q"][1] > 1   # d0 amortised over rows
    assert np.all(np.isnan(r["r_q_ci"])) and r["boot"].shape == (0, 2)


def test_time_blocks_rebuild_each_block_and_record_the_stopping_rule(tmp_path, data_dir):
    """The timing pass runs in blocks (each a fresh build, its own random round order);
    every step list has its block beside it, and timing.json records the rule it stopped by."""
    from jaxrl_scale.experiment.timing import time_blocks
    from jaxrl_scale.scaling.drift import half_widths, pass_ratio
    base = _tiny_base(tmp_path, data_dir)
    out = time_blocks(base, [8, 16], 8, warmup=0, steps=2, min_blocks=2, max_blocks=2,
                      tolerance=1e-9, progress=False)
    assert out["blocks"] == 2 and out["stopping"]["stopped"] == "max_blocks"
    assert "after 2 blocks" in out["stopping"]["rule"]
    for e in out["entries"]:
        assert e["block"] == [0, 0, 1, 1] and len(e["step_s"]) == 4
        assert len(e["compile_s"]) == 2          # built (and compiled) once per block
        assert len(e["load_1min"]) == 2 and e["cpus"] >= 1   # the machine's load per block
    e8, e16 = out["entries"]
    assert pass_ratio(e16, e8).unit == "block" and pass_ratio(e16, e8).units.size == 2
    assert list(half_widths(out["entries"], 8, 0.9)) == [16]
    assert [list(h) for h in out["stopping"]["half_widths"]] == [["16"], ["16"]]
