"""Run configuration for GRPO/PPO training, validated before any compilation."""
from __future__ import annotations

import dataclasses
import json
import os
import typing
from typing import Any

from jaxrl_scale.optim import ADAM_RULES
from jaxrl_scale.rl.steps import LossConfig
from jaxrl_scale.sampling.rules import SamplingConfig

ALGOS = ("grpo", "ppo")
ROLLOUTS = ("auto", "engine", "generate")
# The built-in CPU task: 2-digit addition and subtraction (answers of 1-3 characters).
DEFAULT_TASK_KWARGS = {"digits": 2, "ops": "+-"}


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """Adam and its batch-scaling rule (lr follows lr_rule relative to base_batch)."""

    base_lr: float = 2e-4
    base_batch: int = 256
    lr_rule: str = "sqrt"
    critic_base_lr: float = 5e-4       # PPO's critic, same rule
    warmup_steps: int = 0
    max_grad_norm: float = 1.0         # 0 disables clipping
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Every knob of one training run: top-level fields plus three nested configs.

    `loss` is rl.steps.LossConfig (its temperature is always the sampler's), `sampling` is
    sampling.SamplingConfig, `optim` the OptimConfig above. Field names are unique across
    the nesting, so every field also has a flat name: flags are --clip_high, --base_lr,
    --temperature (not --loss.clip_high), and `make(**flat)` / `replace(**flat)` route flat
    names to their sub-config.
    """

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
    filter_zero_variance: bool = False  # GRPO: groups with equal rewards leave the loss
    # --- rollout
    max_new_tokens: int = 6
    # Asynchronous partial rollout (sampling/engine.py, rl/partial.py): B_gen = ratio * B_train
    # sequences in flight; 1 with max_staleness 0 is the synchronous rollout.
    gen_batch_ratio: int = 1
    max_staleness: int = -1            # policy versions a token may lag (-1: gen_batch_ratio - 1)
    recompute_kv: bool = False         # after an update, rebuild in-flight KV under new weights
    engine_steps: int = 8              # decode steps per engine call between host harvests
    rollout: str = "auto"              # "auto": the slot engine when partial, else generate;
                                       # "engine": always the slot engine; "generate"
    sampling: SamplingConfig = dataclasses.field(default_factory=SamplingConfig)
    # --- update
    loss: LossConfig = dataclasses.field(default_factory=lambda: LossConfig(clip_high=0.28))
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    micro_batches: int = 1
    # --- schedule
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

    # (sub-config, field) set from another field, so no flag or flat name of its own.
    _HIDDEN_FLAGS: typing.ClassVar = (("loss", "temperature"), ("loss", "decoupled"))

    def __post_init__(self):
        # Tokens are scored under the distribution they were sampled from, and tokens that
        # may be stale (partial rollout) are learned from with the decoupled objective.
        want = dict(temperature=self.sampling.temperature,
                    decoupled=self.use_engine and self.staleness_bound > 0)
        if any(getattr(self.loss, k) != v for k, v in want.items()):
            object.__setattr__(self, "loss", dataclasses.replace(self.loss, **want))

    @property
    def batch_train(self) -> int:
        return self.prompts_per_step * self.group_size

    @property
    def batch_gen(self) -> int:
        """Sequences in flight during rollout (B_gen = gen_batch_ratio * B_train)."""
        return self.gen_batch_ratio * self.batch_train

    @property
    def staleness_bound(self) -> int:
        return self.gen_batch_ratio - 1 if self.max_staleness < 0 else self.max_staleness

    @property
    def partial_rollout(self) -> bool:
        """True when sequences may run ahead of the policy (k > 1 or a staleness bound)."""
        return self.gen_batch_ratio > 1 or self.staleness_bound > 0

    @property
    def use_engine(self) -> bool:
        """The slot engine runs the rollout (else the synchronous `generate`)."""
        return self.rollout == "engine" or (self.rollout == "auto" and self.partial_rollout)

    @classmethod
    def make(cls, **flat) -> "TrainConfig":
        """TrainConfig() with fields given by flat name (see the class docstring)."""
        return cls().replace(**flat)

    def replace(self, **flat) -> "TrainConfig":
        """dataclasses.replace that also takes the flat names of nested fields."""
        top, nested = {}, {}
        for k, v in flat.items():
            if k in _TOP:
                top[k] = v
            elif k in _NESTED:
                nested.setdefault(_NESTED[k], {})[k] = v
            else:
                raise ValueError(f"TrainConfig has no field {k!r}. Fix: use one of "
                                 f"{sorted(_TOP | set(_NESTED))}.")
        for sub, kw in nested.items():
            top[sub] = dataclasses.replace(top.get(sub, getattr(self, sub)), **kw)
        return dataclasses.replace(self, **top)

    def flat(self) -> dict[str, Any]:
        """{flat name: value} of every field (nested ones by their own name)."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in SUBCONFIGS:
                out.update({n: getattr(v, n) for n in _fields(v) if (f.name, n) not in _HIDDEN})
            else:
                out[f.name] = v
        return out

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["batch_train"] = self.batch_train
        d["batch_gen"] = self.batch_gen
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "TrainConfig":
        """From to_json's output (nested) or a flat dict; unknown keys are ignored."""
        flat = {}
        for k, v in d.items():
            if k in SUBCONFIGS and isinstance(v, dict):
                flat.update({n: x for n, x in v.items() if (k, n) not in _HIDDEN})
            else:
                flat[k] = v
        return cls.make(**{k: v for k, v in flat.items() if k in _TOP - SUBCONFIGS.keys()
                           or k in _NESTED})


def _fields(obj_or_cls) -> list[str]:
    return [f.name for f in dataclasses.fields(obj_or_cls)]


SUBCONFIGS = {"loss": LossConfig, "sampling": SamplingConfig, "optim": OptimConfig}
_HIDDEN = set(TrainConfig._HIDDEN_FLAGS)
_TOP = set(_fields(TrainConfig))
_NESTED = {n: sub for sub, cls in SUBCONFIGS.items() for n in _fields(cls)
           if (sub, n) not in _HIDDEN}
assert not (_TOP & set(_NESTED)) and len(_NESTED) == sum(
    len(_fields(c)) for c in SUBCONFIGS.values()) - len(_HIDDEN), "flat names must be unique"


def _err(field: str, problem: str, fix: str) -> ValueError:
    where = f"{_NESTED[field]}.{field}" if field in _NESTED else field
    return ValueError(f"TrainConfig.{where}: {problem}. Fix: {fix}.")


def validate(cfg: TrainConfig, *, data_parallel: int | None = None,
             model_max_seq_len: int | None = None) -> None:
    """Raise a ValueError naming the field and the fix; cheap, runs before any compilation.
    (LossConfig and SamplingConfig check their names and ranges when they are built.)"""
    f = cfg.flat()
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
        if not f[name] > 0:
            raise _err(name, f"learning rate must be positive, got {f[name]}",
                       f"set --{name} > 0")
    if f["base_batch"] < 1:
        raise _err("base_batch", f"must be >= 1, got {f['base_batch']}", "set --base_batch")
    if f["lr_rule"] not in ADAM_RULES:
        raise _err("lr_rule", f"{f['lr_rule']!r} is unknown", f"use one of {ADAM_RULES}")
    for name, lo, hi in (("clip_low", 0.0, 1.0), ("clip_high", 0.0, None), ("vf_clip", 0.0, None),
                         ("kl_coef", 0.0, None), ("entropy_coef", 0.0, None),
                         ("gamma", 0.0, 1.0), ("lam", 0.0, 1.0)):
        v = f[name]
        if v < lo or (hi is not None and v > hi):
            rng = f"[{lo:g}, {hi:g}]" if hi is not None else f">= {lo:g}"
            raise _err(name, f"must be in {rng}, got {v}", f"set --{name} in {rng}")
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
    if f["dual_clip"] and f["dual_clip"] <= 1:
        raise _err("dual_clip", f"must be > 1 (or 0 to disable), got {f['dual_clip']}",
                   "use e.g. --dual_clip=3")
    if cfg.gen_batch_ratio < 1:
        raise _err("gen_batch_ratio", f"must be >= 1, got {cfg.gen_batch_ratio}",
                   "use 1 (synchronous rollout) or k > 1 for B_gen = k * B_train")
    if cfg.max_staleness < -1:
        raise _err("max_staleness", f"must be >= 0 (or -1 for gen_batch_ratio - 1), got "
                   f"{cfg.max_staleness}", "use e.g. --max_staleness=1")
    if cfg.gen_batch_ratio > 1 and cfg.staleness_bound == 0:
        raise _err("max_staleness", f"0 with gen_batch_ratio={cfg.gen_batch_ratio} keeps the "
                   "extra slots idle (no prompt may run ahead of the current policy)",
                   "use --max_staleness >= 1 (or -1 for gen_batch_ratio - 1)")
    if cfg.rollout not in ROLLOUTS:
        raise _err("rollout", f"{cfg.rollout!r} is unknown", f"use one of {ROLLOUTS}")
    if cfg.rollout == "generate" and cfg.partial_rollout:
        raise _err("rollout", "'generate' is the synchronous rollout, but gen_batch_ratio / "
                   "max_staleness ask for partial rollout", "use --rollout=auto")
    if cfg.engine_steps < 1:
        raise _err("engine_steps", f"must be >= 1, got {cfg.engine_steps}", "use e.g. 8")
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
