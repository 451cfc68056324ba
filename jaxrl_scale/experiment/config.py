"""Run configuration for GRPO/PPO training, validated before any compilation."""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

ALGOS = ("grpo", "ppo")
# The built-in CPU task: 2-digit addition and subtraction (answers of 1-3 characters).
DEFAULT_TASK_KWARGS = {"digits": 2, "ops": "+-"}
LR_RULES = ("fixed", "linear", "sqrt", "malladi")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Every knob of one training run. Scripts map absl flags 1:1 onto these fields."""

    run_dir: str = "runs/default"
    algo: str = "grpo"
    # --- task / data
    task: str = "arithmetic"
    data_dir: str = "~/.cache/jaxrl_scale/data"
    task_kwargs: dict = dataclasses.field(default_factory=lambda: dict(DEFAULT_TASK_KWARGS))
    num_train_examples: int = 8000     # 0: the builder's default
    num_test_examples: int = 500
    max_prompt_len: int = 0            # 0: longest prompt in the data
    # --- model
    model: str = "rl_cpu"              # preset name, used when no checkpoint is given
    hf_checkpoint: str = ""            # HF directory (config.json + safetensors)
    init_checkpoint: str = ""          # orbax params (e.g. the SFT warm-start)
    tokenizer: str = "char"            # "char" or a directory with tokenizer.json
    # --- batch (counted in retained responses per update: B_train = P * G)
    prompts_per_step: int = 32         # P
    group_size: int = 8                # G (PPO: 1)
    # --- optimiser (lr follows the batch rule relative to base_batch)
    base_lr: float = 2e-4
    base_batch: int = 256
    lr_rule: str = "sqrt"
    critic_base_lr: float = 5e-4
    warmup_steps: int = 0
    max_grad_norm: float = 1.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    # --- loss
    advantage: str = "grpo"            # grpo | drgrpo | rloo
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float = 0.0             # 0 disables; else > 1 (e.g. 3)
    kl_coef: float = 0.0
    kl_kind: str = "k3"
    entropy_coef: float = 0.0
    agg: str = "token-mean"
    filter_zero_variance: bool = False
    gamma: float = 1.0
    lam: float = 0.95
    vf_clip: float = 0.2
    # --- sampling
    max_new_tokens: int = 6
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    # --- schedule
    micro_batches: int = 1
    max_steps: int = 100
    max_responses: int = 0             # response budget (0: none)
    target: float = 0.0                # stop once eval score >= target ... (0: no target stop)
    target_margin: float = 0.0         # ... and responses >= N* * (1 + margin)
    seed: int = 0
    # --- eval / checkpoints
    eval_every: int = 5
    eval_prompts: int = 128
    eval_samples: int = 4
    # Rows per generate call. Eval batches (prompts x samples) are split into chunks of this
    # size: one call over all rows pads to the next power of two and is slower per row on CPU.
    generate_chunk: int = 4096
    checkpoint_every: int = 10
    # --- mesh ('data', 'fsdp', 'tensor'); -1 absorbs the remaining devices
    mesh_data: int = -1
    mesh_fsdp: int = 1
    mesh_tensor: int = 1

    @property
    def batch_train(self) -> int:
        return self.prompts_per_step * self.group_size

    def replace(self, **kw) -> "TrainConfig":
        return dataclasses.replace(self, **kw)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["batch_train"] = self.batch_train
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def _err(field: str, problem: str, fix: str) -> ValueError:
    return ValueError(f"TrainConfig.{field}: {problem}. Fix: {fix}.")


def validate(cfg: TrainConfig, *, data_parallel: int | None = None,
             model_max_seq_len: int | None = None) -> None:
    """Raise a ValueError naming the field and the fix; cheap, runs before any compilation."""
    if cfg.algo not in ALGOS:
        raise _err("algo", f"{cfg.algo!r} is unknown", f"use one of {ALGOS}")
    if cfg.algo == "grpo" and cfg.group_size < 2:
        raise _err("group_size", f"GRPO needs >= 2 responses per prompt, got {cfg.group_size}",
                   "set --group_size >= 2, or use --algo=ppo (which uses G = 1)")
    if cfg.algo == "ppo" and cfg.group_size != 1:
        raise _err("group_size", f"PPO samples one response per prompt, got {cfg.group_size}",
                   "set --group_size=1 with --algo=ppo")
    if cfg.prompts_per_step < 1:
        raise _err("prompts_per_step", f"must be >= 1, got {cfg.prompts_per_step}",
                   "set --prompts_per_step to a positive integer")
    for name in ("base_lr", "critic_base_lr"):
        if not getattr(cfg, name) > 0:
            raise _err(name, f"learning rate must be positive, got {getattr(cfg, name)}",
                       f"set --{name} > 0")
    if cfg.base_batch < 1:
        raise _err("base_batch", f"must be >= 1, got {cfg.base_batch}", "set --base_batch")
    if cfg.lr_rule not in LR_RULES:
        raise _err("lr_rule", f"{cfg.lr_rule!r} is unknown", f"use one of {LR_RULES}")
    if cfg.eval_every < 1:
        raise _err("eval_every", f"eval interval must be >= 1 step, got {cfg.eval_every}",
                   "set --eval_every to a positive number of steps")
    if cfg.checkpoint_every < 1:
        raise _err("checkpoint_every", f"must be >= 1, got {cfg.checkpoint_every}",
                   "set --checkpoint_every to a positive number of steps")
    if cfg.micro_batches < 1 or cfg.prompts_per_step % cfg.micro_batches:
        raise _err("micro_batches", f"{cfg.micro_batches} does not divide the "
                   f"{cfg.prompts_per_step} prompt groups (micro-batches hold whole groups)",
                   "choose a divisor of prompts_per_step")
    if cfg.max_new_tokens < 1:
        raise _err("max_new_tokens", f"must be >= 1, got {cfg.max_new_tokens}", "raise it")
    if cfg.dual_clip and cfg.dual_clip <= 1:
        raise _err("dual_clip", f"must be > 1 (or 0 to disable), got {cfg.dual_clip}",
                   "use e.g. --dual_clip=3")
    if cfg.generate_chunk < 1:
        raise _err("generate_chunk", f"must be >= 1, got {cfg.generate_chunk}",
                   "use e.g. --generate_chunk=4096")
    if cfg.eval_samples < 1 or cfg.eval_prompts < 1:
        raise _err("eval_samples", "eval needs >= 1 prompt and >= 1 sample per prompt",
                   "set --eval_prompts and --eval_samples >= 1")
    if data_parallel is not None:
        micro = cfg.batch_train // cfg.micro_batches
        if micro % data_parallel:
            raise _err("prompts_per_step", f"the micro-batch of {micro} responses "
                       f"(P*G = {cfg.batch_train} / micro_batches = {cfg.micro_batches}) does not "
                       f"divide over the {data_parallel} data-parallel devices",
                       "make P*G/micro_batches a multiple of mesh_data*mesh_fsdp")
    if model_max_seq_len is not None and cfg.max_prompt_len + cfg.max_new_tokens > \
            model_max_seq_len:
        raise _err("max_prompt_len", f"max_prompt_len {cfg.max_prompt_len} + max_new_tokens "
                   f"{cfg.max_new_tokens} exceeds the model context {model_max_seq_len}",
                   "shorten prompts/responses or use a model with a longer context")
    if cfg.task == "math_jsonl":
        manual = cfg.task_kwargs.get("manual_dir", "")
        if not manual or not os.path.isdir(os.path.expanduser(manual)):
            raise _err("task_kwargs['manual_dir']", f"dataset directory {manual!r} not found",
                       "pass --manual_dir=DIR holding the GSM8K/MATH JSONL files")
    if cfg.hf_checkpoint and not os.path.isdir(os.path.expanduser(cfg.hf_checkpoint)):
        raise _err("hf_checkpoint", f"directory {cfg.hf_checkpoint!r} not found",
                   "point --hf_checkpoint at a directory with config.json and safetensors")


def write_config(run_dir: str, cfg: TrainConfig) -> None:
    os.makedirs(run_dir, exist_ok=True)
    tmp = os.path.join(run_dir, "config.json.tmp")
    with open(tmp, "w") as f:
        json.dump(cfg.to_json(), f, indent=2, sort_keys=True)
    os.replace(tmp, os.path.join(run_dir, "config.json"))
