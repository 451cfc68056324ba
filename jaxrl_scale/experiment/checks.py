"""The checks of a TrainConfig that look outside it: the files it names (HF checkpoint, init
checkpoint, tokenizer, run directory), the task, reward and eval mode it asks for, the model's
own limits (LoRA targets, experts) and the devices' mesh. Each raises a ConfigError naming the
field and the fix; `config.validate` runs them before anything expensive (no tensor data is
read, nothing compiled).
"""
from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

from jaxrl_scale.experiment.errors import ConfigError

if TYPE_CHECKING:
    from jaxrl_scale.experiment.config import TrainConfig

_err = ConfigError


def check_paths(cfg: TrainConfig) -> None:
    def exists(p: str) -> bool:
        return os.path.exists(os.path.expanduser(p))
    if cfg.hf_checkpoint and not os.path.isfile(
            os.path.join(os.path.expanduser(cfg.hf_checkpoint), "config.json")):
        raise _err("hf_checkpoint", f"no config.json in {cfg.hf_checkpoint!r}",
                   "point --hf_checkpoint at a directory with config.json and *.safetensors")
    if cfg.hf_checkpoint:
        hf_model_config(cfg.hf_checkpoint)
    if cfg.init_checkpoint and not exists(cfg.init_checkpoint):
        raise _err("init_checkpoint", f"{cfg.init_checkpoint!r} does not exist",
                   "point --init_checkpoint at an orbax params directory (e.g. the SFT "
                   "warm-start), or leave it empty")
    if cfg.tokenizer != "char":
        path = os.path.expanduser(cfg.tokenizer)
        if not (os.path.isfile(os.path.join(path, "tokenizer.json")) or
                (os.path.isfile(path) and path.endswith(".json"))):
            raise _err("tokenizer", f"{cfg.tokenizer!r} is neither 'char' nor a directory "
                       "with tokenizer.json", "use --tokenizer=char or a HF tokenizer directory")
    if os.path.isfile(os.path.expanduser(cfg.run_dir)):
        raise _err("run_dir", f"{cfg.run_dir!r} is a file", "choose a directory path")
    if not cfg.hf_checkpoint:
        from jaxrl_scale.models.config import PRESETS
        if cfg.model not in PRESETS:
            raise _err("model", f"preset {cfg.model!r} is unknown",
                       f"use one of {', '.join(sorted(PRESETS))}, or --hf_checkpoint=DIR")
        if cfg.loss.router_aux_coef and not PRESETS[cfg.model].is_moe:
            raise _err("router_aux_coef", f"{cfg.loss.router_aux_coef} needs a mixture-of-"
                       f"experts model; preset {cfg.model!r} is dense",
                       "use --router_aux_coef=0, or an MoE preset such as --model=moe_cpu")


@contextlib.contextmanager
def hf_checkpoint_errors(path: str):
    """An HFCheckpointError in the block (a file missing, truncated or corrupt, a config.json
    field of the wrong type, an unsupported model) becomes a ConfigError naming hf_checkpoint."""
    from jaxrl_scale.models.hf_config import HFCheckpointError
    try:
        yield
    except HFCheckpointError as e:
        problem = " ".join(str(e).split()).rstrip(".")
        raise _err("hf_checkpoint", f"{path!r} cannot be used: {problem}",
                   "re-download or repair that file, or point --hf_checkpoint at another "
                   "checkpoint of a supported model") from None


def hf_model_config(path: str):
    """The ModelConfig of the HF checkpoint at `path` after every check that reads no tensor
    data (models.hf.check_hf: config.json, the safetensors headers against the files' sizes,
    tensor names and shapes); a ConfigError naming hf_checkpoint otherwise."""
    from jaxrl_scale.models.hf import check_hf
    with hf_checkpoint_errors(path):
        return check_hf(os.path.expanduser(path))


def check_lora(cfg: TrainConfig, model_cfg=None) -> None:
    """The adapter flags (targets are checked with rank 0 too: a typo should not wait for the
    run that turns LoRA on); `model_cfg` adds the model's own checks."""
    from jaxrl_scale.models.lora import invalid
    why = invalid(cfg.lora_rank or 1, cfg.lora_alpha, cfg.lora_targets, model_cfg)
    if why:
        fix = {"lora_targets": "pass a comma-separated subset of q,k,v,o,gate,up,down (an MoE "
                               "model: of q,k,v,o)",
               "lora_alpha": "pass e.g. --lora_alpha=16",
               "lora_rank": "pass --lora_rank=0 (off) or a rank such as 8"}[why[0]]
        raise _err(why[0], why[1], fix)
    if cfg.lora_rank and cfg.algo != "grpo":
        raise _err("lora_rank", f"LoRA trains GRPO's policy; --algo={cfg.algo} trains full "
                   f"networks", "use --algo=grpo, or --lora_rank=0")
    if cfg.lora_rank and model_cfg is None and not cfg.hf_checkpoint:
        from jaxrl_scale.models.config import PRESETS
        if cfg.model in PRESETS:
            check_lora(cfg, PRESETS[cfg.model])


def check_wandb(cfg: TrainConfig) -> None:
    import importlib.util
    if cfg.wandb_project and importlib.util.find_spec("wandb") is None:
        raise _err("wandb_project", "W&B logging needs the wandb package, which is not "
                   "installed", "pip install wandb (or pip install -e '.[wandb]'), or drop "
                   "--wandb_project")


# The reward's sources, one at most: a function, a server, a judge, a reward model.
REWARD_SOURCES = ("reward_fn", "reward_url", "judge_url", "reward_model")


def check_reward_source(cfg: TrainConfig) -> None:
    """At most one reward source, and that one's flags (data/remote_rewards.py)."""
    named = [f for f in REWARD_SOURCES if getattr(cfg, f)]
    if len(named) > 1:
        raise _err(named[1], f"both --{named[0]} and --{named[1]} name the reward",
                   f"pass one of {', '.join('--' + f for f in REWARD_SOURCES)}")
    if named and cfg.eval_mode == "exact" and named[0] != "reward_fn":
        raise _err("eval_mode", f"'exact' needs an exact-match reward, not --{named[0]}",
                   "use --eval_mode=sampled")
    from jaxrl_scale.data.remote_rewards import check_url
    for f in ("reward_url", "judge_url"):
        problem = getattr(cfg, f) and check_url(getattr(cfg, f))
        if problem:
            raise _err(f, problem, f"pass --{f}=http://host:port/path")
    for f in ("judge_model", "judge_template"):
        if not cfg.judge_url and getattr(cfg, f):
            raise _err(f, "is set but --judge_url is empty", f"set --judge_url too, or drop --{f}")
        if cfg.judge_url and not getattr(cfg, f):
            raise _err(f, "--judge_url needs it", f"pass --{f}=" +
                       ("NAME (the served model)" if f == "judge_model" else "PATH (a text file "
                        "with {prompt}, {response} and {answer} fields)"))
    if cfg.judge_url:
        path = os.path.expanduser(cfg.judge_template)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise _err("judge_template", f"cannot read {cfg.judge_template!r} ({e})",
                       "point --judge_template at a UTF-8 text file") from None
        if "{response}" not in text:
            raise _err("judge_template", f"{cfg.judge_template!r} has no {{response}} field",
                       "put {response} (and {prompt}, {answer} as needed) in the template")
    if cfg.reward_model:
        from jaxrl_scale.models.reward_model import check_reward_model
        try:
            check_reward_model(os.path.expanduser(cfg.reward_model))
        except (OSError, ValueError) as e:
            raise _err("reward_model", " ".join(str(e).split()).rstrip("."), "point "
                       "--reward_model at an HF *ForSequenceClassification directory "
                       "(config.json, safetensors, one label)") from None


def check_reward(cfg: TrainConfig) -> None:
    check_reward_source(cfg)
    if not cfg.reward_fn:
        return
    from jaxrl_scale.data.rewards import load_reward_fn
    try:
        load_reward_fn(cfg.reward_fn)
    except ValueError as e:
        raise _err("reward_fn", str(e), "pass --reward_fn=package.module:function, importable "
                   "from the working directory or PYTHONPATH") from None


def check_env(cfg: TrainConfig) -> None:
    """--env names an importable factory, and runs without DAPO refill rounds and the exact
    eval (they score single responses); the slot engine runs episodes (rl/partial_turns.py)."""
    if not cfg.env:
        return
    from jaxrl_scale.rl.multiturn import load_env_factory
    try:
        load_env_factory(cfg.env)
    except ValueError as e:
        raise _err("env", str(e), "pass --env=package.module:factory, importable from the "
                   "working directory or PYTHONPATH") from None
    for field, on, fix in (("refill", cfg.refill, "drop --refill"),
                           ("eval_mode", cfg.eval_mode == "exact", "use --eval_mode=sampled")):
        if on:
            raise _err(field, "does not work with --env (it scores single responses)",
                       f"{fix}, or drop --env")


def check_eval_mode(cfg: TrainConfig) -> None:
    """The exact eval reads P(answer) off the sampler's distribution: it needs a temperature,
    no truncation of that distribution, and an exact-match reward (rl/exact_eval.py)."""
    if cfg.eval_mode != "exact":
        return
    from jaxrl_scale.data.rewards import REWARDS
    from jaxrl_scale.rl.exact_eval import EXACT_REWARDS
    sc = cfg.sampling
    if not sc.temperature > 0 or sc.top_k or sc.top_p < 1:
        raise _err("eval_mode", f"'exact' needs plain sampling (temperature > 0, top_k 0, "
                   f"top_p 1), got temperature {sc.temperature}, top_k {sc.top_k}, top_p "
                   f"{sc.top_p}", "use --eval_mode=sampled, or drop top_k / top_p")
    r = REWARDS.get(cfg.task)
    fn = cfg.reward_fn or (f"{r.__module__}:{r.__name__}" if r else None)
    if fn not in EXACT_REWARDS:
        raise _err("eval_mode", f"'exact' needs an exact-match reward (one canonical answer), "
                   f"and task {cfg.task!r} is scored by {fn}", "use --eval_mode=sampled")


def check_task(cfg: TrainConfig) -> None:
    from jaxrl_scale.data.builders import TASKS, check_task_options
    if cfg.task not in TASKS:
        raise _err("task", f"{cfg.task!r} is unknown", f"use one of {', '.join(sorted(TASKS))}")
    if not isinstance(cfg.task_kwargs, dict):
        raise _err("task_kwargs", f"must be a JSON object, got {cfg.task_kwargs!r}",
                   'pass e.g. --task_kwargs=\'{"digits": 2}\'')
    kw = {k: v for k, v in cfg.task_kwargs.items()}
    try:
        check_task_options(cfg.task, num_train=cfg.num_train_examples or None,
                           num_test=cfg.num_test_examples or None, **kw)
    except (ValueError, TypeError) as e:
        known = [k for k in TASKS[cfg.task].knobs() if not k.startswith("num_")]
        raise _err("task_kwargs", str(e).rstrip("."), f"{cfg.task}'s options are "
                   f"{', '.join(known)} (sizes: --num_train_examples, --num_test_examples)"
                   ) from None


def check_mesh(cfg: TrainConfig, num_devices: int | None = None):
    """The (data, fsdp, tensor) mesh the run will use, or a ConfigError naming mesh_data."""
    from jaxrl_scale import sharding as shd
    import jax
    devices = jax.devices()[:num_devices] if num_devices else None
    _check_mesh_expert(cfg, len(devices or jax.devices()))
    try:
        return shd.make_mesh(cfg.mesh_data, cfg.mesh_fsdp, cfg.mesh_tensor, devices=devices,
                             expert=cfg.mesh_expert)
    except ValueError as e:
        raise _err("mesh_data", str(e), f"make mesh_data x mesh_fsdp x mesh_tensor x "
                   f"mesh_expert use the {len(devices or jax.devices())} devices (one of the "
                   "first three may be -1)") from None


def _num_experts(cfg: TrainConfig) -> int:
    """The model's expert count from its preset or config.json (no tensor data read)."""
    if cfg.hf_checkpoint:
        return hf_model_config(cfg.hf_checkpoint).num_experts
    from jaxrl_scale.models.config import PRESETS
    return PRESETS[cfg.model].num_experts


def _check_mesh_expert(cfg: TrainConfig, n_devices: int) -> None:
    """mesh_expert > 1 needs an MoE model whose experts, and the devices, it divides."""
    X = cfg.mesh_expert
    if X == 1:
        return
    E = _num_experts(cfg)
    model = cfg.hf_checkpoint or cfg.model
    if not E:
        raise _err("mesh_expert", f"{X} splits experts, but model {model!r} is dense",
                   "use --mesh_expert=1, or an MoE model such as --model=moe_cpu")
    if E % X:
        raise _err("mesh_expert", f"{X} does not divide the {E} experts of {model!r}",
                   f"use a divisor of {E}")
    if n_devices % X:
        raise _err("mesh_expert", f"{X} does not divide the {n_devices} devices",
                   f"use a divisor of {n_devices} that divides the {E} experts")


def check_updates(cfg: TrainConfig, data_parallel: int | None = None) -> None:
    """updates_per_rollout = U > 1: U minibatches of whole prompt groups, each split into
    micro_batches of whole groups, each of those over the data-parallel devices; and with
    U x update_epochs > 1 updates, is_cap's trainer log-probs (the loss's own forward pass)
    are pre-update only for the first of them."""
    U, M, P = cfg.updates_per_rollout, cfg.micro_batches, cfg.prompts_per_step
    E = cfg.update_epochs
    if U * E > 1 and cfg.loss.is_cap:
        field = "updates_per_rollout" if U > 1 else "update_epochs"
        raise _err(field, f"{U} minibatches x {E} epochs = {U * E} updates per rollout with "
                   f"--is_cap={cfg.loss.is_cap}: the trainer's log-probs are the pre-update "
                   "ones only for the first update",
                   f"use --{field}=1 or --is_cap=0")
    if U == 1:
        return
    if P % (U * M):
        raise _err("updates_per_rollout", f"{U} minibatches x {M} micro-batches do not "
                   f"divide the {P} prompt groups (minibatches hold whole groups)",
                   "choose updates_per_rollout * micro_batches dividing prompts_per_step")
    if data_parallel is not None and (cfg.batch_train // (U * M)) % data_parallel:
        raise _err("updates_per_rollout", f"the micro-batch of {cfg.batch_train // (U * M)} "
                   f"responses (P*G / (updates_per_rollout * micro_batches)) does not divide "
                   f"over the {data_parallel} data-parallel devices",
                   "lower --updates_per_rollout or --micro_batches")


def check_refill(cfg: TrainConfig) -> None:
    """--refill (DAPO dynamic sampling, rl/refill.py) needs a cap on its rounds (a task the
    policy always or never solves would otherwise generate forever), groups of G >= 2
    (GRPO), and the synchronous rollout (the engine's batches are not regenerated)."""
    if not cfg.refill:
        for name in ("refill_cap", "refill_prompts"):
            if getattr(cfg, name):
                raise _err(name, f"{getattr(cfg, name)} is set but --refill is off",
                           f"add --refill, or drop --{name}")
        return
    if cfg.refill_cap <= 0:
        raise _err("refill_cap", f"--refill needs a cap on the generation rounds per update "
                   f"(got {cfg.refill_cap}): without one, a batch with no prompt of mixed "
                   "rewards never ends", "pass --refill_cap=<rounds>, e.g. 4 (verl "
                   "algorithm.filter_groups.max_num_gen_batches)")
    if cfg.algo != "grpo":
        raise _err("refill", f"dynamic sampling refills groups of G >= 2 responses; "
                   f"--algo={cfg.algo} samples one response per prompt",
                   "use --algo=grpo, or drop --refill")
    if cfg.partial_rollout or cfg.rollout == "engine":
        raise _err("refill", "refill regenerates the synchronous rollout; the slot engine's "
                   "partial rollout (gen_batch_ratio / max_staleness / --rollout=engine) "
                   "does not refill", "use --gen_batch_ratio=1 --rollout=auto, or drop --refill")


def check_packing(cfg: TrainConfig, data_parallel: int | None = None, model_cfg=None) -> None:
    """--token_budget (rl/packed.py): GRPO with token-level ratios on a dense, fully trained
    model; the budget decides the micro-batches; and one micro-batch's D rows must hold any
    group of G sequences of up to max_prompt_len + max_new_tokens tokens (checked once the
    data-parallel size D and the prompt length are known)."""
    if not cfg.token_budget:
        return
    from jaxrl_scale.rl.packed import min_budget
    refusals = (
        (cfg.algo != "grpo", "algo", f"packing runs GRPO's update; --algo={cfg.algo}'s critic "
         "is padded", "use --algo=grpo, or --token_budget=0"),
        (cfg.loss.ratio_level != "token", "ratio_level", "packing needs token-level ratios "
         "(GSPO's sequence ratio spans a row)", "use --ratio_level=token, or --token_budget=0"),
        (bool(cfg.lora_rank), "lora_rank", "packing trains the full model", "use "
         "--lora_rank=0, or --token_budget=0"),
        (cfg.micro_batches > 1, "micro_batches", f"{cfg.micro_batches}: with --token_budget "
         "the budget decides the micro-batches", "drop --micro_batches"),
        (model_cfg is not None and model_cfg.is_moe, "token_budget", "packing runs dense "
         "models (the MoE router's load-balancing loss is per padded row)",
         "use a dense model, or --token_budget=0"))
    for bad, field, problem, fix in refusals:
        if bad:
            raise _err(field, problem, fix)
    T = cfg.max_prompt_len + cfg.max_new_tokens
    if data_parallel is not None and cfg.max_prompt_len:
        need = min_budget(T, cfg.group_size, data_parallel)
        if cfg.token_budget < need:
            raise _err("token_budget", f"{cfg.token_budget} < {need}: one micro-batch "
                       f"({data_parallel} row(s)) must hold a group of {cfg.group_size} "
                       f"sequences of up to max_prompt_len + max_new_tokens = {T} tokens",
                       f"use --token_budget >= {need}")


def check_pass_k(cfg: TrainConfig) -> None:
    """--pass_k: pass@k draws k of a prompt's eval_samples sampled responses, so each k is an
    integer in 1..eval_samples, listed once, and the eval samples (not --eval_mode=exact)."""
    ks = cfg.pass_k
    if not ks:
        return
    bad = [k for k in ks if isinstance(k, bool) or not isinstance(k, int)]
    if bad:
        raise _err("pass_k", f"must be integers, got {bad[0]!r}", "pass e.g. --pass_k=1,4")
    if cfg.eval_mode == "exact":
        raise _err("pass_k", "pass@k counts sampled responses and --eval_mode=exact samples "
                   "none", "use --eval_mode=sampled, or drop --pass_k")
    out = [k for k in ks if not 1 <= k <= cfg.eval_samples]
    if out:
        raise _err("pass_k", f"k={out[0]} is outside 1..eval_samples={cfg.eval_samples} "
                   "(pass@k draws k of each prompt's eval samples)",
                   "use k >= 1" if out[0] < 1 else f"use k <= {cfg.eval_samples}, or raise "
                   f"--eval_samples to >= {out[0]}")
    if len(set(ks)) != len(ks):
        raise _err("pass_k", f"lists a k twice ({','.join(map(str, ks))})",
                   "list each k once")


def check_loss_recipe(cfg: TrainConfig) -> None:
    """The ScaleRL / DAPO loss pieces with the rest of the run: CISPO's capped weight replaces
    PPO's clipped surrogate (so no dual clip, and token-level ratios); --adv_norm scales GRPO's
    group advantages (PPO whitens GAE's); the overlong buffer lies within the length cap."""
    lc = cfg.loss
    if lc.policy_loss == "cispo" and lc.dual_clip:
        raise _err("dual_clip", f"{lc.dual_clip} bounds PPO's clipped surrogate, which "
                   "--policy_loss=cispo does not use (its weight is capped at 1 + "
                   "--cispo_eps_high)", "drop --dual_clip, or use --policy_loss=ppo-clip")
    if lc.policy_loss == "cispo" and lc.ratio_level != "token":
        raise _err("ratio_level", f"{lc.ratio_level!r}: --policy_loss=cispo weights each "
                   "token by its own capped ratio", "use --ratio_level=token with cispo")
    if cfg.algo == "ppo" and lc.adv_norm != "auto":
        raise _err("adv_norm", f"{lc.adv_norm!r} scales GRPO's group advantages; PPO's GAE "
                   "advantages are whitened over the batch instead",
                   "drop --adv_norm with --algo=ppo (--whiten_advantages sets PPO's)")
    if cfg.overlong_buffer > cfg.max_new_tokens:
        raise _err("overlong_buffer", f"{cfg.overlong_buffer} tokens is longer than the "
                   f"length cap max_new_tokens={cfg.max_new_tokens}",
                   f"use --overlong_buffer <= {cfg.max_new_tokens} (or 0: off)")


def check_chat_template(spec: str, tokenizer: str):
    """--chat_template ("none", "auto" or a .jinja path) for the run's --tokenizer: the template
    is found, compiles and renders one task prompt (and, under the character tokenizer, its
    text encodes), so a broken one stops the run before any data or model loads. Returns the
    models.chat.ChatTemplate, or None for "none"."""
    from jaxrl_scale.models.chat import SAMPLE_PROMPT, ChatTemplateError, load_chat_template
    from jaxrl_scale.models.tokenizer import CharTokenizer
    try:
        template = load_chat_template(spec, tokenizer)
        if template is not None and tokenizer == "char":
            template.encode_prompt(CharTokenizer(), SAMPLE_PROMPT)
    except (ChatTemplateError, ValueError) as e:
        fix = ("use --chat_template=none (the bare prompt), or --chat_template=PATH of a .jinja "
               "template" if spec == "auto" else "fix the template so that it renders one user "
               "message, or use --chat_template=none (the bare prompt)")
        raise _err("chat_template", " ".join(str(e).split()).rstrip("."), fix) from None
    return template
