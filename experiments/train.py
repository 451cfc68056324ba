"""One GRPO or PPO run with every TrainConfig field as a flag; resumes from --run_dir.

    python experiments/train.py --run_dir=runs/grpo --algo=grpo --prompts_per_step=32 \
        --group_size=8 --lr_rule=sqrt --max_steps=200
    python experiments/train.py --run_dir=runs/ppo --algo=ppo --group_size=1 --prompts_per_step=256

With the built-in character model and no --init_checkpoint, --warmstart (default on) first
trains or reuses the cached SFT warm-start (experiments/sft_warmstart.py) on the same task.
"""
from absl import app, flags, logging

import flagdefs
from jaxrl_scale.experiment.config import TrainConfig, validate
from jaxrl_scale.experiment.sft import SFTConfig, sft_config_for, sft_warmstart
from jaxrl_scale.experiment.train import run_training

flagdefs.define_from_dataclass(TrainConfig)
flags.DEFINE_bool("warmstart", True, "Start from the cached SFT warm-start (built-in model).")
flags.DEFINE_float("warmstart_accuracy", SFTConfig.target_accuracy,
                   "Held-out greedy accuracy the warm-start stops at.")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)   # orbax logs every checkpoint at INFO
    try:
        cfg = flagdefs.build_from_flags(TrainConfig)
        validate(cfg)                        # the cheap checks, before any data or model
    except ValueError as e:                  # a bad flag value: one line, not a traceback
        raise SystemExit(f"error: {e}") from None
    if FLAGS.warmstart and not (cfg.init_checkpoint or cfg.hf_checkpoint):
        path, info = sft_warmstart(sft_config_for(cfg, FLAGS.warmstart_accuracy))
        print(f"warm-start: {path} (greedy held-out accuracy {info['accuracy']:.3f})")
        cfg = cfg.replace(init_checkpoint=path)
    out = run_training(cfg)
    print(f"run {cfg.run_dir}: step {out['step']}, {out['responses']} responses, "
          f"{out['time_s']:.0f} s, finished={out['finished']}")


if __name__ == "__main__":
    app.run(main)
