"""Qwen3-MoE mixture-of-experts MLP and the router load-balancing loss, as pure functions.

Shapes: B batch, T time, D hidden, E experts, F expert hidden (moe_intermediate_size),
k = num_experts_per_tok.

Per-layer params (stacked over L in the params pytree, decoder.py):
  router [D, E]; expert_gate / expert_up [E, D, F]; expert_down [E, F, D].

Routing is HF's Qwen3MoeTopKRouter: logits = x @ router (compute dtype), softmax in float32,
top-k, optionally renormalised over the k chosen (norm_topk_prob), cast back to the compute
dtype. Every token's output is sum_k weight_k * expert_k(x).

Dispatch choice: the experts run densely, every token through all E experts, and a [B, T, E]
combine matrix (the top-k weights, 0 elsewhere) weights their outputs. That is E / k times the
FLOPs of a token-dropping dispatch, but it has static shapes, no capacity factor (so it is
exactly HF's math: no token is ever dropped), and shards like a dense layer: with the E axis
of the expert weights on the `expert` mesh axis (sharding.py) each device computes its experts
for every token and the combine is one reduction over E. Fine for CPU-sized models and
tests (on XLA:CPU, jax.lax.ragged_dot over the k * B * T routed rows took 137 ms where the
dense [B*T, D] x [E, D, 2F] product took 88 ms, moe_cpu's shape at 3072 tokens); a sort/gather
(ragged) dispatch is the change to make for Qwen3-30B-A3B-scale FLOPs (E / k = 16).
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp

Array = jax.Array


def _dense(x, w, n_in=1):
    from jaxrl_scale.models.decoder import dense  # decoder imports this module
    return dense(x, w, n_in)


def router_logits(cfg, lp, x_BTD) -> Array:
    """Router logits [B, T, E] in float32 (the matmul runs in the compute dtype, as HF's)."""
    return _dense(x_BTD, lp["router"].astype(cfg.jnp_dtype)).astype(jnp.float32)


def combine_weights(logits_BTE, top_k: int, norm_topk_prob: bool) -> Array:
    """float32 [B, T, E]: each token's top-k routing probabilities at its chosen experts, 0
    elsewhere (HF Qwen3MoeTopKRouter; renormalised to sum to 1 when norm_topk_prob)."""
    probs_BTE = jax.nn.softmax(logits_BTE.astype(jnp.float32), axis=-1)
    top_BTk, idx_BTk = jax.lax.top_k(probs_BTE, top_k)
    if norm_topk_prob:
        top_BTk = top_BTk / jnp.sum(top_BTk, axis=-1, keepdims=True)
    onehot_BTkE = jax.nn.one_hot(idx_BTk, probs_BTE.shape[-1], dtype=jnp.float32)
    return jnp.einsum("btk,btke->bte", top_BTk, onehot_BTkE)


def moe_mlp(cfg, lp, x_BTD) -> tuple[Array, Array]:
    """(out_BTD, router_logits_BTE float32): the sparse MoE block (HF Qwen3MoeSparseMoeBlock),
    experts computed densely with a weighted combine (module docstring)."""
    dt = cfg.jnp_dtype
    logits_BTE = router_logits(cfg, lp, x_BTD)
    w_BTE = combine_weights(logits_BTE, cfg.num_experts_per_tok, cfg.norm_topk_prob).astype(dt)
    # All experts as one [D, 2, E, F] matmul and one contraction over (E, F): the fewest,
    # largest kernels, through decoder.dense's XLA:CPU-friendly backward.
    w_D2EF = lp["expert_gate_up"] if "expert_gate_up" in lp else fuse_gate_up(lp)
    gate_BTEF, up_BTEF = (h[:, :, 0] for h in jnp.split(_dense(x_BTD, w_D2EF.astype(dt)), 2, 2))
    h_BTEF = jax.nn.silu(gate_BTEF) * up_BTEF * w_BTE[..., None]
    return _dense(h_BTEF, lp["expert_down"].astype(dt), n_in=2), logits_BTE


def fuse_gate_up(lp) -> Array:
    """[D, 2, E, F] from expert_gate / expert_up [E, D, F] (decoder.unstack_layers stores it
    once for decoding as "expert_gate_up")."""
    return jnp.stack([lp["expert_gate"], lp["expert_up"]], axis=0).transpose(2, 0, 1, 3)


def load_balancing_loss(router_logits: Array | Sequence[Array], top_k: int,
                        weights: Any = None) -> Array:
    """Switch-Transformer load-balancing loss (Fedus et al. 2021, eqs. 4-6) with HF's top-k
    counting (transformers' `load_balancing_loss_func`): E * sum_e f_e * P_e, where over all
    tokens of all layers pooled, f_e is the mean number of top-k slots routed to expert e
    (so sum_e f_e = k) and P_e the mean router probability of e.

    router_logits: [..., E] (e.g. [L, B, T, E] from `decoder.forward_with_aux`) or a sequence
    of such arrays (pooled). weights: None (every token counts once), or per array a [...]
    float/bool array broadcastable to its leading axes (e.g. valid_BT for [L, B, T, E]: HF's
    attention_mask). Gradients flow through P only (the top-k counts are piecewise constant).
    """
    if isinstance(router_logits, (list, tuple)):
        logits_list = list(router_logits)
        weights_list = list(weights) if weights is not None else [None] * len(logits_list)
    else:
        logits_list, weights_list = [router_logits], [weights]
    E = logits_list[0].shape[-1]
    count_E = prob_E = total = 0.0
    for logits, w in zip(logits_list, weights_list):
        probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
        _, idx = jax.lax.top_k(probs, top_k)
        slots = jnp.sum(jax.nn.one_hot(idx, E, dtype=jnp.float32), axis=-2)   # [..., E]
        lead = probs.shape[:-1]
        w = jnp.ones(lead, jnp.float32) if w is None else jnp.broadcast_to(
            jnp.asarray(w, jnp.float32), lead)
        count_E = count_E + jnp.einsum("...e,...->e", slots, w)
        prob_E = prob_E + jnp.einsum("...e,...->e", probs, w)
        total = total + jnp.sum(w)
    total = jnp.maximum(total, 1e-9)
    return E * jnp.sum((count_E / total) * (prob_E / total))


__all__ = ["router_logits", "combine_weights", "moe_mlp", "fuse_gate_up",
           "load_balancing_loss"]
