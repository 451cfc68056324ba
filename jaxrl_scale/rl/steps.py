"""GRPO and PPO update steps: micro-batched, batch-size-invariant, sharded by jit.

Shapes: B rows (responses), T time, S = T - 1 actions, V vocab, M micro-batches,
U optimizer updates in one call (num_minibatches * epochs).

Alignment. Every [B, T] batch field is aligned with `tokens_BT` (prompt left-padded, then the
response, right-padded): loss_mask_BT[b, t] = 1 when tokens_BT[b, t] is a response token, and
old_logp_BT[b, t] / ref_logp_BT[b, t] are log-probs of tokens_BT[b, t] (0 on prompt/padding).
The logits at position t predict token t + 1, so the losses live in the shifted action frame
of length S: logp_BS = log pi(tokens[:, 1:] | logits[:, :-1]), mask_BS = loss_mask_BT[:, 1:], ...

Batch-size invariance (docs/science.md, Batch-size invariance and the lr rules). The loss
normaliser (valid-token count for token-mean, row counts for the seq-mean modes) is computed
from the whole update batch before it is split, turned into per-token weights w with
sum(x * w) == aggregate(x, mask, agg), and every micro-batch contributes sum(x * w) over its
rows. Gradients are summed in a `lax.scan` (rl/microbatch.py), so the update does not depend
on the micro-batch count M. Rows are prompt-major (group i is rows i*G .. i*G + G - 1) and
micro-batch m holds whole groups m, m + M, m + 2M, ...: a group is never split (the
noise-scale estimator must see between-prompt variance), and every micro-batch still spans all
data-parallel shards.

Gradient noise (docs/science.md, Gradient noise scale). `actor_grad_sqnorm_micro` [M] holds
|g_m|^2 where g_m is the gradient of the loss micro-batch m alone would give under the same
aggregation (the "small batch" of the two-batch estimator, B_small = B / M);
`actor_grad_sqnorm` is |g|^2 of the whole batch (B_big = B) and `actor_grad_norm` its square
root, the pre-clip global norm (critic_* the same for PPO's critic). These are the names of
docs/api.md, Gradient-norm fields: the loop logs the step's metrics unrenamed.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from jaxrl_scale import sharding as shd
from jaxrl_scale.models.config import ModelConfig
from jaxrl_scale.models import lora, moe
from jaxrl_scale.models.decoder import (
    forward, hidden_states, logits_from_hidden, response_hidden_states)
from jaxrl_scale.rl import losses
from jaxrl_scale.rl.batch import RolloutBatch
from jaxrl_scale.rl.config import LossConfig, StepOptions  # noqa: F401 (LossConfig re-exported)
from jaxrl_scale.rl.microbatch import (accumulate_grads, apply_grads, check_rows, f32,
                                       multi_update, split_rows, sqnorm)
from jaxrl_scale.rl.state import TrainState, state_shardings
from jaxrl_scale.rl.value import critic_values

Array = jax.Array
sg = jax.lax.stop_gradient


# ----------------------------------------------------------------------------- normalisers


def _norm_parts(mask_BS: Array, agg: str, group_size: int = 1) -> tuple[Array, Array]:
    """(row_scale_B, denominator) with aggregate(x, m, agg, group_size) ==
    sum(x m row_scale) / denominator.

    The denominators are guarded exactly like `losses.aggregate` (max(., 1)), so all-masked
    rows and batches give 0, never NaN.
    """
    m_BS = f32(mask_BS)
    B, S = m_BS.shape
    count_B = jnp.sum(m_BS, axis=1)
    ones_B = jnp.ones([B], jnp.float32)
    if agg == "prompt-mean":   # each row scaled by 1 / its group's tokens; groups with tokens
        count_P = jnp.sum(count_B.reshape(-1, group_size), axis=1)
        return (jnp.repeat(1.0 / jnp.maximum(count_P, 1.0), group_size),
                jnp.maximum(jnp.sum(f32(count_P > 0)), 1.0))
    if agg == "token-mean":
        return ones_B, jnp.maximum(jnp.sum(m_BS), 1.0)
    if agg == "seq-mean-token-mean":
        return 1.0 / jnp.maximum(count_B, 1.0), jnp.maximum(jnp.sum(f32(count_B > 0)), 1.0)
    if agg == "seq-mean-token-sum":
        return ones_B, jnp.full([], float(B), jnp.float32)
    if agg == "seq-mean-token-sum-norm":
        return ones_B, jnp.full([], float(S), jnp.float32)
    raise ValueError(f"unknown aggregation mode={agg!r}; valid modes: {losses.AGG_MODES}")


def token_weights(mask_BS: Array, agg: str, group_size: int = 1) -> Array:
    """Per-token weights w_BS with sum(x * w) == losses.aggregate(x, mask, agg, group_size)
    for any x."""
    row_scale_B, denom = _norm_parts(mask_BS, agg, group_size)
    return f32(mask_BS) * row_scale_B[:, None] / denom


def _weighted_sum(loss_fn, *args, weights_BS, **kw):
    """sum(l_BT * w_BT) for a library loss that aggregates its per-token values.

    With the weights as its mask and "seq-mean-token-sum" a loss returns sum(l w) / B; times B
    recovers the weighted sum, so the library's loss math is reused unchanged.
    """
    loss, _ = loss_fn(*args, weights_BS, agg="seq-mean-token-sum", **kw)
    return loss * weights_BS.shape[0]


# ----------------------------------------------------------------------------- actor (policy)


def _action_frame(x_BT: Array) -> Array:
    return x_BT[:, 1:]


def _actor_data(batch, advantages_BS: Array, loss_cfg: LossConfig) -> dict[str, Array]:
    if loss_cfg.kl_coef and batch.ref_logp_BT is None:
        raise ValueError(f"LossConfig.kl_coef={loss_cfg.kl_coef} needs the reference policy's "
                         f"log-probs in batch.ref_logp_BT (see steps.score_tokens)")
    data = dict(tokens_BT=jnp.asarray(batch.tokens_BT, jnp.int32),
                valid_BT=jnp.asarray(batch.valid_BT, bool),
                mask_BS=f32(_action_frame(batch.loss_mask_BT)),
                old_logp_BS=f32(_action_frame(batch.old_logp_BT)),
                adv_BS=f32(advantages_BS))
    if batch.ref_logp_BT is not None:
        data["ref_logp_BS"] = f32(_action_frame(batch.ref_logp_BT))
    if batch.prox_logp_BT is not None:
        data["prox_logp_BS"] = f32(_action_frame(batch.prox_logp_BT))
    return data


def _check_trainer_logp(batch, o: StepOptions):
    """is_cap's trainer log-probs come from the loss's own forward pass only when that pass is
    at the pre-update params: one optimizer update per batch, or batch.prox_logp_BT."""
    if o.loss_cfg.is_cap and batch.prox_logp_BT is None and o.num_minibatches * o.epochs > 1:
        raise ValueError(f"LossConfig.is_cap={o.loss_cfg.is_cap} with num_minibatches="
                         f"{o.num_minibatches} x epochs={o.epochs} updates needs the trainer's "
                         f"pre-update log-probs in batch.prox_logp_BT (steps.score_tokens)")


def _grpo_advantages_BS(batch: RolloutBatch, group_size: int, estimator: str,
                        norm: str = "auto") -> Array:
    """Group-relative advantages of the outcome rewards, broadcast over each row's actions.

    Computed from the whole batch before any micro-batch split (groups are never split); a
    batch-level norm takes its std over the rows of the groups the loss sees (a group with
    any loss-mask token: a filtered group's zeros do not shrink it, and a group whose cut
    responses were masked still brings all G of its centred rewards)."""
    has_B = jnp.any(jnp.asarray(batch.loss_mask_BT) != 0, axis=1)
    valid_B = jnp.repeat(jnp.any(has_B.reshape(-1, group_size), axis=1), group_size)
    adv_B = losses.group_advantages(f32(batch.rewards_B), group_size, estimator=estimator,
                                    norm=norm, valid_N=valid_B)
    S = batch.tokens_BT.shape[1] - 1
    return jnp.broadcast_to(adv_B[:, None], (adv_B.shape[0], S))


def _policy_logits(cfg, params, mb, remat, shared_prompt_len, group_size):
    """(logits_BSV, action_tokens_BS, frame, router_aux): logits of the actions the loss can
    see, the slice `frame` that cuts every [B, S] field to the same columns, and for a
    mixture-of-experts model the router load-balancing loss over the rows' valid tokens
    (None for a dense one).

    shared_prompt_len = Tp > 0: rows in groups of group_size share their Tp prompt tokens, so
    the prompt runs once per group (decoder.response_hidden_states) and only the R = T - Tp
    response actions are scored: the action-frame columns before Tp - 1 are prompt tokens,
    outside every loss mask.
    """
    tokens_BT, valid_BT = mb["tokens_BT"], mb["valid_BT"]
    Tp = int(shared_prompt_len)
    kw = dict(remat=remat, return_router_logits=cfg.is_moe)

    def with_aux(out):  # (h, router load-balancing loss or None)
        if not cfg.is_moe:
            return out, None
        h, router_LBTE = out
        return h, moe.load_balancing_loss(router_LBTE, cfg.num_experts_per_tok, valid_BT)

    if Tp:
        h_BRD, aux = with_aux(response_hidden_states(cfg, params, tokens_BT, valid_BT,
                                                     prompt_len=Tp, group=group_size, **kw))
        return (logits_from_hidden(cfg, params, h_BRD), tokens_BT[:, Tp:],
                lambda x: x[:, Tp - 1:], aux)
    h_BTD, aux = with_aux(hidden_states(cfg, params, tokens_BT, valid_BT, **kw))
    return logits_from_hidden(cfg, params, h_BTD)[:, :-1], tokens_BT[:, 1:], lambda x: x, aux


def policy_terms(lc: LossConfig, logits_BSV: Array, actions_BS: Array, mb: dict):
    """(loss, additive metrics, token sums) of the actor from the logits of the actions: the
    clipped surrogate weighted by mb["w_BS"] (the batch's aggregation, rl/steps token_weights),
    the entropy bonus and the KL penalty; mb holds mask_BS, w_BS, old_logp_BS, adv_BS and
    optionally prox_logp_BS / ref_logp_BS, all in the frame of actions_BS. Shared by the padded
    update here and the packed one (rl/packed.py)."""
    clip = dict(clip_low=lc.clip_low, clip_high=lc.clip_high, dual_clip=lc.dual_clip or None)
    logp_BS = losses.token_logprobs(logits_BSV, actions_BS, lc.temperature)
    mask_BS, w_BS = mb["mask_BS"], mb["w_BS"]
    old_BS, adv_BS = mb["old_logp_BS"], mb["adv_BS"]

    # Decoupled PPO (off-policy rollouts) and truncated IS: with one update per batch the
    # params being differentiated are the pre-update (proximal, "trainer") policy, so its
    # log-probs are sg(logp_BS) of this very forward pass: no second scoring pass.
    prox_BS = mb.get("prox_logp_BS")
    if prox_BS is None and (lc.decoupled or lc.is_cap):
        prox_BS = sg(logp_BS)
    pg_kw = dict(clip, prox_logp_BT=prox_BS, is_cap=lc.is_cap or None,
                 ratio_level=lc.ratio_level, objective=lc.policy_loss,
                 cispo_eps_high=lc.cispo_eps_high)
    pg_loss = _weighted_sum(losses.policy_loss, logp_BS, old_BS, adv_BS, weights_BS=w_BS,
                            **pg_kw)
    _, pg_metrics = losses.policy_loss(sg(logp_BS), old_BS, adv_BS, mask_BS, agg=lc.agg,
                                       **pg_kw)
    scaled_BSV = logits_BSV / lc.temperature if lc.temperature > 0 else logits_BSV
    if not lc.entropy_coef:
        scaled_BSV = sg(scaled_BSV)
    ent_BS = losses.entropy_from_logits(scaled_BSV)
    loss = pg_loss - lc.entropy_coef * jnp.sum(ent_BS * w_BS)
    n_tok = jnp.sum(mask_BS)
    token_sums = {k: v * n_tok for k, v in pg_metrics.items()}
    token_sums["entropy"] = jnp.sum(sg(ent_BS) * mask_BS)
    # the sampler's log-probs (old_BS) vs the trainer's at the pre-update params (with
    # several updates per batch and no prox_logp_BT, later updates see moved params)
    trainer_BS = sg(logp_BS) if prox_BS is None else prox_BS
    token_sums["mismatch_kl"] = losses.mismatch_kl(trainer_BS, old_BS, mask_BS) * n_tok
    additive = {"pg_loss": sg(pg_loss)}
    if "ref_logp_BS" in mb:
        kl_BS = losses.kl_penalty(logp_BS, mb["ref_logp_BS"], lc.kl_kind)
        if lc.kl_coef:
            loss = loss + lc.kl_coef * jnp.sum(kl_BS * w_BS)
        token_sums["kl"] = jnp.sum(sg(kl_BS) * mask_BS)
    return loss, additive, token_sums


def _actor_loss_fn(cfg: ModelConfig, loss_cfg: LossConfig, remat: bool, global_denom: Array,
                   shared_prompt_len: int = 0, group_size: int = 1):
    lc = loss_cfg
    if lc.router_aux_coef and not cfg.is_moe:
        raise ValueError(f"LossConfig.router_aux_coef={lc.router_aux_coef} needs a "
                         f"mixture-of-experts model (ModelConfig.num_experts > 0); "
                         f"arch={cfg.arch!r} is dense")

    def loss_fn(params, mb):
        # of the full frame (Dr.GRPO's T); micro-batches hold whole groups (prompt-mean)
        _, local_denom = _norm_parts(mb["mask_BS"], lc.agg, group_size)
        logits_BSV, actions_BS, frame, router_aux = _policy_logits(
            cfg, params, mb, remat, shared_prompt_len, group_size)
        mb = {k: frame(v) if k.endswith("_BS") else v for k, v in mb.items()}
        loss, additive, token_sums = policy_terms(lc, logits_BSV, actions_BS, mb)
        if router_aux is not None:
            # Not a sum over tokens: each micro-batch's loss counts with its share of the
            # batch's valid tokens (aux_share_B), so M = 1 gives exactly the batch's aux loss
            # and M > 1 the token-weighted mean of the micro-batches'.
            router_aux = router_aux * jnp.sum(mb["aux_share_B"])
            if lc.router_aux_coef:
                loss = loss + lc.router_aux_coef * router_aux
            additive["router_aux_loss"] = sg(router_aux)
        additive["loss"] = sg(loss)
        scale = global_denom / local_denom
        return loss, (additive, token_sums, scale)

    return loss_fn


def _finish(additive, token_sums, n_tok, sq_M, grads):
    metrics = dict(additive)
    metrics.update({k: v / jnp.maximum(n_tok, 1.0) for k, v in token_sums.items()})
    sq = sqnorm(grads)
    metrics.update(grad_sqnorm_micro=sq_M, grad_sqnorm=sq, grad_norm=jnp.sqrt(sq),
                   tokens=n_tok)
    return metrics


def _policy_grads(params: Any, data: dict[str, Array], o: StepOptions, frozen: Any = None):
    """Gradients (float32) and metrics of the policy loss over one update batch (action frame),
    under o's model, loss, remat, micro-batches, groups and shared prompt.

    frozen (LoRA): the base params; `params` are then the adapters (composed with it at
    o.lora_scale), the only leaves the gradients (and so the optimizer) see."""
    cfg, lc = o.cfg, o.loss_cfg
    row_scale_B, denom = _norm_parts(data["mask_BS"], lc.agg, o.group_size)
    data = dict(data, w_BS=data["mask_BS"] * row_scale_B[:, None] / denom)
    if cfg.is_moe:  # each row's share of the valid tokens, for the router aux loss
        n_B = jnp.sum(f32(data["valid_BT"]), axis=1)
        data["aux_share_B"] = n_B / jnp.maximum(jnp.sum(n_B), 1.0)
    loss_fn = _actor_loss_fn(cfg, lc, o.remat, denom, o.shared_prompt_len, o.group_size)
    if frozen is not None:
        if o.lora_scale is None:
            raise ValueError("a train state with frozen (LoRA base) params needs "
                             "StepOptions.lora_scale (alpha / r)")
        full_loss_fn = loss_fn

        def loss_fn(adapters, mb):
            return full_loss_fn(lora.compose(frozen, adapters, o.lora_scale), mb)
    grads, _, additive, token_sums, sq_M = accumulate_grads(loss_fn, params, data,
                                                            o.micro_batches, o.group_size)
    return grads, _finish(additive, token_sums, jnp.sum(data["mask_BS"]), sq_M, grads)


def _optimizer_step(state: TrainState, grads: Any, metrics: dict, tx, lr_fn, with_grads: bool):
    """`apply_grads` with `tx` / `lr_fn`; its metrics (and with_grads the gradients) join the
    update's."""
    state, opt_metrics = apply_grads(state, grads, tx, lr_fn)
    metrics.update(opt_metrics)
    if with_grads:
        metrics["grads"] = grads
    return state, metrics


def _policy_update(state: TrainState, data: dict[str, Array], o: StepOptions):
    """One optimizer update of the policy (PPO: the actor) with o.tx and o.lr_fn."""
    grads, metrics = _policy_grads(state.params, data, o, state.frozen)
    return _optimizer_step(state, grads, metrics, o.tx, o.lr_fn, o.with_grads)


# Metrics of one network's update that both algorithms log: named actor_* / critic_* in the
# step itself (docs/api.md, Gradient-norm fields), except the actor's lr, tokens and
# empty_minibatch, which keep their own names.
_PER_NETWORK = ("grad_sqnorm_micro", "grad_sqnorm", "grad_norm", "lr", "nonfinite_count",
                "loss", "grads", "tokens", "empty_minibatch")


def _named(metrics: dict, who: str) -> dict:
    out = {}
    for k, v in metrics.items():
        if k in _PER_NETWORK:
            k = "lr" if (who == "actor" and k == "lr") else f"{who}_{k}"
            if who == "actor" and k in ("actor_tokens", "actor_empty_minibatch"):
                k = k[len("actor_"):]
        out[k] = v
    return out


def grpo_step(state: TrainState, batch: RolloutBatch, options: StepOptions):
    """One GRPO (or other group-advantage) policy update: (state, batch) -> (state, metrics).

    `options` (rl/config.StepOptions) holds every static setting; below, its fields.
    Advantages come from batch.rewards_B by loss_cfg.advantage (scaled by loss_cfg.adv_norm)
    over groups of `group_size` consecutive rows; micro-batches hold whole groups. Clipped
    surrogate (PPO clip with clip-higher and dual clip; or CISPO), optional KL to the frozen
    reference whose log-probs are in batch.ref_logp_BT, optional entropy bonus, aggregated by
    loss_cfg.agg over the whole batch. Default: one optimizer update for the whole batch
    (num_minibatches = epochs = 1). `lr_fn(count)` (e.g. partial(optim.current_lr, hparams,
    warmup_steps=...)) adds the lr used to the metrics; with_grads=True adds the pre-clip
    float32 gradient pytree as metrics["actor_grads"].

    shared_prompt_len = Tp > 0 runs each group's prompt once (the batch's first Tp columns
    must be the same in the G rows of every group, as rl/batch.rollout_batch lays them out):
    the same loss and gradients, computed on P * Tp + B * (T - Tp) tokens instead of B * T.
    Minibatches (num_minibatches > 1) hold whole groups too (microbatch.multi_update), so
    each is a GRPO batch of its own and the shared prompt works with them.
    """
    o = options
    _check_trainer_logp(batch, o)
    adv_BS = _grpo_advantages_BS(batch, o.group_size, o.loss_cfg.advantage, o.loss_cfg.adv_norm)
    data = _actor_data(batch, adv_BS, o.loss_cfg)
    update = functools.partial(_policy_update, o=o)
    state, metrics = multi_update(update, state, data, o.num_minibatches, o.epochs,
                                  o.group_size)
    return state, _named(metrics, "actor")


# ----------------------------------------------------------------------------- PPO


def score_tokens(cfg: ModelConfig, params: Any, tokens_BT: Array, valid_BT: Array, *,
                 temperature: float = 1.0, micro_batches: int = 1) -> Array:
    """log pi(tokens_BT[b, t] | prefix) aligned with tokens_BT (0 at t = 0), float32 [B, T].

    For the reference policy's ref_logp_BT (or re-scoring old log-probs). No gradient.
    """
    def one(_, mb):
        logits = forward(cfg, params, mb[0], mb[1])
        return None, losses.token_logprobs(logits[:, :-1], mb[0][:, 1:], temperature)

    check_rows(tokens_BT.shape[0], micro_batches, "micro_batches")
    split = (split_rows(tokens_BT, micro_batches), split_rows(valid_BT, micro_batches))
    _, logp_MbS = jax.lax.scan(one, None, split)
    logp_BS = jnp.swapaxes(logp_MbS, 0, 1).reshape(tokens_BT.shape[0], -1)
    return sg(jnp.pad(logp_BS, ((0, 0), (1, 0))))


def _critic_values_BS(cfg, params, tokens_BT, valid_BT, micro_batches):
    """Critic values of the states before each action, [B, S], micro-batched, no gradient."""
    def one(_, mb):
        return None, critic_values(cfg, params, mb[0], mb[1])[:, :-1]

    split = (split_rows(tokens_BT, micro_batches), split_rows(valid_BT, micro_batches))
    _, v_MbS = jax.lax.scan(one, None, split)
    return sg(jnp.swapaxes(v_MbS, 0, 1).reshape(tokens_BT.shape[0], -1))


def final_token_rewards(rewards_B: Array, mask_BS: Array) -> Array:
    """rewards_BS: the outcome reward on each row's last valid action, 0 elsewhere."""
    m_BS = f32(mask_BS)
    S = m_BS.shape[1]
    last_B = S - 1 - jnp.argmax(m_BS[:, ::-1] > 0, axis=1)
    has_B = jnp.any(m_BS > 0, axis=1)
    onehot_BS = jax.nn.one_hot(last_B, S, dtype=jnp.float32)
    return onehot_BS * jnp.where(has_B, f32(rewards_B), 0.0)[:, None]


def _critic_loss_fn(cfg, loss_cfg, remat, global_denom):
    def loss_fn(params, mb):
        v_BS = critic_values(cfg, params, mb["tokens_BT"], mb["valid_BT"], remat=remat)[:, :-1]
        mask_BS, w_BS = mb["mask_BS"], mb["w_BS"]
        args = (mb["old_values_BS"], mb["returns_BS"])
        loss = _weighted_sum(losses.value_loss, v_BS, *args, weights_BS=w_BS,
                             clip=loss_cfg.vf_clip or None)
        _, vm = losses.value_loss(sg(v_BS), *args, mask_BS, clip=loss_cfg.vf_clip or None,
                                  agg=loss_cfg.agg)
        n_tok = jnp.sum(mask_BS)
        _, local_denom = _norm_parts(mask_BS, loss_cfg.agg)
        return loss, ({"loss": sg(loss)}, {k: v * n_tok for k, v in vm.items()},
                      global_denom / local_denom)

    return loss_fn


def _critic_update(state: TrainState, data: dict[str, Array], o: StepOptions):
    """One optimizer update of PPO's critic with o.critic_tx and o.critic_lr_fn."""
    lc = o.loss_cfg
    row_scale_B, denom = _norm_parts(data["mask_BS"], lc.agg)
    data = dict(data, w_BS=data["mask_BS"] * row_scale_B[:, None] / denom)
    loss_fn = _critic_loss_fn(o.cfg, lc, o.remat, denom)
    grads, _, additive, token_sums, sq_M = accumulate_grads(loss_fn, state.params, data,
                                                            o.micro_batches)
    metrics = _finish(additive, token_sums, jnp.sum(data["mask_BS"]), sq_M, grads)
    return _optimizer_step(state, grads, metrics, o.critic_tx, o.critic_lr_fn, o.with_grads)


def ppo_advantages(cfg: ModelConfig, critic_params: Any, batch: RolloutBatch, loss_cfg: LossConfig,
                   micro_batches: int = 1) -> dict[str, Array]:
    """Critic values of the rollout, GAE advantages (whitened, mask-aware) and returns [B, S]."""
    mask_BS = f32(_action_frame(batch.loss_mask_BT))
    values_BS = _critic_values_BS(cfg, critic_params, batch.tokens_BT, batch.valid_BT,
                                  micro_batches) * mask_BS
    rewards_BS = final_token_rewards(batch.rewards_B, mask_BS)
    adv_BS, returns_BS = losses.gae(rewards_BS, values_BS, mask_BS, gamma=loss_cfg.gamma,
                                    lam=loss_cfg.lam)
    if loss_cfg.whiten_advantages:
        adv_BS = losses.masked_whiten(adv_BS, mask_BS)
    return dict(values_BS=values_BS, advantages_BS=sg(adv_BS), returns_BS=sg(returns_BS),
                mask_BS=mask_BS)


def ppo_step(actor_state: TrainState, critic_state: TrainState, batch: RolloutBatch,
             options: StepOptions):
    """PPO update of an actor and a critic from one rollout batch; `options` as grpo_step's
    (tx / lr_fn the actor's; critic_tx / critic_lr_fn / critic_minibatches / critic_epochs).

    The critic (trunk + value head, rl/value.py) scores the rollout before any update; GAE
    (Schulman et al. 2016) on the outcome reward at the final response token gives advantages
    (whitened over the batch) and returns. The actor takes the clipped-surrogate update of
    `grpo_step`; the critic minimises the clipped value loss. Separate params and optimizers
    (so separate lr rules); per-network metrics are named actor_* / critic_* (the actor's lr: lr).

    The critic has its own schedule: `critic_minibatches` x `critic_epochs` optimizer updates
    per rollout (None: the actor's num_minibatches / epochs), because its gradient noise, and
    so its critical batch, differs from the actor's (docs/science.md, Gradient noise scale).
    Both read the same pre-update values for GAE, so the actor's update does not depend on the
    critic's schedule.
    Returns (actor_state, critic_state, metrics).
    """
    o = options
    if o.critic_tx is None:
        raise ValueError("ppo_step needs StepOptions.critic_tx (the critic's optimizer)")
    if actor_state.frozen is not None or critic_state.frozen is not None:
        raise ValueError("ppo_step trains full networks; LoRA (a state with frozen params) "
                         "is GRPO's (grpo_step)")
    if o.loss_cfg.adv_norm != "auto":
        raise ValueError(f"LossConfig.adv_norm={o.loss_cfg.adv_norm!r} scales GRPO's group "
                         "advantages; PPO's GAE advantages are whitened (whiten_advantages)")
    _check_trainer_logp(batch, o)
    gae_out = ppo_advantages(o.cfg, critic_state.params, batch, o.loss_cfg, o.micro_batches)
    actor_data = _actor_data(batch, gae_out["advantages_BS"], o.loss_cfg)
    critic_data = dict(tokens_BT=actor_data["tokens_BT"], valid_BT=actor_data["valid_BT"],
                       mask_BS=gae_out["mask_BS"], old_values_BS=gae_out["values_BS"],
                       returns_BS=gae_out["returns_BS"])
    # one response per prompt: GRPO's groups and shared prompt are not the actor's
    actor_update = functools.partial(_policy_update, o=dataclasses.replace(
        o, group_size=1, shared_prompt_len=0))
    critic_update = functools.partial(_critic_update, o=o)
    actor_state, am = multi_update(actor_update, actor_state, actor_data,
                                    o.num_minibatches, o.epochs)
    critic_state, cm = multi_update(
        critic_update, critic_state, critic_data,
        o.num_minibatches if o.critic_minibatches is None else o.critic_minibatches,
        o.epochs if o.critic_epochs is None else o.critic_epochs)
    metrics = {**_named(am, "actor"), **_named(cm, "critic")}
    mask_BS = gae_out["mask_BS"]
    metrics["value_mean"] = jnp.sum(gae_out["values_BS"] * mask_BS) / jnp.maximum(
        jnp.sum(mask_BS), 1.0)
    metrics["return_mean"] = jnp.sum(gae_out["returns_BS"] * mask_BS) / jnp.maximum(
        jnp.sum(mask_BS), 1.0)
    return actor_state, critic_state, metrics


# ----------------------------------------------------------------------------- jit + shardings


def _under_mesh(fn: Callable, mesh) -> Callable:
    """fn traced with `mesh` as the context mesh, however it is lowered (a call, or
    .jitted.lower as the training loop does): models/moe.py's expert-parallel dispatch reads it."""
    @functools.wraps(fn)
    def wrapped(*args):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return fn(*args)
    return wrapped


def make_train_step(step_fn: Callable, states: TrainState | tuple[TrainState, ...] | None = None,
                    *, mesh=None, donate: bool = True, compiler_options: Optional[dict] = None,
                    options: Optional[StepOptions] = None, **fields) -> Callable:
    """jit(step_fn) with explicit in/out shardings and donated train state(s).

    `states`: the state (GRPO) or (actor, critic) (PPO) that the step takes first, as arrays
    or ShapeDtypeStructs; only used to derive shardings from the rule table (may be None
    without a mesh). The batch is split over data x fsdp, metrics come back replicated. The
    returned function takes (*states, batch) and checks that the batch rows divide over the
    data axes first (a clear ValueError naming both numbers). The step's static options are
    `options`, or built from StepOptions `fields` (cfg, tx, loss_cfg, micro_batches, ...;
    StepOptions.of); compiler_options go to jax.jit (e.g. a lower XLA optimisation level to
    compile tests faster).
    """
    if options is None:
        options = StepOptions.of(**fields)
    elif fields:
        raise ValueError(f"make_train_step: pass options or fields, not both ({sorted(fields)})")
    if states is None:
        if mesh is not None:
            raise ValueError("make_train_step needs the state(s) to derive shardings on a mesh")
        n = 2 if step_fn is ppo_step else 1
    else:
        states = states if isinstance(states, tuple) else (states,)
        n = len(states)
    fn = functools.partial(step_fn, options=options)
    if mesh is not None and shd.EXPERT_AXIS in mesh.axis_names:
        fn = _under_mesh(fn, mesh)
    donate_argnums = tuple(range(n)) if donate else ()
    if mesh is None:
        jitted = jax.jit(fn, donate_argnums=donate_argnums, compiler_options=compiler_options)
    else:
        st_sh = tuple(state_shardings(mesh, s) for s in states)
        jitted = jax.jit(fn, in_shardings=(*st_sh, shd.batch_sharding(mesh)),
                         out_shardings=(*st_sh, shd.replicated(mesh)),
                         donate_argnums=donate_argnums, compiler_options=compiler_options)

    def train_step(*args):
        if mesh is not None:
            shd.check_batch_divisible(mesh, args[-1])
        return jitted(*args)

    train_step.jitted, train_step.options = jitted, options
    return train_step


__all__ = [
    "LossConfig", "StepOptions", "RolloutBatch", "token_weights", "accumulate_grads",
    "apply_grads", "grpo_step", "score_tokens",
    "final_token_rewards", "ppo_advantages", "ppo_step", "make_train_step",
]
