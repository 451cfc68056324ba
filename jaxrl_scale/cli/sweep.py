"""Batch-scaling study (the main job): which batch reaches the target soonest, with intervals?

With no flags (--study=default): GRPO on the built-in 2-digit arithmetic task from 6 SFT
warm-starts of the character-level CPU policy (SFT seeds --warmstart_seed + 0..5, cached), the
warm-starts the blocks of the test, so its verdicts are about the population of warm-starts;
the base lr tuned at the reference batch B0 = 128 (P=16 x G=8) by a short stage of its own
(1e-4, 2e-4, 3e-4 at 3 seeds each, across the warm-starts); then P in {8, 16, 32, 64, 128} x
G = 8 (64..1024 responses per update, 16x) with the sqrt lr rule, 2 seeds from each warm-start,
exact evals every 1,024 responses, 2 micro-batches of whole groups (noise scale). Each
warm-start's reference runs go first, to the full budget, and set its target; its other runs
stop 3 evals after reaching it; a one-block timing pass follows each warm-start. Then
summary.json, report.md and figures in --sweep_dir, at a target chosen from each warm-start's
reference curves (--target=auto). --study=full adds B = 32, the fixed-lr control at P = 32
and 64, two equal-P*G pairs and a PPO sweep, reusing the default's runs when given the same
--sweep_dir.

    python experiments/sweep_batch.py
    python experiments/sweep_batch.py --study=full
    python experiments/sweep_batch.py --prompts=8,16,32 --group_sizes=4,8 --seeds=0,1 \
        --base_prompts=8 --fixed_prompts= --pairs= --tune_lrs= --sweep_dir=runs/mine --target=0.6

--task=arith_chain runs the same study on chains of 1-6 operations with shown work (responses of
tens of characters with a long tail, generation-heavy steps like LLM RL; results/workload/): the
task brings its own response cap and warm-start (keyed by task), and is evaluated with samples
(its reward reads the final number, so the exact eval does not apply).

--gen_batch_ratios=1,2 runs every config also with asynchronous partial rollout (B_gen = 2 x
B_train; runs named ..._k2_s<seed>) and adds the partial-vs-synchronous comparison to the report.

--updates_per_rollout=1,2,4 runs every config also with u optimizer updates per rollout batch
(u minibatches of whole groups; runs named ..._u2_s<seed>): the same responses, more updates.

--batch_schedule=noise (or steps with --batch_ramp=RESPONSES:P,...) adds, per algorithm, a
config whose batch grows during the run, starting at the reference P and G (runs named
..._sched-noise_s<seed>); the analysis times it along its recorded batch trajectory.

--executor=ray runs each run as a Ray task (--ray_address: an existing cluster, else a local
one; --ray_cpus_per_run); --list_runs prints the runs by index and --run_index=I runs one of
them alone (a job array), after which jaxrl-analyze --sweep_dir=DIR writes the report.

Every TrainConfig field is also a flag (e.g. --task, --model, --base_lr, --micro_batches) and
sets the base config shared by all runs. Run it again to resume: finished runs are skipped.
"""
import dataclasses
import os
import sys

from absl import flags

from jaxrl_scale.cli import (flagdefs, one_line_errors, print_summary, quiet_logging, run_main,
                             set_error_dir)
from jaxrl_scale.experiment.errors import ConfigError
from jaxrl_scale.experiment.rundir import prepare_run_dir
from jaxrl_scale.experiment.config import TrainConfig
from jaxrl_scale.experiment.inputs import load_inputs
from jaxrl_scale.experiment.sft import (SFTConfig, check_warm_start, sft_config_for, sft_path,
                                        sft_warmstart)
from jaxrl_scale.experiment.study import (STUDIES, SweepConfig, all_runs, sequential_plan,
                                          exact_eval_where_possible, study_config)
from jaxrl_scale.experiment.sweep import (EXIT_RUNS_FAILED, check_run_index, run_one, run_sweep,
                                          validate_sweep)
from jaxrl_scale.experiment.sweep import exit_status as sweep_exit_status

SWEEP_HELP = {
    "sweep_dir": "where the runs and the report go", "algos": "grpo and/or ppo",
    "prompts": "prompt batch sizes P", "group_sizes": "group sizes G (GRPO)",
    "lr_rules": "fixed, linear, sqrt, malladi",
    "fixed_prompts": "P values also run with the fixed lr (the control)",
    "pairs": "extra PxG points (equal P*G to a grid point, another G)",
    "ppo_prompts": "PPO's P grid (empty: --prompts)",
    "seeds": "seeds per configuration (per warm-start)",
    "warm_starts": "SFT warm-starts (seeds --warmstart_seed ...); every config runs from each, "
                   "and the test takes the warm-starts as its blocks",
    "warm_start_checkpoints": "your own warm-starts (orbax params dirs), one block each",
    "gen_batch_ratios": "rollout ratios k: every config also runs with B_gen = k * B_train "
                        "sequences in flight (asynchronous partial rollout; 1: synchronous)",
    "updates_per_rollout": "optimizer updates per rollout batch u: every config also runs "
                           "with u minibatches of whole groups, one update each (name tag "
                           "_u<u>; samples stay responses generated)",
    "base_prompts": "reference P (0: smallest)", "base_group": "reference G (0: smallest)",
    "max_responses": "response budget per run",
    "eval_every_responses": "evaluate about every this many retained responses",
    "tune_lrs": "base lrs tried at the reference batch first (empty: --base_lr)",
    "tune_seeds": "seeds per lr in the lr-tuning stage (>= 2: the choice, its flat set and "
                  "its bracket are told from seed noise with 90% intervals; one seed: the "
                  "best score, noise not measured)",
    "tune_responses": "budget of each lr-tuning run",
    "retune_lr_per_batch": "also tune the lr at every batch of the grid (the source's "
                           "recommendation) and run a config per batch with its own tuned lr "
                           "(rule 'tuned'); the report compares it with the lr rules and "
                           "states what the tuning cost",
    "timing_steps": "timed steps per batch of an interleaved timing pass after the runs "
                    "(0: none; r_q then comes from in-run step times, drift not controlled)",
    "timing_blocks": "blocks of the timing pass (each a fresh build, random round order) "
                     "before its stopping rule applies; r_q's interval is between blocks",
    "timing_max_blocks": "most blocks of the timing pass",
    "timing_tolerance": "the timing pass stops when every batch's 90% interval of log r_q "
                        "has at most this half-width",
    "tune_factor": "the lr grid is extended by this factor beyond its best edge",
    "tune_max_extensions": "rounds of lr-grid extension until the best lr is interior "
                           "(0: the grid as given)",
    "target": "validation score J* of the analysis, or 'auto' (start + --target_fraction of "
              "the way to what every reference seed reaches)",
    "target_fraction": "where the auto target sits between the start and what every reference "
                       "seed reaches (0..1; later: more evals before N*)",
    "n_unit": "what the analysis' sample count N counts: responses (retained responses; "
              "episodes for --env runs) or tokens (their tokens in the loss, response_tokens)",
    "design": "fixed (every config from every warm-start) or sequential (warm-starts in "
              "rounds; a config decided at a look gets no more runs, and the study ends when "
              "none is open)",
    "plan_first": "fixed design: after the first warm-start, plan from its reference runs and "
                  "timing pass, and run later warm-starts only at the batches the plan does not "
                  "rule out (plan_first.json)",
    "looks": "sequential: warm-starts done at each look (default: half, two thirds, all)",
    "spending": "sequential: error spending, obf (O'Brien-Fleming type) or pocock",
    "futility": "sequential: stop a config whose interval cannot reach this T/T0 (0.9: 10% "
                "faster); 0: never",
    "batch_schedule": "none, noise, steps or noise,steps: each algorithm also runs a scheduled "
                      "config per kind "
                      "(batch grows during the run, experiment/schedule.py) from its "
                      "reference P and G, beside the fixed batches (name tag _sched-<kind>); "
                      "noise grows up to --batch_cap (0: the largest grid batch)",
    "batch_ramp": "steps: RESPONSES:P,RESPONSES:P,... the scheduled config's prompts per step "
                  "from that many cumulative responses on",
    "compile_cache": "JAX persistent compilation cache",
    "executor": "local (one run after another in this process) or ray (one Ray task per run)",
    "ray_address": "Ray cluster to join (ray.init(address=...); empty: start a local one)",
    "ray_cpus_per_run": "CPUs each run's Ray task reserves"}
# Fields the study sets per run; every other TrainConfig field is a flag for the base config.
_PER_RUN = ("run_dir", "algo", "prompts_per_step", "group_size", "lr_rule", "seed", "target",
            "target_margin", "max_responses", "base_batch", "gen_batch_ratio",
            "updates_per_rollout", "batch_schedule", "batch_ramp")
# The study's base run: 1500 held-out prompts, scored exactly (the mean probability of a
# rewarded sample, rl/exact_eval.py: no sampling noise, about a tenth of the time of 16 samples
# per prompt; tasks without an exact-match reward fall back to 16 samples, within-prompt SE
# about 0.0022), 2 micro-batches of whole groups (the noise scale
# B_simple), and gradient clipping as a guard only, far above the measured norms (the lr rule
# must not be confounded by clipping).
STUDY_BASE = {"num_test_examples": 1500, "eval_prompts": 1500, "eval_samples": 16,
              "eval_mode": "exact",
              "micro_batches": 2, "max_grad_norm": 10.0, "base_lr": 2e-4}
flagdefs.define_from_dataclass(TrainConfig, skip=_PER_RUN, overrides=STUDY_BASE)
flags.DEFINE_enum("study", "default", sorted(STUDIES), "Study design; the flags below "
                  "override its fields.")
flagdefs.define_from_dataclass(SweepConfig, helps=SWEEP_HELP)
flags.DEFINE_bool("warmstart", True, "Start every run from the cached SFT warm-start.")
flags.DEFINE_float("warmstart_accuracy", SFTConfig.target_accuracy,
                   "Greedy held-out accuracy the warm-start stops at.")
flags.DEFINE_float("warmstart_tool_demos", 0.0, "Share of the SFT warm-start's examples written as a "
                   "calc-tool conversation (--env=jaxrl_scale.data.envs:calc; arithmetic and "
                   "arith_chain); 0: none.")
flags.DEFINE_integer("warmstart_seed", 0, "Seed of the SFT warm-start (its init and data "
                     "order): another value is an independent warm-start, e.g. for a second "
                     "replicate of a study with other --seeds.")
flags.DEFINE_bool("list_runs", False, "Print every run of the study as 'INDEX NAME' (the "
                  "lr-tuning runs first) and exit.")
flags.DEFINE_integer("run_index", None, "Run only this run of --list_runs and exit without "
                     "the analysis (a job array: --run_index=$SLURM_ARRAY_TASK_ID); study runs "
                     "need every lr-tuning run finished first.")
FLAGS = flags.FLAGS


def sweep_from_flags() -> SweepConfig:
    """The --study preset with every SweepConfig flag the user gave on top of it; one
    warm-start asked for (--warm_starts=1) times its batches in one pass of 4..8 blocks, as
    a study without warm-start blocks does, unless --timing_blocks was given."""
    sweep = study_config(FLAGS.study, **flagdefs.values_from_flags(SweepConfig,
                                                                   only_present=True))
    if sweep.warm_starts == 1 and not sweep.warm_start_checkpoints:
        sweep = one_pass(sweep)
    return sweep


def one_pass(sweep: SweepConfig) -> SweepConfig:
    """The study's timing as one pass after all runs (4..8 blocks) where the preset had a
    one-block pass per warm-start and no --timing_blocks / --timing_max_blocks was given."""
    if sweep.timing_blocks >= 2 or FLAGS["timing_blocks"].present:
        return sweep
    return dataclasses.replace(sweep, timing_blocks=4, timing_max_blocks=max(
        8, sweep.timing_max_blocks) if not FLAGS["timing_max_blocks"].present
        else sweep.timing_max_blocks)


def main(argv):
    del argv
    quiet_logging()
    with one_line_errors():    # every bad input, before the warm-start and the first run
        base = exact_eval_where_possible(flagdefs.build_from_flags(TrainConfig, skip=_PER_RUN),
                                         FLAGS["eval_mode"].present)
        sweep = one_warm_start_of_yours(sweep_from_flags(), base)
        sfts = []
        if FLAGS.warmstart_seed < 0:
            raise ConfigError("warmstart_seed", f"must be >= 0, got {FLAGS.warmstart_seed}",
                              "e.g. --warmstart_seed=1")
        check_warm_start_flags(sweep, base)
        if FLAGS.warmstart and not (base.init_checkpoint or base.hf_checkpoint
                                    or sweep.warm_start_checkpoints):
            sfts = [sft_config_for(base, FLAGS.warmstart_accuracy, FLAGS.warmstart_seed + w,
                                   FLAGS.warmstart_tool_demos)
                    for w in range(sweep.warm_starts)]
            for s in sfts[:1]:       # one warm-start stands for all: they differ in seed only
                check_warm_start(s)
        final = sweep, base
        if len(sfts) > 1:        # their paths are known before they train
            final = dataclasses.replace(sweep, warm_start_checkpoints=tuple(
                sft_path(c) for c in sfts)), base
        elif sfts:
            final = sweep, base.replace(init_checkpoint=sft_path(sfts[0]))
        validate_sweep(sweep, base, final[1], resume_sweep=final[0])
        if not FLAGS.list_runs:   # tokenizer, data and prompts: before the warm-start trains
            load_inputs(base, sync_name="check_inputs")
        if FLAGS.run_index is not None:
            check_run_index(*final, FLAGS.run_index)
        if not FLAGS.list_runs:   # writable before the warm-start and the first run
            prepare_run_dir(sweep.sweep_dir, "sweep_dir")
            set_error_dir(sweep.sweep_dir)
    if FLAGS.list_runs:
        for i, (name, _) in enumerate(all_runs(*final)):
            print(i, name)
        return 0
    def warm_start(w: int) -> None:
        path, info = sft_warmstart(sfts[w])      # cached: a trained one returns at once
        which = f" {w + 1}/{len(sfts)}" if len(sfts) > 1 else ""
        print(f"warm-start{which}: {path} (greedy held-out accuracy {info['accuracy']:.3f})")

    # A sequential study trains the warm-starts of its first look and of the lr tuning now,
    # the others before their block: one it ends without is never trained.
    seq = sequential_plan(final[0])
    first = len(sfts) if seq is None or len(sfts) < 2 else max(
        [seq.looks[0]] + [s % len(sfts) + 1 for s in final[0].tune_seeds])
    for w in range(first):
        warm_start(w)
    sweep, base = final
    if FLAGS.run_index is not None:
        res = run_one(sweep, base, FLAGS.run_index)
        if res["error"]:
            print(f"run {res['run']} failed: {res['error']}", file=sys.stderr)
            return EXIT_RUNS_FAILED
        print(f"run {FLAGS.run_index} ({res['run']}): "
              f"{'already finished' if res['skipped'] else 'finished'}; once every index has "
              f"run: jaxrl-analyze --sweep_dir={sweep.sweep_dir} --target={sweep.target}"
              f"{'' if sweep.n_unit == 'responses' else f' --n_unit={sweep.n_unit}'}")
        return 0
    summary = run_sweep(sweep, base, before_block=warm_start if len(sfts) > 1 else None)
    if "analysis_error" in summary:
        print(f"analysis failed: {summary['analysis_error']}\nThe runs are in {sweep.sweep_dir}; "
              "rerun experiments/analyze.py once the problem is fixed.", file=sys.stderr)
    else:
        print_summary(summary)
    return exit_status(summary)


def one_warm_start_of_yours(sweep: SweepConfig, base: TrainConfig) -> SweepConfig:
    """Runs that start from one checkpoint of yours (--init_checkpoint, --hf_checkpoint) or
    from scratch (--nowarmstart), with the study's warm-starts not asked for by flag: one
    block of the same number of runs per config (6 x 2 seeds becomes 1 x 12, unless --seeds
    was given), said on stdout; its verdicts then hold for that warm-start alone."""
    mine = base.init_checkpoint or base.hf_checkpoint or not FLAGS.warmstart
    if not mine or sweep.warm_starts == 1 or FLAGS["warm_starts"].present \
            or sweep.warm_start_checkpoints:
        return sweep
    seeds = sweep.seeds if FLAGS["seeds"].present else tuple(
        range(len(sweep.seeds) * sweep.warm_starts))
    print(f"one warm-start (yours): {len(seeds)} seeds per config, not {sweep.warm_starts} "
          f"warm-starts x {len(sweep.seeds)}; the verdicts hold for that warm-start alone "
          "(--warm_start_checkpoints=A,B,... for blocks)")
    return one_pass(dataclasses.replace(sweep, warm_starts=1, seeds=seeds))


def check_warm_start_flags(sweep, base) -> None:
    """ConfigError for warm-start settings that contradict each other or name a missing
    checkpoint, before anything trains."""
    if sweep.warm_start_checkpoints and (base.init_checkpoint or base.hf_checkpoint):
        raise ConfigError("warm_start_checkpoints", "is given with --init_checkpoint or "
                          "--hf_checkpoint: the runs would start from two places",
                          "give the warm-starts in --warm_start_checkpoints alone")
    missing = [p for p in sweep.warm_start_checkpoints if not os.path.exists(p)]
    if missing:
        raise ConfigError("warm_start_checkpoints", f"{missing[0]!r} does not exist",
                          "name orbax params directories, e.g. SFT warm-starts")
    if sweep.warm_starts > 1 and not sweep.warm_start_checkpoints and (
            base.init_checkpoint or base.hf_checkpoint or not FLAGS.warmstart):
        raise ConfigError("warm_starts", f"={sweep.warm_starts} trains that many SFT "
                          "warm-starts of the built-in policy, but the runs start from a "
                          "checkpoint of yours (or --nowarmstart)",
                          "name your warm-starts in --warm_start_checkpoints=A,B,..., or "
                          "drop --warm_starts (one warm-start)")


def exit_status(summary: dict) -> int:
    """experiment.sweep.exit_status, its line (if any) on stderr."""
    code, line = sweep_exit_status(summary)
    if line:
        print(line, file=sys.stderr)
    return code


def run():
    """Console-script entry point."""
    run_main(main, __name__, defer_sigint=True)


if __name__ == "__main__":
    run()
