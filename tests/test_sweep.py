"""Sweep runner: plan, resume without redoing finished runs, analysis at the end."""
import json
import os

import pytest

from jaxrl_scale.experiment import sweep as sweep_mod
from jaxrl_scale.experiment.config import TrainConfig
from jaxrl_scale.experiment.sweep import SweepConfig, plan, run_sweep


def _base(data_dir):
    return TrainConfig(data_dir=data_dir, model="tiny", num_train_examples=200,
                       num_test_examples=16, max_new_tokens=4, eval_prompts=8,
                       eval_samples=2, base_lr=1e-3)


def test_plan_grid_and_lr_rules():
    sweep = SweepConfig(sweep_dir="/tmp/s", prompts=(4, 8, 16), group_sizes=(8,),
                        lr_rules=("sqrt", "fixed"), seeds=(0, 1))
    runs = plan(sweep, TrainConfig())
    names = [os.path.basename(r.run_dir) for r in runs]
    # fixed lr at the reference batch is the sqrt run: 3 batches x 2 rules - 1, x 2 seeds
    assert len(runs) == 10 and len(set(names)) == 10
    assert "grpo_P4_G8_fixed_s0" not in names and "grpo_P16_G8_fixed_s1" in names
    assert {r.base_batch for r in runs} == {32}
    r = next(r for r in runs if r.prompts_per_step == 16)
    assert r.batch_train == 128 and r.eval_every == sweep.eval_every_responses // 128


def test_sweep_resume_skips_finished_runs(tmp_path, monkeypatch):
    data_dir = str(tmp_path / "data")
    sweep = SweepConfig(sweep_dir=str(tmp_path / "sweep"), prompts=(4, 8), group_sizes=(2,),
                        lr_rules=("sqrt",), max_responses=32, eval_every_responses=16,
                        target=0.5)
    calls = []
    real = sweep_mod.run_training

    def counting(cfg, **kw):
        calls.append(os.path.basename(cfg.run_dir))
        return real(cfg, **kw)

    monkeypatch.setattr(sweep_mod, "run_training", counting)
    summary = run_sweep(sweep, _base(data_dir), progress=False)
    assert sorted(calls) == ["grpo_P4_G2_sqrt_s0", "grpo_P8_G2_sqrt_s0"]
    assert summary["errors"] == {}
    # A random tiny policy never reaches 0.5: the analysis says so instead of inventing N*.
    assert "never reaches target" in summary["analysis_error"]
    for name in calls:
        with open(os.path.join(sweep.sweep_dir, name, "DONE.json")) as f:
            assert json.load(f)["responses"] >= 32
    # A second call redoes nothing; losing one run's DONE marker (a kill) redoes only it.
    calls.clear()
    run_sweep(sweep, _base(data_dir), progress=False)
    assert calls == []
    os.remove(os.path.join(sweep.sweep_dir, "grpo_P8_G2_sqrt_s0", "DONE.json"))
    run_sweep(sweep, _base(data_dir), progress=False)
    assert calls == ["grpo_P8_G2_sqrt_s0"]


def test_sweep_rejects_bad_grid_before_running(tmp_path):
    sweep = SweepConfig(sweep_dir=str(tmp_path), prompts=(2,), group_sizes=(1,))
    with pytest.raises(ValueError, match="group_size"):
        run_sweep(sweep, _base(str(tmp_path)), progress=False)
