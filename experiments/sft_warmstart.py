"""Supervised warm-start of the character-level RL policy (cached by config).

    python experiments/sft_warmstart.py --task=arithmetic --target_accuracy=0.3
"""
from absl import app

import flagdefs
from jaxrl_scale.experiment.sft import SFTConfig, sft_warmstart

flagdefs.define_from_dataclass(SFTConfig)


def main(argv):
    del argv
    cfg = flagdefs.build_from_flags(SFTConfig)
    path, info = sft_warmstart(cfg)
    print(f"warm-start checkpoint: {path}")
    print(f"held-out greedy accuracy {info['accuracy']:.3f} after {info['steps']} steps "
          f"({info['seconds']:.0f} s, model preset {cfg.model!r})")


if __name__ == "__main__":
    app.run(main)
