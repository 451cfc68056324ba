"""Supervised warm-start of the character-level RL policy (cached by config).

    jaxrl-sft --task=arithmetic --target_accuracy=0.3      # = python experiments/sft_warmstart.py
"""


from jaxrl_scale.cli import flagdefs, one_line_errors, quiet_logging, run_main
from jaxrl_scale.experiment.sft import SFTConfig, sft_warmstart, validate_sft

flagdefs.define_from_dataclass(SFTConfig)


def main(argv):
    del argv
    quiet_logging()
    with one_line_errors():
        cfg = flagdefs.build_from_flags(SFTConfig)
        validate_sft(cfg)    # before any data, model or compile (and before the cache)
    with one_line_errors():    # what only the data shows (a prompt over --max_prompt_len),
        path, info = sft_warmstart(cfg)    # found before the model is built
    print(f"warm-start checkpoint: {path}")
    how = " (episodes with the calculator)" if cfg.tool_demos else ""   # sft.episode_accuracy
    print(f"held-out greedy accuracy{how} {info['accuracy']:.3f} after {info['steps']} steps "
          f"({info['seconds']:.0f} s, model preset {cfg.model!r})")


def run():
    """Console-script entry point."""
    run_main(main, __name__, defer_sigint=True)


if __name__ == "__main__":
    run()
