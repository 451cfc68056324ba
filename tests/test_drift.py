"""r_q from an interleaved timing pass; steps resampled in blocks."""
import json

import numpy as np
import pytest

from jaxrl_scale import scaling
from jaxrl_scale.scaling import drift, stats
from jaxrl_scale.scaling.synthetic import SyntheticRun, write_synthetic_run


def test_block_bootstrap_keeps_slow_spells_together():
    rng = np.random.default_rng(0)
    d = np.r_[np.ones(100), 2 * np.ones(100)]          # one slow spell: half the run
    iid = stats.block_time_factors(d, 2000, rng, block=1)
    blk = stats.block_time_factors(d, 2000, rng)
    assert 1.5 * np.std(iid) < np.std(blk)
    assert abs(np.mean(blk) - 1) < 0.02
    assert np.all(stats.block_time_factors(np.ones(5), 10, rng) == 1)


def _sweep(root, timing):
    for name, b, q in (("grpo_B64_sqrt", 64, 20.0), ("grpo_B128_sqrt", 128, 10.0)):
        for k in range(3):   # same samples; B128's seeds ran in a busy spell: half the q
            write_synthetic_run(str(root), SyntheticRun(f"{name}_s{k}", b, 4000 * (1 + 0.05 * k), q,
                                seed=k, steps=100, extra_config={"base_batch": 64},
                                step_jitter=0.02, noise_seed=k))
    if timing:   # the interleaved pass: the same per-response cost at both batches
        rng = np.random.default_rng(1)
        ent = [{"batch": b, "gen_batch_ratio": 1,
                "step_s": list(b / 20.0 * np.exp(0.03 * rng.standard_normal(6)))}
               for b in (64, 128)]
        with open(root / drift.TIMING_FILE, "w") as f:
            json.dump(ent, f)


def test_interleaved_timing_pass_overrides_drifted_in_run_q(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _sweep(a, False)
    _sweep(b, True)
    s = scaling.analyze_sweep(str(a), target=0.2)
    assert s["drift"]["controlled"] is False and "not controlled" in s["drift"]["note"]
    assert s["configs"]["grpo_B128_sqrt"]["verdict"] == "slower"      # drift wrote it
    s = scaling.analyze_sweep(str(b), target=0.2)
    d = s["drift"]
    assert d["controlled"] and d["r_q_source"] == "interleaved timing pass"
    row = d["configs"]["grpo_B128_sqrt"]
    assert abs(row["r_q_interleaved"] - 1) < 0.1 and abs(row["in_run_over_interleaved"] - 0.5) < 0.05
    assert d["max_disagreement"] > 1.8
    c = s["configs"]["grpo_B128_sqrt"]
    assert c["verdict"] == "indistinguishable" and c["test"] == "paired t + interleaved r_q"
    assert abs(c["T_over_T0"] - 1) < 0.15 and abs(c["T_over_T0_in_run"] - 2) < 0.2
    assert c["T_over_T0_ci"][0] <= c["T_over_T0"] <= c["T_over_T0_ci"][1]
    # the config's r_q is the timing pass's, so T/T0 = r_N / r_q in its row; in-run kept
    assert c["r_q"] == row["r_q_interleaved"] and c["r_q_ci"] == row["r_q_interleaved_ci"]
    assert c["T_over_T0"] == pytest.approx(c["r_N"] / c["r_q"], rel=1e-9)
    assert abs(c["r_q_in_run"] - 0.5) < 0.05 and c["r_q_in_run_ci"][1] < 0.6


def test_a_refilled_config_keeps_its_in_run_r_q():
    """The pass times one rollout round per update; a --refill config's q counts its refill
    rounds' time too, so its r_q stays the runs' own (and the note says so)."""
    rng = np.random.default_rng(1)
    timing = [{"batch": b, "gen_batch_ratio": 1,
               "step_s": list(b / 20.0 * np.exp(0.03 * rng.standard_normal(6)))}
              for b in (64, 128)]
    st = {"algo": "grpo", "gen_batch_ratio": 1, "group_size": 8}
    configs = {"ref": dict(st, batch=64), "plain": dict(st, batch=128),
               "refill": dict(st, batch=128, refill=True)}
    d, ratios = drift.interleaved_r_q(timing, configs, {"grpo": ("ref", [])}, 0.9,
                                      in_run={"plain": 1.0, "refill": 1.0})
    assert set(d["configs"]) == set(ratios) == {"plain"}
    assert "refill keep in-run r_q" in d["note"]
    d, ratios = drift.interleaved_r_q(timing, dict(configs, ref=dict(
        st, batch=64, refill=True)), {"grpo": ("ref", [])}, 0.9)
    assert not ratios and d["controlled"] is False


def test_a_config_at_the_reference_entry_shares_its_throughput_in_a_block_pass():
    """Another loss at B0 is timed by the reference's own entry: its log r_q is 0 in every
    unit. A warm-start's own pass (same_entry) returns it, so the block test can put r_q = 1
    into the units; the study-wide pass leaves it to its runs (a zero-variance pass ratio has
    no t interval)."""
    rng = np.random.default_rng(2)
    timing = [{"batch": b, "gen_batch_ratio": 1, "group_size": 8,
               "step_s": list(b / 20.0 * np.exp(0.03 * rng.standard_normal(6)))}
              for b in (64, 128)]
    st = {"algo": "grpo", "gen_batch_ratio": 1, "group_size": 8}
    configs = {"ref": dict(st, batch=64), "other_loss": dict(st, batch=64),
               "big": dict(st, batch=128)}
    d, ratios = drift.interleaved_r_q(timing, configs, {"grpo": ("ref", [])}, 0.9)
    assert set(ratios) == {"big"}
    d, ratios = drift.interleaved_r_q(timing, configs, {"grpo": ("ref", [])}, 0.9,
                                      same_entry=True)
    assert set(ratios) == {"big", "other_loss"}
    assert ratios["other_loss"].log == 0.0 and not ratios["other_loss"].units.any()
    assert d["configs"]["other_loss"]["r_q_interleaved"] == 1.0
    assert ratios["big"].log == drift.interleaved_r_q(timing, configs, {"grpo": ("ref", [])},
                                                      0.9)[1]["big"].log
