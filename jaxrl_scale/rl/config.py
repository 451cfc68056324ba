"""Static settings of the update steps, as values: `LossConfig` (the loss) and `StepOptions`
(everything a GRPO / PPO step binds statically: model, optimizers, loss, micro-batching,
schedules). Both are frozen, hashable dataclasses: part of the compiled graph, never traced.

This module imports no step code, so a configuration module can build a `LossConfig` without
importing rl/steps.py. The loss's named choices are checked here once (`LOSS_CHOICES`,
`invalid_choice`): by `LossConfig` itself and by experiment/config.py's flag checks.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional

from jaxrl_scale.rl import losses

# LossConfig fields that name one of a fixed set of choices.
LOSS_CHOICES = {"advantage": losses.ADVANTAGE_ESTIMATORS, "agg": losses.AGG_MODES,
                "kl_kind": losses.KL_KINDS, "ratio_level": losses.RATIO_LEVELS,
                "policy_loss": losses.POLICY_LOSSES, "adv_norm": losses.ADV_NORMS}


def invalid_choice(field: str, value: Any) -> Optional[str]:
    """None when `value` is a valid choice for the LossConfig field, else why not."""
    valid = LOSS_CHOICES.get(field)
    if valid is None or value in valid:
        return None
    return f"LossConfig.{field}={value!r}; valid: {valid}"


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Static loss settings (hashable; part of the compiled graph)."""

    advantage: str = "grpo"        # GRPO's group estimator (losses.group_advantages)
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float = 0.0         # 0 disables; else > 1 (e.g. 3)
    agg: str = "token-mean"
    temperature: float = 1.0       # the sampler's; tokens are scored under the same distribution
    # Decoupled PPO for off-policy rollouts (Hilton et al. 2022): the surrogate is clipped
    # around the proximal policy (batch.prox_logp_BT, else the params being updated, which
    # are the pre-update policy when the batch makes one optimizer update) and weighted by
    # pi_prox / pi_behav against the behaviour log-probs in old_logp_BT.
    decoupled: bool = False
    # Rollout/trainer mismatch. The batch's old_logp_BT are the sampler's ("rollout") log-probs;
    # the "trainer" log-probs are the same tokens scored by the trainer at the pre-update params:
    # batch.prox_logp_BT when given, else sg(logp) of the loss's own forward pass (one update
    # per batch: the params being differentiated are the pre-update ones; with several, pass
    # prox_logp_BT). is_cap = C > 0 (>= 1; 0 disables): truncated importance sampling (TIS,
    # Yao et al. 2025; verl): the surrogate is clipped around the trainer's log-probs and each
    # token's term weighted by sg(min(pi_trainer / pi_rollout, C)), i.e. decoupled PPO with the
    # weight capped. With sampler == trainer the weights are exactly 1 and the update is
    # plain PPO's. The step always logs mismatch_kl (losses.mismatch_kl: k3 of the same pair).
    is_cap: float = 0.0
    # "token": per-token ratios (PPO); "sequence": GSPO (Zheng et al. 2025), one ratio per
    # response, exp of its mean token log-ratio, clipped by clip_low / clip_high (GSPO's
    # own objective also averages per sequence: agg="seq-mean-token-mean").
    ratio_level: str = "token"
    # The policy-gradient term (losses.policy_loss): "ppo-clip", the clipped surrogate above,
    # or "cispo", MiniMax-M1's truncated-IS REINFORCE that ScaleRL (Khatri et al. 2025) uses,
    # -sg(min(r, 1 + cispo_eps_high)) A logp. Default cap 1 + 3 = 4: ScaleRL's eps_max = 4,
    # which it writes as min(r, eps_max); MiniMax-M1 writes the bound as 1 + eps_high.
    policy_loss: str = "ppo-clip"
    cispo_eps_high: float = 3.0
    # The advantages' scale on top of `advantage` (losses.group_advantages): "group" (the
    # group's reward std), "batch" (the std over the batch, ScaleRL's), "none", or "auto":
    # the estimator's own (grpo: group; drgrpo, rloo: none), so existing runs are unchanged.
    adv_norm: str = "auto"
    kl_coef: float = 0.0           # KL to a frozen reference; needs batch.ref_logp_BT
    kl_kind: str = "k3"
    entropy_coef: float = 0.0      # entropy bonus: loss -= coef * aggregate(entropy)
    # Mixture-of-experts models only: loss += coef * router load-balancing loss
    # (models/moe.load_balancing_loss over the valid tokens; HF's router_aux_loss_coef).
    router_aux_coef: float = 0.0
    # PPO only
    vf_clip: float = 0.2           # 0 disables
    gamma: float = 1.0
    lam: float = 0.95
    whiten_advantages: bool = True

    def __post_init__(self):
        for field in LOSS_CHOICES:
            why = invalid_choice(field, getattr(self, field))
            if why:
                raise ValueError(why)
        if self.router_aux_coef < 0:
            raise ValueError(f"LossConfig.router_aux_coef={self.router_aux_coef} must be >= 0")
        why = invalid_is_cap(self.is_cap)
        if why:
            raise ValueError(f"LossConfig.is_cap={self.is_cap} {why}")
        if not (math.isfinite(self.cispo_eps_high) and self.cispo_eps_high > 0):
            raise ValueError(f"LossConfig.cispo_eps_high={self.cispo_eps_high} must be finite "
                             "and > 0 (CISPO's weight cap is 1 + it)")


def invalid_is_cap(cap: float) -> Optional[str]:
    """None when `cap` is a valid LossConfig.is_cap (0, or finite and >= 1), else why not."""
    if isinstance(cap, bool) or not isinstance(cap, (int, float)):
        return "must be a number"
    if cap == 0:
        return None
    if not (math.isfinite(cap) and cap > 0):
        return "must be finite and > 0 (or 0 to disable)"
    if cap < 1:
        return ("is below 1: it would down-weight on-policy tokens (their weight is 1); "
                "caps are >= 1, typically 2")
    return None


@dataclasses.dataclass(frozen=True)
class StepOptions:
    """The static options of one update step (`grpo_step(state, batch, options)`,
    `ppo_step(actor_state, critic_state, batch, options)`); hashable, bound at jit time.

    cfg: the model; tx / lr_fn: the policy's (PPO: the actor's) optimizer and the lr it uses at
    an update count (lr_fn None: no "lr" metric); loss_cfg: the loss; micro_batches: gradient
    accumulation steps per update; num_minibatches x epochs: optimizer updates per call;
    remat: rematerialise the decoder layers (False / True, or "none", "full" or a policy
    name: models/remat.py); with_grads: return the pre-clip gradients.
    GRPO only: group_size (rows per prompt group) and shared_prompt_len (run each group's
    prompt once). PPO only: the critic's optimizer, lr and schedule (critic_minibatches /
    critic_epochs None: the actor's). lora_scale: see the field.
    """

    cfg: Any                                   # models.config.ModelConfig
    tx: Any                                    # optax.GradientTransformation
    loss_cfg: LossConfig = LossConfig()
    micro_batches: int = 1
    num_minibatches: int = 1
    epochs: int = 1
    remat: bool | str = False
    lr_fn: Optional[Callable] = None
    with_grads: bool = False
    group_size: int = 1
    shared_prompt_len: int = 0
    critic_tx: Any = None
    critic_lr_fn: Optional[Callable] = None
    critic_minibatches: Optional[int] = None
    critic_epochs: Optional[int] = None
    # LoRA (models/lora.py): alpha / r. Set, the policy state's params are the adapters and
    # its `frozen` the base model; the loss runs lora.compose(frozen, params, lora_scale).
    lora_scale: Optional[float] = None

    # PPO's historical keyword names for the actor's optimizer and lr (make_train_step).
    ALIASES = {"actor_tx": "tx", "actor_lr_fn": "lr_fn"}

    @classmethod
    def of(cls, **kw) -> "StepOptions":
        """StepOptions from keywords, accepting PPO's `actor_tx` / `actor_lr_fn`."""
        return cls(**{cls.ALIASES.get(k, k): v for k, v in kw.items()})


__all__ = ["LOSS_CHOICES", "LossConfig", "StepOptions", "invalid_choice", "invalid_is_cap"]
