"""One GRPO or PPO run with every TrainConfig field as a flag; resumes from --run_dir.

    python experiments/train.py --run_dir=runs/grpo --algo=grpo --prompts_per_step=32 \
        --group_size=8 --lr_rule=sqrt --max_steps=200
    python experiments/train.py --run_dir=runs/ppo --algo=ppo --group_size=1 --prompts_per_step=256

With the built-in character model and no --init_checkpoint, --warmstart (default on) first
trains or reuses the cached SFT warm-start (jaxrl-sft) on the same task.

Multi-process (one process per host, one global mesh; jaxrl_scale/distributed.py): start the
same command on every host with --coordinator_address=HOST0:PORT --num_processes=N
--process_id=I (or --distributed_auto where jax.distributed finds them itself: TPU pods,
SLURM, Open MPI), a --run_dir and --data_dir on a filesystem they share.
"""
import contextlib

from absl import flags

from jaxrl_scale.cli import (define_distributed_flags, flagdefs, init_distributed,
                             one_line_errors, quiet_logging, run_main, set_error_dir)
from jaxrl_scale.distributed import is_primary
from jaxrl_scale.experiment.config import TrainConfig, check_resume, validate_for_devices
from jaxrl_scale.experiment.sft import (SFTConfig, check_warm_start, sft_config_for, sft_path,
                                        sft_warmstart)
from jaxrl_scale.experiment.inputs import load_inputs
from jaxrl_scale.experiment.rundir import claim_run_dir, is_finished
from jaxrl_scale.experiment.train import run_training

flagdefs.define_from_dataclass(TrainConfig)
define_distributed_flags()
flags.DEFINE_bool("warmstart", True, "Start from the cached SFT warm-start (built-in model).")
flags.DEFINE_float("warmstart_accuracy", SFTConfig.target_accuracy,
                   "Held-out greedy accuracy the warm-start stops at.")
flags.DEFINE_float("warmstart_tool_demos", 0.0, "Share of the SFT warm-start's examples written as a "
                   "calc-tool conversation (--env=jaxrl_scale.data.envs:calc; arithmetic and "
                   "arith_chain); 0: none.")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    with contextlib.ExitStack() as held:
        return _main(held)


def _main(held: contextlib.ExitStack):
    quiet_logging()
    with one_line_errors():    # every bad input, before any data, model or compile
        cfg = flagdefs.build_from_flags(TrainConfig)
        init_distributed()     # joins the other processes; before anything touches a device
        validate_for_devices(cfg)
        sft = None
        if FLAGS.warmstart and not (cfg.init_checkpoint or cfg.hf_checkpoint):
            sft = sft_config_for(cfg, FLAGS.warmstart_accuracy,
                                 tool_demos=FLAGS.warmstart_tool_demos)
            check_warm_start(sft)
        check_resume(cfg.replace(init_checkpoint=sft_path(sft)) if sft else cfg)
        if not is_finished(cfg.run_dir):   # a finished run is only reported (may be read-only)
            # writable and ours until the command ends: before the warm-start and compile
            held.enter_context(claim_run_dir(cfg))
            set_error_dir(cfg.run_dir)
            if sft is not None:
                # what only the tokenizer and the data show (a prompt longer than
                # --max_prompt_len): before the warm-start trains (run_training checks again)
                load_inputs(cfg, sync_name="check_inputs")
    if sft is not None:
        path, info = sft_warmstart(sft, progress=is_primary())
        print(f"warm-start: {path} (greedy held-out accuracy {info['accuracy']:.3f})")
        cfg = cfg.replace(init_checkpoint=path)
    with one_line_errors():    # inputs only the data can check (e.g. a too-long prompt)
        out = run_training(cfg)
    if is_primary():
        print(f"run {cfg.run_dir}: step {out['step']}, {out['responses']} responses, "
              f"{out['time_s']:.0f} s, finished={out['finished']}")


def run():
    """Console-script entry point."""
    run_main(main, __name__, defer_sigint=True)


if __name__ == "__main__":
    run()
