"""Batch-scaling study (the main job): which batch reaches the target soonest, with intervals?

With no flags (--study=default): GRPO on the built-in 2-digit arithmetic task from the cached
SFT warm-start of the character-level CPU policy; the base lr tuned at the reference batch
B0 = 128 (P=16 x G=8) by a short stage of its own (1e-4, 2e-4, 3e-4); then P in
{8, 16, 32, 64, 128} x G = 8 (64..1024 responses per update, 16x) with the sqrt lr rule, the
fixed-lr control at P = 32 and 64, the equal-P*G pair P=32 x G=4, 3 seeds each, 2 micro-batches
of whole groups (noise scale); then summary.json, report.md and figures in --sweep_dir, at a
target chosen from the reference's curves (--target=auto). --study=full adds B = 32, a second
pair and a PPO sweep, reusing the default's runs when given the same --sweep_dir.

    python experiments/sweep_batch.py
    python experiments/sweep_batch.py --study=full
    python experiments/sweep_batch.py --prompts=8,16,32 --group_sizes=4,8 --seeds=0,1 \
        --base_prompts=8 --fixed_prompts= --pairs= --tune_lrs= --sweep_dir=runs/mine --target=0.6

Every TrainConfig field is also a flag (e.g. --task, --model, --base_lr, --micro_batches) and
sets the base config shared by all runs. Run it again to resume: finished runs are skipped.
"""
import dataclasses
import sys

from absl import app, flags, logging

import flagdefs
from jaxrl_scale.experiment.config import TrainConfig
from jaxrl_scale.experiment.report import facts, format_table
from jaxrl_scale.experiment.sft import SFTConfig, sft_warmstart
from jaxrl_scale.experiment.sweep import STUDIES, SweepConfig, study_config, run_sweep

_S = SweepConfig()
# Fields the study sets per run; every other TrainConfig field is a flag for the base config.
_PER_RUN = ("run_dir", "algo", "prompts_per_step", "group_size", "lr_rule", "seed", "target",
            "target_margin", "max_responses", "base_batch")
# The study's base run: 1500 held-out prompts x 16 samples (one eval's within-prompt SE about
# 0.0022: the reference gains only ~0.03 over the budget, and the design asks SE <= 1/6 of the
# gap to the target, half of that gain), 2 micro-batches of whole groups (the noise scale B_simple), and gradient clipping as
# a guard only, far above the measured norms (the lr rule must not be confounded by clipping).
STUDY_BASE = {"num_test_examples": 1500, "eval_prompts": 1500, "eval_samples": 16,
              "micro_batches": 2, "max_grad_norm": 10.0, "base_lr": 2e-4}
flagdefs.define_from_dataclass(TrainConfig, skip=_PER_RUN, overrides=STUDY_BASE)
flags.DEFINE_enum("study", "default", sorted(STUDIES), "Study design; the flags below "
                  "override its fields.")
flags.DEFINE_string("sweep_dir", _S.sweep_dir, "Where the runs and the report go.")
flags.DEFINE_list("algos", list(_S.algos), "grpo and/or ppo.")
flags.DEFINE_list("prompts", [str(p) for p in _S.prompts], "Prompt batch sizes P.")
flags.DEFINE_list("group_sizes", [str(g) for g in _S.group_sizes], "Group sizes G (GRPO).")
flags.DEFINE_list("lr_rules", list(_S.lr_rules), "fixed, linear, sqrt, malladi.")
flags.DEFINE_list("fixed_prompts", [str(p) for p in _S.fixed_prompts],
                  "P values also run with the fixed lr (the control).")
flags.DEFINE_list("pairs", [f"{p}x{g}" for p, g in _S.pairs],
                  "Extra PxG points (equal P*G to a grid point, another G).")
flags.DEFINE_list("ppo_prompts", [str(p) for p in _S.ppo_prompts], "PPO's P grid.")
flags.DEFINE_list("seeds", [str(s) for s in _S.seeds], "Seeds per configuration.")
flags.DEFINE_integer("base_prompts", _S.base_prompts, "Reference P (0: smallest).")
flags.DEFINE_integer("base_group", _S.base_group, "Reference G (0: smallest).")
flags.DEFINE_integer("max_responses", _S.max_responses, "Response budget per run.")
flags.DEFINE_integer("eval_every_responses", _S.eval_every_responses,
                     "Evaluate about every this many retained responses.")
flags.DEFINE_list("tune_lrs", [f"{x:g}" for x in _S.tune_lrs],
                  "Base lrs tried at the reference batch before the study (empty: --base_lr).")
flags.DEFINE_integer("tune_responses", _S.tune_responses, "Budget of each lr-tuning run.")
flags.DEFINE_string("target", "auto", "Validation score J* of the analysis, or 'auto' "
                    "(start + half of what every reference seed reaches).")
flags.DEFINE_bool("compile_cache", _S.compile_cache, "JAX persistent compilation cache.")
flags.DEFINE_bool("warmstart", True, "Start every run from the cached SFT warm-start.")
flags.DEFINE_float("warmstart_accuracy", SFTConfig.target_accuracy,
                   "Greedy held-out accuracy the warm-start stops at.")
FLAGS = flags.FLAGS


def _parse(name, value):
    """A SweepConfig field from its flag's value, with a one-line error naming the flag."""
    try:
        if name in ("pairs",):
            return tuple(tuple(int(x) for x in v.lower().split("x")) for v in value)
        if name == "tune_lrs":
            return tuple(float(x) for x in value)
        if name in ("algos", "lr_rules"):
            return tuple(value)
        if isinstance(value, list):
            return tuple(int(x) for x in value)
        return value
    except ValueError as e:
        raise app.UsageError(f"--{name}={','.join(value)}: {e}. Fix: "
                             + ("give PxG items, e.g. 32x4" if name == "pairs"
                                else "give comma-separated numbers")) from None


def sweep_from_flags() -> SweepConfig:
    """The --study preset with every flag the user gave on top of it."""
    overrides = {}
    for f in dataclasses.fields(SweepConfig):
        if f.name in FLAGS and FLAGS[f.name].present:
            overrides[f.name] = _parse(f.name, FLAGS[f.name].value)
    return study_config(FLAGS.study, **overrides)


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)   # orbax logs every checkpoint at INFO
    base = flagdefs.build_from_flags(TrainConfig, skip=_PER_RUN)
    sweep = sweep_from_flags()
    if FLAGS.warmstart and not (base.init_checkpoint or base.hf_checkpoint):
        path, info = sft_warmstart(SFTConfig(
            task=base.task, task_kwargs=base.task_kwargs, data_dir=base.data_dir,
            model=base.model, num_train_examples=base.num_train_examples,
            num_test_examples=base.num_test_examples, max_new_tokens=base.max_new_tokens,
            target_accuracy=FLAGS.warmstart_accuracy))
        print(f"warm-start: {path} (greedy held-out accuracy {info['accuracy']:.3f})")
        base = base.replace(init_checkpoint=path)
    summary = run_sweep(sweep, base)
    if "analysis_error" in summary:
        print(f"analysis failed: {summary['analysis_error']}\nThe runs are in {sweep.sweep_dir}; "
              "rerun experiments/analyze.py once the problem is fixed.", file=sys.stderr)
        return 1
    for s in facts(summary):
        print(f"- {s}")
    print()
    print(format_table(summary))
    for name, err in summary.get("errors", {}).items():
        print(f"run {name} failed: {err}", file=sys.stderr)
    print(f"\nwrote {summary['summary_path']} and {summary['report_path']}")
    return 0


if __name__ == "__main__":
    app.run(main)
