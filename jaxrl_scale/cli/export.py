"""A run's checkpoint as a model that transformers or peft loads (experiment/export.py).

    jaxrl-export --run_dir=runs/grpo --format=hf --out=exports/grpo
    jaxrl-export --run_dir=runs/lora --step=40 --format=peft --out=exports/lora_adapter
    jaxrl-export --run_dir=runs/lora --format=merged --out=exports/lora_merged

--format=hf: the policy's weights as HF safetensors + config.json (a LoRA run's with its
adapters merged in); peft: a LoRA run's adapter (adapter_config.json + adapter_model.safetensors)
for peft.PeftModel.from_pretrained on its base model; merged: a LoRA run's base with the
adapters folded into its weights. --step defaults to the latest checkpoint. The tokenizer
files of the run's --tokenizer / --hf_checkpoint directory are copied beside the weights.

Every check (the run directory, the step, the output path, the format against the run) comes
before any tensor is read: a bad input is one line on stderr and exit status 2. The export
runs on the CPU (it only moves and adds arrays), so it never contends with a training for
the accelerator; set JAX_PLATFORMS to override.
"""
import os

from absl import flags

from jaxrl_scale.cli import one_line_errors, quiet_logging, run_main

flags.DEFINE_string("run_dir", "", "The run directory (config.json and checkpoints/).")
flags.DEFINE_integer("step", None, "The checkpoint step to export (default: the latest).")
flags.DEFINE_string("format", "hf", "hf (HF safetensors), peft (a LoRA run's adapter) or "
                    "merged (a LoRA run's adapters folded into its base).")
flags.DEFINE_string("out", "", "The directory to write (made if missing; files of the same "
                    "names are replaced).")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    quiet_logging()
    from jaxrl_scale.experiment.export import export, plan_export
    with one_line_errors():
        plan = plan_export(FLAGS.run_dir, FLAGS.step, FLAGS.format, FLAGS.out)
    if not os.environ.get("JAX_PLATFORMS"):
        import jax
        jax.config.update("jax_platforms", "cpu")
    info = export(plan)
    weights = [f for f in info["files"] if f.endswith((".safetensors", ".json"))
               and f not in info["tokenizer_files"]]
    print(f"exported step {info['step']} of {plan.run_dir} as {plan.fmt} to {plan.out}: "
          f"{', '.join(weights)}")
    if info["tokenizer_files"]:
        print(f"tokenizer: {', '.join(info['tokenizer_files'])}")
    else:
        print(f"tokenizer: none copied (the run's --tokenizer={plan.cfg.tokenizer} has no "
              "files for transformers; jaxrl_scale.models.load_tokenizer reads it)")
    if plan.fmt == "peft":
        base = plan.cfg.hf_checkpoint or None
        print(f"load: peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("
              f"{base!r}), {plan.out!r})" if base else
              f"note: the base is {info['base_model']}, not an HF directory; "
              f"--format=merged writes a model transformers loads alone")
    else:
        print(f"load: transformers.AutoModelForCausalLM.from_pretrained({plan.out!r})")


def run():
    """Console-script entry point."""
    run_main(main, __name__)


if __name__ == "__main__":
    run()
