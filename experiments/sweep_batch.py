"""Batch-scaling sweep (the main job): which batch reaches the target soonest?

With no flags: GRPO on the built-in 2-digit arithmetic task from the cached SFT warm-start of
the character-level CPU policy, P in {4, 8, 16, 32, 64} x G = 8 (32..512 responses per update,
16x), sqrt-scaled vs fixed lr, then summary.json, report.md and figures in --sweep_dir.

    python experiments/sweep_batch.py
    python experiments/sweep_batch.py --prompts=8,16,32 --group_sizes=4,8 --lr_rules=sqrt \
        --seeds=0,1 --algos=grpo,ppo --sweep_dir=runs/big --target=0.6

Every TrainConfig field is also a flag (e.g. --task, --model, --base_lr, --micro_batches) and
sets the base config shared by all runs. Run it again to resume: finished runs are skipped.
"""
import sys

from absl import app, flags

import flagdefs
from jaxrl_scale.experiment.config import TrainConfig
from jaxrl_scale.experiment.report import facts, format_table
from jaxrl_scale.experiment.sft import SFTConfig, sft_warmstart
from jaxrl_scale.experiment.sweep import SweepConfig, run_sweep

_S = SweepConfig()
# Fields the sweep sets per run; every other TrainConfig field is a flag for the base config.
_PER_RUN = ("run_dir", "algo", "prompts_per_step", "group_size", "lr_rule", "seed", "target",
            "target_margin", "max_responses")
# base_lr is the lr at the reference (smallest) batch of the grid; 256 eval prompts x 4 samples
# keep the eval noise near +-0.015 so N* is not decided by noise.
flagdefs.define_from_dataclass(TrainConfig, skip=_PER_RUN,
                               overrides={"base_lr": 1e-4, "eval_prompts": 256})
flags.DEFINE_string("sweep_dir", _S.sweep_dir, "Where the runs and the report go.")
flags.DEFINE_list("algos", list(_S.algos), "grpo and/or ppo.")
flags.DEFINE_list("prompts", [str(p) for p in _S.prompts], "Prompt batch sizes P.")
flags.DEFINE_list("group_sizes", [str(g) for g in _S.group_sizes], "Group sizes G (GRPO).")
flags.DEFINE_list("lr_rules", list(_S.lr_rules), "fixed, linear, sqrt, malladi.")
flags.DEFINE_list("seeds", [str(s) for s in _S.seeds], "Seeds per configuration.")
flags.DEFINE_integer("base_prompts", _S.base_prompts, "Reference P (0: smallest).")
flags.DEFINE_integer("base_group", _S.base_group, "Reference G (0: smallest).")
flags.DEFINE_integer("max_responses", _S.max_responses, "Response budget per run.")
flags.DEFINE_integer("eval_every_responses", _S.eval_every_responses,
                     "Evaluate about every this many retained responses.")
flags.DEFINE_float("target", 0.30, "Validation score J*: runs stop at N*(1+margin).")
flags.DEFINE_float("target_margin", _S.target_margin, "Keep training this far past N*.")
flags.DEFINE_bool("warmstart", True, "Start every run from the cached SFT warm-start.")
flags.DEFINE_float("warmstart_accuracy", SFTConfig.target_accuracy,
                   "Greedy held-out accuracy the warm-start stops at.")
FLAGS = flags.FLAGS


def _ints(xs):
    try:
        return tuple(int(x) for x in xs)
    except ValueError as e:
        raise app.UsageError(f"expected integers, got {xs}: {e}")


def main(argv):
    del argv
    base = flagdefs.build_from_flags(TrainConfig, skip=_PER_RUN)
    if FLAGS.warmstart and not (base.init_checkpoint or base.hf_checkpoint):
        path, info = sft_warmstart(SFTConfig(
            task=base.task, task_kwargs=base.task_kwargs, data_dir=base.data_dir,
            model=base.model, num_train_examples=base.num_train_examples,
            num_test_examples=base.num_test_examples, max_new_tokens=base.max_new_tokens,
            target_accuracy=FLAGS.warmstart_accuracy))
        print(f"warm-start: {path} (greedy held-out accuracy {info['accuracy']:.3f})")
        base = base.replace(init_checkpoint=path)
    sweep = SweepConfig(
        sweep_dir=FLAGS.sweep_dir, algos=tuple(FLAGS.algos), prompts=_ints(FLAGS.prompts),
        group_sizes=_ints(FLAGS.group_sizes), lr_rules=tuple(FLAGS.lr_rules),
        seeds=_ints(FLAGS.seeds), base_prompts=FLAGS.base_prompts, base_group=FLAGS.base_group,
        max_responses=FLAGS.max_responses, eval_every_responses=FLAGS.eval_every_responses,
        target=FLAGS.target, target_margin=FLAGS.target_margin)
    summary = run_sweep(sweep, base)
    if "analysis_error" in summary:
        print(f"analysis failed: {summary['analysis_error']}\nThe runs are in {sweep.sweep_dir}; "
              "rerun experiments/analyze.py with another --target.", file=sys.stderr)
        return 1
    print(format_table(summary))
    print()
    for s in facts(summary):
        print(f"- {s}")
    for name, err in summary.get("errors", {}).items():
        print(f"run {name} failed: {err}", file=sys.stderr)
    print(f"\nwrote {summary['summary_path']} and {summary['report_path']}")


if __name__ == "__main__":
    app.run(main)
