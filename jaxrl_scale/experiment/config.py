"""Run configuration for GRPO/PPO training, validated before any compilation."""
from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import os
import typing
from typing import Any

from jaxrl_scale.experiment.checks import (check_eval_mode, check_lora, check_loss_recipe,
                                           check_mesh, check_pass_k, check_paths, check_packing,
                                           check_refill, check_reward, check_task, check_updates,
                                           check_wandb)
from jaxrl_scale.experiment.checks import check_chat_template, check_env
from jaxrl_scale.experiment.errors import ConfigError  # noqa: F401  (re-exported)
from jaxrl_scale.experiment.schedule import check_schedule
from jaxrl_scale.optim import ADAM_RULES
from jaxrl_scale.rl.config import LOSS_CHOICES, LossConfig, invalid_is_cap
from jaxrl_scale.sampling.rules import SamplingConfig

ALGOS = ("grpo", "ppo")
ROLLOUTS = ("auto", "engine", "generate")
WANDB_MODES = ("", "online", "offline", "disabled")
EVAL_MODES = ("sampled", "exact")
# The built-in CPU task: 2-digit addition and subtraction (answers of 1-3 characters).
# arith_chain (chains of such operations with shown work) takes the same knobs.
DEFAULT_TASK_KWARGS = {"digits": 2, "ops": "+-"}


def task_max_new_tokens(task: str, task_kwargs: dict) -> int | None:
    """The response cap (character tokens) that covers every solution of `task` plus EOS, for
    a task whose solutions outgrow the default max_new_tokens; None for the others (and for
    knobs the task refuses: validation reports those). Truncating the long tail would cut
    exactly the responses that make generation the long part of a step."""
    if task != "arith_chain":
        return None
    from jaxrl_scale.data.tasks import ArithChainSpec
    names = {f.name for f in dataclasses.fields(ArithChainSpec)}
    try:
        spec = ArithChainSpec(**{k: v for k, v in task_kwargs.items() if k in names})
        spec.validate()
        return spec.max_response_chars() + 1
    except (TypeError, ValueError):
        return None


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """Adam and its batch-scaling rule (lr follows lr_rule relative to base_batch)."""

    base_lr: float = 2e-4
    base_batch: int = 256
    lr_rule: str = "sqrt"
    critic_base_lr: float = 5e-4       # PPO's critic
    critic_lr_rule: str = ""           # PPO's critic, relative to base_batch ("": lr_rule)
    warmup_steps: int = 0
    max_grad_norm: float = 1.0         # 0 disables clipping
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Every knob of one training run: top-level fields plus three nested configs.

    `loss` is rl.config.LossConfig (its temperature is always the sampler's), `sampling` is
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
    # Your reward instead of the task's: "package.module:function" with signature
    # fn(response: str, example: dict) -> float (example: the task row, "prompt", "answer", ...)
    reward_fn: str = ""
    reward_timeout_s: float = 10.0     # per call of reward_fn or request (0: no timeout)
    # Rewards from elsewhere (data/remote_rewards.py; docs/usage.md, Remote, judge and model
    # rewards): a reward server's URL, an OpenAI-compatible judge with a prompt template
    # ({prompt} {response} {answer}) and a score rule ("number" in [0, 1] or "yes_no"), or a
    # *ForSequenceClassification HF directory run in-process. Requests: `reward_concurrency`
    # at a time, `reward_retries` more tries each with backoff; `reward_batch_size`
    # responses per request or model call (0: the batch split over the concurrency).
    reward_url: str = ""
    judge_url: str = ""
    judge_model: str = ""
    judge_template: str = ""
    judge_parse: str = "number"
    reward_model: str = ""
    reward_concurrency: int = 4
    reward_retries: int = 2
    reward_batch_size: int = 0
    # Score rewards on a worker thread while decoding continues (rl/scoring.py): the slot
    # engine's groups as they finish, generate's chunks as they reach the host. Same rewards;
    # off (or multi-process, or --env) scores after the rollout.
    reward_overlap: bool = True
    # Multi-turn episodes (rl/multiturn.py): "package.module:factory", factory(example) ->
    # an object with reset() -> str and step(text) -> (observation, reward, done); at most
    # env_max_turns assistant turns, env_max_obs_tokens per observation, env_timeout_s of
    # environment time per episode. The episode's reward is the sum of its step rewards.
    # env_isolation: each episode's environment in a worker process of its own, killed when
    # a call outlives the episode's time ("process"), or on a thread of its own ("thread": a
    # hung call is abandoned, not killed); "auto": thread for the library's own environments
    # (bounded, trusted code, as the built-in rewards run inline), process for any other
    # module; data/env_runner.py.
    env: str = ""
    env_max_turns: int = 4
    env_max_obs_tokens: int = 256
    env_timeout_s: float = 60.0
    env_isolation: str = "auto"
    # --- model
    model: str = "rl_cpu"              # preset name, used when no checkpoint is given
    hf_checkpoint: str = ""            # HF directory (config.json + safetensors)
    init_checkpoint: str = ""          # orbax params (e.g. the SFT warm-start)
    # MoE expert dispatch (ModelConfig.moe_dispatch): "dense", "sparse" (dropless; expert
    # parallel on --mesh_expert > 1) or "auto" (by E / k). Ignored by dense models.
    moe_dispatch: str = "auto"
    # LoRA (models/lora.py): rank 0 trains the full model; rank r > 0 trains adapters of rank
    # r on the target projections (any of q,k,v,o,gate,up,down), scaled by alpha / r, with
    # the base model frozen. The lr rules apply to the adapters; checkpoints hold them alone.
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_targets: tuple[str, ...] = ("q", "k", "v", "o", "gate", "up", "down")
    tokenizer: str = "char"            # "char" or a directory with tokenizer.json
    # Prompts through a chat template (models/chat.py): "none" the bare prompt, "auto" the
    # tokenizer's own template, or a .jinja file; each prompt is one user turn.
    chat_template: str = "none"
    # --- batch (counted in retained responses per update: B_train = P * G)
    prompts_per_step: int = 32         # P
    group_size: int = 8                # G (PPO: 1)
    filter_zero_variance: bool = False  # GRPO: groups with equal rewards leave the loss
    # DAPO dynamic sampling (rl/refill.py): filter those groups and generate further rounds
    # of P prompts x G until P groups with a reward spread are kept, at most refill_cap rounds
    # per update (verl filter_groups.max_num_gen_batches; a cap is required). The analysis
    # then counts responses generated, every round's (what the full batch costs).
    # refill_prompts: prompts of each round after the first (0: P; fewer waste less when few
    # groups are filtered; one more generate shape, compiled before the run's clock starts).
    refill: bool = False
    refill_cap: int = 0
    refill_prompts: int = 0
    # --- rollout
    max_new_tokens: int = 6
    # DAPO's length handling (Yu et al. 2025; rl/batch.py): mask_truncated gives a response the
    # cap cut (no EOS) an empty loss mask (overlong filtering); overlong_buffer = L > 0 adds the
    # soft overlong punishment to the training reward, -overlong_penalty * (|y| - (Lmax - L))
    # / L over the cap's last L tokens, Lmax = max_new_tokens (evals never see it; p = 1 is
    # DAPO's factor). 0: off.
    mask_truncated: bool = False
    overlong_buffer: int = 0
    overlong_penalty: float = 1.0
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
    # What the update's backward recomputes instead of storing (models/remat.py): "none",
    # "full" (each decoder layer's forward again: the least activation memory, ~1 more
    # forward of compute) or a jax.checkpoint_policies name such as dots_saveable. The
    # same math; not resumable with another value (time_s would mix two update speeds).
    remat: str = "none"
    # GRPO: pack each row's tokens (no padding) into rows of this many tokens, one per
    # data-parallel shard, and run as many such micro-batches as the lengths need (rl/packed.py;
    # verl ppo_max_token_len_per_gpu, TRL padding_free). 0: the padded update. Packing runs
    # every row's own prompt (it replaces --share_prompt) and decides the micro-batches.
    token_budget: int = 0
    # GRPO: run each group's prompt once in the update (the G responses share it; same loss
    # and gradients on fewer tokens, rl/steps.grpo_step shared_prompt_len). False: every row.
    share_prompt: bool = True
    # PPO's critic has its own schedule (its noise scale, so its critical batch, differs from
    # the actor's): critic_minibatches x critic_epochs Adam updates per rollout, each on
    # B_train / critic_minibatches responses, lr by critic_lr_rule at that batch.
    critic_minibatches: int = 1
    critic_epochs: int = 1
    # Optimizer updates of the policy (PPO: the actor) per rollout batch: the batch's P
    # prompt groups split into this many minibatches of whole groups, one Adam update each
    # (verl ppo_mini_batch_size, TRL steps_per_generation), lr by lr_rule at B_train / this.
    # 1: one update on the whole batch. Samples stay responses generated; `step` counts
    # rollouts and the record's `updates` the optimizer updates (the lr schedule's count).
    updates_per_rollout: int = 1
    # Passes over those minibatches (verl ppo_epochs, TRL num_iterations): updates_per_rollout
    # x update_epochs Adam updates of the policy per rollout, each still on B_train /
    # updates_per_rollout responses (the lr rule's batch). 1: each minibatch once.
    update_epochs: int = 1
    # --- batch schedule (experiment/schedule.py): P as a controller during the run. "none":
    # fixed P; "steps": from batch_ramp "RESPONSES:P,..." cumulative responses on, P prompts
    # per step; "noise": every schedule_every steps, B_simple over the last schedule_window
    # updates' micro-batch norms, and P doubles while the interval's lower end of
    # schedule_c * B_simple exceeds the batch, up to batch_cap responses. The lr follows
    # lr_rule at the current batch; the Adam state carries over.
    batch_schedule: str = "none"
    batch_ramp: str = ""
    batch_cap: int = 0
    schedule_every: int = 10
    # 20 updates: enough for a bootstrap interval of a mean that single updates' |G|^2
    # estimates (often negative at B = 128) cannot give; half of it is new at each decision.
    schedule_window: int = 20
    # The sweeps measured the critical batch about 2.3x below B_simple: c = 1/2.3 aims the
    # batch at the critical batch, not at the noise scale itself.
    schedule_c: float = 0.43
    # --- schedule
    max_steps: int = 100
    max_responses: int = 0             # response budget (0: none)
    target: float = 0.0                # stop once eval score >= target ... (0: no target stop)
    target_margin: float = 0.0         # ... and responses >= N* * (1 + margin)
    target_evals: int = 0              # ... and the isotonic fit of the evals reached it this
                                       # many evals ago (0: the raw eval alone)
    seed: int = 0
    # --- eval / checkpoints
    eval_every: int = 5
    eval_prompts: int = 128
    eval_samples: int = 4
    # pass@k and avg@k over the eval_samples draws per prompt for each k here, each k <=
    # eval_samples (experiment/records.pass_k_fields); empty: none logged.
    pass_k: tuple[int, ...] = ()
    # "sampled": eval_samples responses per prompt, scored by the reward; "exact": per prompt
    # the probability that a sampled response earns an exact-match reward, from the policy's
    # token probabilities (rl/exact_eval.py: no sampling noise, one forward pass).
    eval_mode: str = "sampled"
    # Rows per generate call. Eval batches (prompts x samples) are split into chunks of this
    # size: one call over all rows pads to the next power of two and is slower per row on CPU.
    generate_chunk: int = 4096
    checkpoint_every: int = 10
    # --- metric writers (same scalars as metrics.jsonl; experiment/writers.py)
    tensorboard: bool = True           # event files in <run_dir>/tensorboard
    wandb_project: str = ""            # Weights & Biases project ("" = off)
    wandb_mode: str = ""               # "online", "offline" (no network), "disabled"; "": WANDB_MODE
    # --- mesh ('data', 'fsdp', 'tensor'); -1 absorbs the remaining devices
    mesh_data: int = -1
    mesh_fsdp: int = 1
    mesh_tensor: int = 1
    # expert parallelism (MoE): the experts split over this many devices (an `expert` mesh
    # axis, which also splits the batch rows); must divide the experts and the devices.
    mesh_expert: int = 1

    # (sub-config, field) set from another field, so no flag or flat name of its own.
    _HIDDEN_FLAGS: typing.ClassVar = (("loss", "temperature"), ("loss", "decoupled"))

    def __post_init__(self):
        # Tokens are scored under the distribution they were sampled from, and tokens that
        # may be stale (partial rollout) are learned from with the decoupled objective.
        want = dict(temperature=self.sampling.temperature,
                    decoupled=self.use_engine and self.staleness_bound > 0)
        if any(getattr(self.loss, k) != v for k, v in want.items()):
            object.__setattr__(self, "loss", dataclasses.replace(self.loss, **want))
        # A tuple whatever came in ("q,v", a JSON list from config.json), so that configs
        # compare equal on resume.
        targets = self.lora_targets
        if isinstance(targets, str):
            targets = [t.strip() for t in targets.split(",") if t.strip()]
        object.__setattr__(self, "lora_targets", tuple(targets))
        ks = self.pass_k.split(",") if isinstance(self.pass_k, str) else self.pass_k
        object.__setattr__(self, "pass_k", tuple(
            int(k) if isinstance(k, str) and k.strip().isdigit() else k for k in ks))

    @property
    def lora(self):
        """models.lora.LoraConfig of a LoRA run, None for a full update."""
        if not self.lora_rank:
            return None
        from jaxrl_scale.models.lora import LoraConfig
        return LoraConfig(self.lora_rank, self.lora_alpha, self.lora_targets)

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
    def filters_groups(self) -> bool:
        """Zero-variance groups leave the loss: --filter_zero_variance, or --refill (which
        filters them and generates replacements)."""
        return self.filter_zero_variance or self.refill

    @property
    def refill_round(self) -> int:
        """Prompts per refill round after the first (refill_prompts, 0: P)."""
        return self.refill_prompts or self.prompts_per_step

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
                near = difflib.get_close_matches(k, sorted(_TOP | set(_NESTED)), n=3)
                raise ConfigError(k, "TrainConfig has no such field", (
                    f"did you mean {' or '.join(near)}" if near else
                    "see TrainConfig().flat() for the field names"))
        check_fields(flat)   # before the nested configs' own checks
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


_err = ConfigError

# Numeric fields: (lowest, highest, lowest excluded). Checked for every run before anything
# loads; the cross-field rules follow in `validate`.
_INF = float("inf")
RANGES: dict[str, tuple[float, float, bool]] = {
    **{k: (1, _INF, False) for k in (
        "prompts_per_step", "group_size", "max_new_tokens", "gen_batch_ratio", "engine_steps",
        "micro_batches", "max_steps", "eval_every", "eval_prompts", "eval_samples",
        "generate_chunk", "checkpoint_every", "base_batch", "critic_minibatches",
        "critic_epochs", "mesh_expert", "updates_per_rollout", "update_epochs",
        "reward_concurrency", "env_max_turns", "env_max_obs_tokens")},
    "lora_rank": (0, _INF, False), "lora_alpha": (0, _INF, True),
    **{k: (0, _INF, False) for k in (
        "max_responses", "num_train_examples", "num_test_examples", "max_prompt_len", "seed",
        "warmup_steps", "top_k", "max_grad_norm", "clip_high", "vf_clip", "kl_coef",
        "entropy_coef", "router_aux_coef", "target_margin", "target_evals", "temperature", "dual_clip",
        "reward_timeout_s", "refill_cap", "refill_prompts", "token_budget", "overlong_buffer",
        "overlong_penalty", "reward_retries", "reward_batch_size")},
    **{k: (0, _INF, True) for k in ("base_lr", "critic_base_lr", "eps", "cispo_eps_high",
                                    "env_timeout_s")},
    **{k: (0, 1, False) for k in ("clip_low", "gamma", "lam", "target")},
    **{k: (0, 1, True) for k in ("top_p",)},
    "b1": (0, 0.999999, False), "b2": (0, 0.999999, False), "max_staleness": (-1, _INF, False),
}
INT_FIELDS = {f.name for c in (TrainConfig, OptimConfig, LossConfig, SamplingConfig)
              for f in dataclasses.fields(c) if f.type in ("int", int)}


@functools.cache
def _enums() -> dict[str, tuple]:
    from jaxrl_scale.models.config import MOE_DISPATCHES
    from jaxrl_scale.models.remat import CHOICES as REMAT_CHOICES
    return {"algo": ALGOS, "rollout": ROLLOUTS, "lr_rule": ADAM_RULES, "wandb_mode": WANDB_MODES,
            "eval_mode": EVAL_MODES, "judge_parse": ("number", "yes_no"),
            "env_isolation": ("auto", "thread", "process"),
            "moe_dispatch": MOE_DISPATCHES, "remat": REMAT_CHOICES,
            **LOSS_CHOICES}   # the loss's choices: one table, rl/config.py


def check_fields(flat: dict[str, Any]) -> None:
    """Types, ranges and names of the given flat fields (a ConfigError for the first bad one).
    Runs before the nested configs are built, so their own checks never speak first."""
    for name, v in flat.items():
        if name in _enums() and v not in _enums()[name]:
            raise _err(name, f"{v!r} is unknown", f"use one of {', '.join(_enums()[name])}")
    check_ranges(flat, RANGES, INT_FIELDS)
    if "is_cap" in flat and invalid_is_cap(flat["is_cap"]):   # 0, or finite and >= 1
        raise _err("is_cap", f"{flat['is_cap']} {invalid_is_cap(flat['is_cap'])}",
                   "use e.g. --is_cap=2, or --is_cap=0 to disable")


def check_ranges(flat: dict[str, Any], ranges: dict[str, tuple[float, float, bool]],
                 int_fields) -> None:
    """A ConfigError for the first field of `flat` outside its (lowest, highest, lowest
    excluded) range in `ranges`, or not a (finite) number / integer."""
    for name, v in flat.items():
        if name not in ranges:
            continue
        lo, hi, open_lo = ranges[name]
        kind = "an integer" if name in int_fields else "a number"
        if isinstance(v, bool) or not isinstance(v, (int, float)) or \
                (name in int_fields and not float(v).is_integer()):
            raise _err(name, f"must be {kind}, got {v!r}", f"pass --{name}=<{kind[2:]}>")
        if v in (_INF, -_INF):
            raise _err(name, f"must be finite, got {v}", f"pass a finite --{name}")
        if v != v or v < lo or v > hi or (open_lo and v == lo):
            left = "(" if open_lo else "["
            rng = f"{left}{lo:g}, {hi:g}]" if hi < _INF else (f"> {lo:g}" if open_lo
                                                                  else f">= {lo:g}")
            raise _err(name, f"must be {'in ' if hi < _INF else ''}{rng}, got {v}",
                       f"set --{name} {'in ' if hi < _INF else ''}{rng}")


def validate(cfg: TrainConfig, *, data_parallel: int | None = None,
             model_max_seq_len: int | None = None) -> None:
    """Raise a ConfigError naming the field and the fix; cheap (no data, model or compile),
    so it runs before anything expensive. The caller adds the mesh's data-parallel size and
    the model's context once it knows them."""
    f = cfg.flat()
    check_fields(f)
    if cfg.algo == "grpo" and cfg.group_size < 2:
        raise _err("group_size", f"GRPO needs >= 2 responses per prompt, got {cfg.group_size}",
                   "set --group_size >= 2, or use --algo=ppo (which uses G = 1)")
    if cfg.algo == "ppo" and cfg.group_size != 1:
        raise _err("group_size", f"PPO samples one response per prompt, got {cfg.group_size}",
                   "set --group_size=1 with --algo=ppo")
    if f["critic_lr_rule"] and f["critic_lr_rule"] not in ADAM_RULES:
        raise _err("critic_lr_rule", f"{f['critic_lr_rule']!r} is unknown",
                   f"use one of {', '.join(ADAM_RULES)}, or '' for the actor's lr_rule")
    if cfg.algo != "ppo" and (cfg.critic_minibatches, cfg.critic_epochs) != (1, 1):
        raise _err("critic_minibatches", f"GRPO has no critic (critic_minibatches="
                   f"{cfg.critic_minibatches}, critic_epochs={cfg.critic_epochs})",
                   "leave both at 1, or use --algo=ppo")
    if cfg.critic_minibatches > 1 and \
            cfg.prompts_per_step % (cfg.critic_minibatches * cfg.micro_batches):
        raise _err("critic_minibatches", f"{cfg.critic_minibatches} minibatches x "
                   f"{cfg.micro_batches} micro-batches do not divide the {cfg.prompts_per_step} "
                   "prompts", "choose critic_minibatches * micro_batches dividing prompts_per_step")
    if cfg.prompts_per_step % cfg.micro_batches:
        raise _err("micro_batches", f"{cfg.micro_batches} does not divide the "
                   f"{cfg.prompts_per_step} prompt groups (micro-batches hold whole groups)",
                   "choose a divisor of prompts_per_step")
    if f["dual_clip"] and f["dual_clip"] <= 1:
        raise _err("dual_clip", f"must be > 1 (or 0 to disable), got {f['dual_clip']}",
                   "use e.g. --dual_clip=3")
    if cfg.gen_batch_ratio > 1 and cfg.staleness_bound == 0:
        raise _err("max_staleness", f"0 with gen_batch_ratio={cfg.gen_batch_ratio} keeps the "
                   "extra slots idle (no prompt may run ahead of the current policy)",
                   "use --max_staleness >= 1 (or -1 for gen_batch_ratio - 1)")
    if cfg.rollout == "generate" and cfg.partial_rollout:
        raise _err("rollout", "'generate' is the synchronous rollout, but gen_batch_ratio / "
                   "max_staleness ask for partial rollout", "use --rollout=auto")
    check_lora(cfg)
    check_updates(cfg, data_parallel)
    check_refill(cfg)
    check_packing(cfg, data_parallel)
    for field in ("target_margin", "target_evals"):
        if getattr(cfg, field) and not cfg.target:
            raise _err(field, "is set but --target is 0 (no target stop)",
                       f"set --target too, or drop --{field}")
    if cfg.num_test_examples and cfg.eval_prompts > cfg.num_test_examples:
        raise _err("eval_prompts", f"{cfg.eval_prompts} eval prompts but only "
                   f"{cfg.num_test_examples} test examples", "lower --eval_prompts or raise "
                   "--num_test_examples")
    check_paths(cfg)
    check_chat_template(cfg.chat_template, cfg.tokenizer)
    check_task(cfg)
    check_reward(cfg)
    check_env(cfg)
    check_eval_mode(cfg)
    check_pass_k(cfg)
    check_loss_recipe(cfg)
    check_wandb(cfg)
    check_schedule(cfg, data_parallel)
    if data_parallel is not None and cfg.critic_minibatches > 1 and (
            cfg.batch_train // (cfg.micro_batches * cfg.critic_minibatches)) % data_parallel:
        raise _err("critic_minibatches", f"the critic's micro-batch of "
                   f"{cfg.batch_train // (cfg.micro_batches * cfg.critic_minibatches)} responses "
                   f"does not divide over the {data_parallel} data-parallel devices",
                   "lower --critic_minibatches or --micro_batches")
    if data_parallel is not None and (cfg.batch_train // cfg.micro_batches) % data_parallel:
        raise _err("prompts_per_step", f"the micro-batch of {cfg.batch_train // cfg.micro_batches}"
                   f" responses (P*G = {cfg.batch_train} / micro_batches = {cfg.micro_batches}) "
                   f"does not divide over the {data_parallel} data-parallel devices",
                   "make P*G/micro_batches a multiple of mesh_data*mesh_fsdp")
    if model_max_seq_len is not None and cfg.max_prompt_len + cfg.max_new_tokens > \
            model_max_seq_len:
        raise _err("max_prompt_len", f"max_prompt_len {cfg.max_prompt_len} + max_new_tokens "
                   f"{cfg.max_new_tokens} exceeds the model context {model_max_seq_len}",
                   "shorten prompts/responses or use a model with a longer context")


def validate_for_devices(cfg: TrainConfig):
    """`validate` with the mesh over the run's devices (every process's, in a multi-process
    run; imports JAX, compiles nothing); returns the mesh."""
    from jaxrl_scale import sharding as shd
    import jax
    validate(cfg)
    if jax.process_count() > 1 and cfg.use_engine:
        raise _err("gen_batch_ratio" if cfg.partial_rollout else "rollout",
                   f"the slot engine (asynchronous partial rollout) runs in one process, "
                   f"and this run has {jax.process_count()}",
                   "use --gen_batch_ratio=1 --rollout=auto for a multi-process run, or run "
                   "the partial rollout in one process")
    mesh = check_mesh(cfg)
    validate(cfg, data_parallel=shd.data_parallel_size(mesh))
    return mesh


# Fields a resumed run may change: when to stop, how often to checkpoint, where files are.
# Anything else changes what the saved steps mean, so a resume with it changed is refused.
RESUMABLE_FIELDS = ("run_dir", "max_steps", "max_responses", "target", "target_margin",
                    "target_evals",
                    "checkpoint_every", "data_dir", "tensorboard", "wandb_project", "wandb_mode")


def resume_conflicts(saved: dict[str, Any], cfg: TrainConfig, ignore=()
                     ) -> dict[str, tuple[Any, Any]]:
    """{flat field: (saved value, new value)} of the fields that differ from a run
    directory's config.json and may not change across a resume."""
    old = TrainConfig.from_json(saved).flat()
    new = cfg.flat()
    skip = set(RESUMABLE_FIELDS) | set(ignore)
    return {k: (old[k], new[k]) for k in new if k not in skip and old[k] != new[k]}


def check_resume(cfg: TrainConfig, ignore=()) -> None:
    """Refuse to continue a run directory that was started with another configuration
    (its metrics would mix two runs); a directory without saved steps is not a resume."""
    path = os.path.join(cfg.run_dir, "config.json")
    has_steps = any(os.path.exists(os.path.join(cfg.run_dir, n))
                    for n in ("metrics.jsonl", "checkpoints"))
    if not (has_steps and os.path.exists(path)):
        return
    with open(path) as fh:
        saved = json.load(fh)
    diff = resume_conflicts(saved, cfg, ignore)
    if diff:
        shown = ", ".join(f"{k} (saved {a!r}, now {b!r})" for k, (a, b) in sorted(diff.items()))
        raise _err(next(iter(sorted(diff))), f"{cfg.run_dir} holds a run with another "
                   f"configuration: {shown}", "resume with the saved values, or use a new "
                   f"--run_dir (fields that may change: {', '.join(RESUMABLE_FIELDS[1:])})")


def write_config(run_dir: str, cfg: TrainConfig) -> None:
    os.makedirs(run_dir, exist_ok=True)
    from jaxrl_scale.experiment.common import write_json
    write_json(os.path.join(run_dir, "config.json"), cfg.to_json(), indent=2, sort_keys=True)
