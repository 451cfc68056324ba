"""A tiny real study with --batch_schedule=steps: the scheduled config runs beside the fixed
batches (same seeds), its records carry the ramp's batches, the timing pass times every batch
it visits, and the analysis and the report take it as one more config."""
import json
import os

import pytest

from jaxrl_scale.experiment.config import TrainConfig
from jaxrl_scale.experiment.study import SweepConfig, plan
from jaxrl_scale.experiment.sweep import run_sweep
from jaxrl_scale.scaling.io import read_jsonl


def _base(data_dir):
    return TrainConfig.make(data_dir=data_dir, model="tiny", num_train_examples=200,
                            num_test_examples=16, max_new_tokens=4, eval_prompts=8,
                            eval_samples=2, base_lr=1e-3)


def _sweep(root, **kw):
    return SweepConfig(sweep_dir=str(root / "sweep"), prompts=(4, 8), group_sizes=(2,),
                       base_prompts=0, lr_rules=("sqrt",), fixed_prompts=(), pairs=(),
                       seeds=(0,), max_responses=64, eval_every_responses=16, tune_lrs=(),
                       target="auto", compile_cache=False, batch_schedule="steps",
                       batch_ramp="0:4,16:16", **kw)


def test_plan_adds_a_scheduled_config_at_the_reference():
    sweep = SweepConfig(sweep_dir="/tmp/s", prompts=(8, 16, 32), group_sizes=(8,),
                        base_prompts=16, fixed_prompts=(32,), pairs=(), seeds=(0, 1),
                        gen_batch_ratios=(1, 2), batch_schedule="noise")
    runs = {os.path.basename(r.run_dir): r for r in plan(sweep, TrainConfig())}
    sched = {n: r for n, r in runs.items() if "_sched-" in n}
    # one per seed, synchronous only (a schedule runs the padded update), from P = 16
    assert sorted(sched) == ["grpo_P16_G8_sqrt_sched-noise_s0", "grpo_P16_G8_sqrt_sched-noise_s1"]
    r = sched["grpo_P16_G8_sqrt_sched-noise_s0"]
    assert r.batch_schedule == "noise" and r.batch_cap == 256 and r.prompts_per_step == 16
    assert all(x.batch_schedule == "none" for n, x in runs.items() if n not in sched)
    assert {x.seed for x in sched.values()} == {0, 1}


@pytest.mark.slow   # about 2 minutes on 2 shared cores: 3 runs and a 2-block timing pass
def test_tiny_sweep_with_a_steps_schedule(tmp_path):
    sweep = _sweep(tmp_path, timing_steps=1, timing_blocks=2, timing_max_blocks=2)
    summary = run_sweep(sweep, _base(str(tmp_path / "data")), progress=False)
    assert summary["errors"] == {} and "analysis_error" not in summary
    name = "grpo_P4_G2_sqrt_sched-steps"
    recs = read_jsonl(os.path.join(sweep.sweep_dir, name + "_s0", "metrics.jsonl"))[0]
    batches = [r["batch_train"] for r in recs if "actor_loss" in r]
    assert batches[:2] == [8, 8] and set(batches) == {8, 32}   # 16 responses on: P = 16
    with open(os.path.join(sweep.sweep_dir, "timing.json")) as f:
        timed = {e["batch"] for e in json.load(f)["entries"]}
    assert timed == {8, 16, 32}          # the grid's and the ramp's
    c = summary["configs"][name]
    assert c["batch"] is None and c["batch_schedule"] == "steps" and c["batch_start"] == 8
    assert set(summary["runs"]) == {"grpo_P4_G2_sqrt_s0", "grpo_P8_G2_sqrt_s0", name + "_s0"}
    report = os.path.join(os.path.dirname(summary["report_path"]), "batch_trajectory.png")
    assert os.path.isfile(report)
