"""A run's checkpoint as a model other tools load: HF safetensors (transformers), a PEFT
adapter (peft, LoRA runs) or a LoRA run's merged weights, plus the tokenizer files of the model
it started from.

`plan_export` does every check that reads no tensor data (the run's config.json, the
checkpoint steps on disk, the output path, the format against the run, the base model's
files) and raises a ConfigError naming the flag and the fix; `export` then reads the chosen
step and writes. Reading is read-only: the checkpoint directory is listed, never opened with
orbax's manager (which would tidy it), so a training may go on writing beside the export.

What a checkpoint holds (experiment/train.py): the train state(s) of the policy (PPO: actor
first), of which the export restores only the policy's params. A LoRA run's params are its
adapters; the base is rebuilt from the run's config, as a resume does: --hf_checkpoint,
--init_checkpoint, or the --model preset at --seed.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import warnings
from typing import Any

from jaxrl_scale.experiment.errors import ConfigError

FORMATS = ("hf", "peft", "merged")
EXPORT_FILE = "jaxrl_export.json"   # in the output: which run, step and format it came from
# What makes a directory loadable by transformers' AutoTokenizer (and generate's defaults).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
                   "chat_template.jinja", "chat_template.json", "generation_config.json")
# config.json entries of the base HF model carried into an exported one (generation needs them).
TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")

_err = ConfigError


@dataclasses.dataclass(frozen=True)
class ExportPlan:
    """What `export` writes, all checked: the run's config, the step, the format, the output
    directory and the run's model config (no tensor read yet)."""

    run_dir: str
    step: int
    steps: tuple[int, ...]
    fmt: str
    out: str
    cfg: Any          # experiment.config.TrainConfig
    model_cfg: Any    # models.config.ModelConfig


def checkpoint_steps(run_dir: str) -> list[int]:
    """The finished checkpoint steps of a run directory, from the listing alone (a save under
    way is a `<step>.orbax-checkpoint-tmp` directory, not a step)."""
    root = os.path.join(run_dir, "checkpoints")
    if not os.path.isdir(root):
        return []
    return sorted(int(n) for n in os.listdir(root)
                  if n.isdigit() and os.path.isdir(os.path.join(root, n)))


def _read_config(run_dir: str):
    from jaxrl_scale.experiment.config import TrainConfig
    from jaxrl_scale.models.hf_config import read_json_object
    path = os.path.join(run_dir, "config.json")
    if not os.path.isdir(run_dir):
        raise _err("run_dir", f"{run_dir!r} is not a directory", "pass the --run_dir of a "
                   "jaxrl-train run (the directory holding config.json and checkpoints/)")
    if not os.path.isfile(path):
        raise _err("run_dir", f"no config.json in {run_dir!r} (not a run directory, or a run "
                   "that has not started)", "pass the --run_dir of a jaxrl-train run")
    try:
        return TrainConfig.from_json(read_json_object(path))
    except (ValueError, TypeError) as e:   # HFCheckpointError / ConfigError are ValueErrors
        why = " ".join(str(e).split()).rstrip(".")
        raise _err("run_dir", f"{path} does not describe a run ({why})",
                   "restore the run's config.json (it is written when the run starts)") \
            from None


def _model_config(cfg):
    """The run's ModelConfig, as the training built it (experiment/inputs.py)."""
    from jaxrl_scale.models import get_config
    from jaxrl_scale.models.config import PRESETS
    if cfg.hf_checkpoint:
        from jaxrl_scale.experiment.checks import hf_model_config
        try:
            model_cfg = hf_model_config(cfg.hf_checkpoint)
        except ConfigError as e:
            raise _err("run_dir", f"the run's base model (--hf_checkpoint={cfg.hf_checkpoint}) "
                       f"cannot be read: {e.problem}", "run jaxrl-export where the training "
                       "ran (a relative path is resolved from the current directory), or put "
                       "that checkpoint back") from None
    elif cfg.model in PRESETS:
        model_cfg = get_config(cfg.model)
    else:
        raise _err("run_dir", f"the run's --model={cfg.model!r} is not a preset of this version",
                   "export with the jaxrl_scale version that trained the run")
    return model_cfg.replace(moe_dispatch=cfg.moe_dispatch) if model_cfg.is_moe else model_cfg


def _check_out(out: str, run_dir: str) -> str:
    if not out:
        raise _err("out", "no output directory given", "pass --out=DIR, the directory to write "
                   "the model to (made if missing)")
    path = os.path.abspath(os.path.expanduser(out))
    if os.path.exists(path) and not os.path.isdir(path):
        raise _err("out", f"{out!r} is an existing file", "pass a directory path (a new one, "
                   "or an export to overwrite)")
    if os.path.realpath(path) == os.path.realpath(run_dir):
        raise _err("out", f"{out!r} is the run directory (its config.json would be "
                   "overwritten)", f"pass another directory, e.g. --out={out.rstrip('/')}/export")
    parent = path
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise _err("out", f"{parent!r}, a parent of {out!r}, is a file", "pass a directory path "
                   "whose parents are directories")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise _err("out", f"cannot write under {parent!r}", "pass a directory you can write to")
    return path


def plan_export(run_dir: str, step: int | None, fmt: str, out: str) -> ExportPlan:
    """Every check of an export that reads no tensor data; a ConfigError naming the flag
    (format, run_dir, step, out) and the fix for the first problem."""
    if fmt not in FORMATS:
        raise _err("format", f"{fmt!r} is unknown", f"use one of {', '.join(FORMATS)} (hf: the "
                   "policy as HF safetensors; peft: a LoRA run's adapter; merged: a LoRA run's "
                   "adapters folded into the base)")
    if not run_dir:
        raise _err("run_dir", "no run directory given", "pass the --run_dir of a jaxrl-train "
                   "run")
    run_dir = os.path.abspath(os.path.expanduser(run_dir))
    cfg = _read_config(run_dir)
    out_path = _check_out(out, run_dir)
    steps = checkpoint_steps(run_dir)
    if not steps:
        raise _err("run_dir", f"no checkpoint in {os.path.join(run_dir, 'checkpoints')} (a run "
                   "saves one every --checkpoint_every steps and at its end)", "train it "
                   "further (rerun its jaxrl-train command), or pass a run that saved one")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise _err("step", f"no checkpoint at step {step} in {run_dir}; it has steps "
                   f"{', '.join(map(str, steps))}", f"pass one of those, or leave --step out "
                   f"for the latest ({steps[-1]})")
    if fmt in ("peft", "merged") and not cfg.lora_rank:
        raise _err("format", f"--format={fmt} needs a LoRA run, and {run_dir} trained the "
                   "whole model (lora_rank=0)", "use --format=hf")
    model_cfg = _model_config(cfg)
    if fmt == "peft" and model_cfg.arch not in ("qwen2", "qwen3", "llama"):
        raise _err("format", f"PEFT's module names are known for qwen2 / qwen3 / llama, and the "
                   f"run's model is arch={model_cfg.arch!r}", "use --format=merged")
    if fmt != "peft":
        from jaxrl_scale.models.hf_config import config_to_hf
        try:
            config_to_hf(model_cfg)
        except ValueError as e:
            why = str(e).rstrip(".")
            raise _err("format", f"the run's model has no HF equivalent ({why})",
                       "keep using the run's own checkpoint (jaxrl_scale --init_checkpoint)") \
                from None
    if cfg.lora_rank and cfg.init_checkpoint and not os.path.exists(
            os.path.expanduser(cfg.init_checkpoint)):
        raise _err("run_dir", f"the run's base model (--init_checkpoint={cfg.init_checkpoint}) "
                   "is gone", "run jaxrl-export where the training ran, or put it back")
    return ExportPlan(run_dir, step, tuple(steps), fmt, out_path, cfg, model_cfg)


# ----------------------------------------------------------------------------- reading


def restore_params(plan: ExportPlan):
    """The policy's params at plan.step as host numpy arrays (a LoRA run: its adapters),
    after checking the step's files against the digests written when it was saved."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    from jaxrl_scale.checkpoint import UNSEALED, CorruptCheckpointError, check_sealed
    step_dir = os.path.join(plan.run_dir, "checkpoints", str(plan.step))
    problem = check_sealed(step_dir)
    others = [s for s in plan.steps if s != plan.step]
    if problem == UNSEALED:
        warnings.warn(f"checkpoint step {plan.step} has no digest file; exported unverified",
                      RuntimeWarning, stacklevel=2)
    elif problem:
        raise CorruptCheckpointError(
            f"{problem}. Fix: export another step" + (
                f" (--step={others[-1]}; the run has {', '.join(map(str, others))})"
                if others else "; the run has no other") + ".")
    state_dir = os.path.join(step_dir, "state")
    ckptr = ocp.PyTreeCheckpointer()
    with _quiet_item_metadata():
        tree = ckptr.metadata(state_dir).item_metadata.tree
        want = [{"params": tree[0]["params"]}]   # the policy's (PPO: the actor's) params alone
        restore_args = jax.tree.map(lambda m: ocp.RestoreArgs(restore_type=np.ndarray), want)
        out = ckptr.restore(state_dir, args=ocp.args.PyTreeRestore(
            item=want, restore_args=restore_args, partial_restore=True))
    return out[0]["params"]


@contextlib.contextmanager
def _quiet_item_metadata():
    """Orbax warns that an item directory has no _CHECKPOINT_METADATA when it is read without
    its manager: the manager keeps that file one level up (the step), so the warning says
    nothing about the checkpoint; other warnings pass."""
    def keep(record: logging.LogRecord) -> bool:
        return "Metadata file does not exist" not in record.getMessage()
    log = logging.getLogger("absl")
    log.addFilter(keep)
    try:
        yield
    finally:
        log.removeFilter(keep)


def base_params(plan: ExportPlan):
    """A LoRA run's frozen base, rebuilt as the training builds it
    (experiment/states.start_params, and init_params(model, seed) when neither checkpoint is
    given)."""
    import jax

    from jaxrl_scale.checkpoint import load_pytree
    from jaxrl_scale.models import init_params, load_hf
    cfg = plan.cfg
    if cfg.init_checkpoint:
        like = jax.eval_shape(lambda: init_params(plan.model_cfg, 0))
        dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        like = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=dev), like)
        return load_pytree(os.path.expanduser(cfg.init_checkpoint), like)[0]
    if cfg.hf_checkpoint:
        return load_hf(os.path.expanduser(cfg.hf_checkpoint))[1]
    return jax.jit(lambda: init_params(plan.model_cfg, cfg.seed))()


# ----------------------------------------------------------------------------- writing


def _tokenizer_sources(cfg) -> list[str]:
    """Where the run's tokenizer files are: --tokenizer (a directory or its tokenizer.json),
    then the --hf_checkpoint directory."""
    out = []
    if cfg.tokenizer != "char":
        out.append(os.path.expanduser(cfg.tokenizer))
    if cfg.hf_checkpoint:
        out.append(os.path.expanduser(cfg.hf_checkpoint))
    return out


def copy_tokenizer(cfg, out: str) -> list[str]:
    """Copy the run's tokenizer files into `out` (the first source that has a file wins);
    returns the names copied (none for the built-in character tokenizer)."""
    copied = []
    for src in _tokenizer_sources(cfg):
        if os.path.isfile(src):   # --tokenizer=path/to/tokenizer.json
            names = {"tokenizer.json": src}
        else:
            names = {n: os.path.join(src, n) for n in TOKENIZER_FILES}
        for name, path in names.items():
            if name not in copied and os.path.isfile(path):
                shutil.copyfile(path, os.path.join(out, name))
                copied.append(name)
    return copied


def _token_ids(cfg) -> dict:
    if not cfg.hf_checkpoint:
        return {}
    from jaxrl_scale.models.hf_config import read_json_object
    base = read_json_object(os.path.join(os.path.expanduser(cfg.hf_checkpoint), "config.json"))
    return {k: base[k] for k in TOKEN_ID_KEYS if base.get(k) is not None}


def export(plan: ExportPlan) -> dict[str, Any]:
    """Write plan.out: the step's model in plan.fmt, the tokenizer files, and EXPORT_FILE.
    Returns what was written (format, step, files, tokenizer files copied)."""
    from jaxrl_scale.models import lora, save_hf
    from jaxrl_scale.numbers import write_json
    cfg, model_cfg = plan.cfg, plan.model_cfg
    params = restore_params(plan)
    os.makedirs(plan.out, exist_ok=True)
    extra = _token_ids(cfg)
    base_name = os.path.abspath(os.path.expanduser(cfg.hf_checkpoint)) if cfg.hf_checkpoint \
        else ""
    if cfg.lora_rank:
        lcfg = lora.LoraConfig(cfg.lora_rank, cfg.lora_alpha, tuple(cfg.lora_targets))
        if plan.fmt == "peft":
            lora.save_peft(plan.out, model_cfg, lcfg, params, base_model_name_or_path=base_name)
        else:
            lora.save_merged_hf(plan.out, model_cfg, base_params(plan), params, lcfg,
                                extra_config=extra)
    else:
        save_hf(plan.out, model_cfg, params, extra_config=extra)
    tokenizer = copy_tokenizer(cfg, plan.out)
    info = {"run_dir": plan.run_dir, "step": plan.step, "format": plan.fmt,
            "lora": bool(cfg.lora_rank), "base_model": base_name or cfg.init_checkpoint or
            f"preset {cfg.model} at seed {cfg.seed}", "tokenizer_files": tokenizer}
    write_json(os.path.join(plan.out, EXPORT_FILE), info, indent=2)
    return {**info, "out": plan.out, "files": sorted(os.listdir(plan.out))}


__all__ = ["FORMATS", "EXPORT_FILE", "TOKENIZER_FILES", "ExportPlan", "checkpoint_steps",
           "plan_export", "restore_params", "base_params", "copy_tokenizer", "export"]
