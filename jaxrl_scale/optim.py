"""Optimizer builders and batch-size scaling rules for Adam (docs/science.md, Batch-size
invariance and the lr rules).

Batch everywhere here means retained *responses* per optimizer update (GRPO: P * G;
PPO: P), not prompts: configurations with equal P * G behave alike.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from jaxrl_scale.lr_rules import ADAM_RULES, LR_RULES  # re-exported: callers import them here


@dataclasses.dataclass(frozen=True)
class AdamHParams:
    """Adam hyper-parameters, the unit the batch-scaling rules act on."""

    lr: float
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8


def _kappa(batch, base_batch) -> float:
    if not batch > 0 or not base_batch > 0:
        raise ValueError(f"batch and base_batch must be positive response counts, got "
                         f"batch={batch}, base_batch={base_batch}")
    return float(batch) / float(base_batch)


def scaled_lr(base_lr: float, batch: int, base_batch: int, rule: str) -> float:
    """Learning rate for `batch` given one tuned at `base_batch`, kappa = batch / base_batch.

      fixed:  lr0            linear: lr0 * kappa (Goyal et al. 2017, SGD)
      sqrt:   lr0 * sqrt(kappa)  (Adam; Malladi et al. 2022; the source's re-tuning rule)
      tuned:  lr0, where lr0 was tuned at `batch` itself (the sweep's per-batch re-tuning
              option: the source's recommendation, against which the rules are measured)

    batch and base_batch count responses per update (P * G for GRPO), not prompts.
    """
    if rule not in LR_RULES:
        raise ValueError(f"unknown lr scaling rule={rule!r}; valid rules: {LR_RULES}")
    if not base_lr > 0:
        raise ValueError(f"base_lr must be positive, got base_lr={base_lr}")
    kappa = _kappa(batch, base_batch)
    if rule in ("fixed", "tuned"):
        return float(base_lr)
    if rule == "linear":
        return float(base_lr) * kappa
    return float(base_lr) * math.sqrt(kappa)


def scaled_adam_hparams(base: AdamHParams, batch: int, base_batch: int,
                        rule: str) -> AdamHParams:
    """Adam hyper-parameters for `batch` given `base` tuned at `base_batch`.

    rule "malladi" is the SDE scaling rule for Adam (Malladi, Lyu, Panigrahi & Arora 2022,
    "On the SDEs and Scaling Rules for Adaptive Gradient Algorithms"), kappa = batch/base_batch:
      lr -> sqrt(kappa) lr,  b1 -> 1 - kappa (1 - b1),  b2 -> 1 - kappa (1 - b2),
      eps -> eps / sqrt(kappa).
    "fixed", "linear", "sqrt", "tuned" scale only lr (see `scaled_lr`). Batches count responses
    per update (P * G), not prompts.
    """
    if rule not in ADAM_RULES:
        raise ValueError(f"unknown Adam scaling rule={rule!r}; valid rules: {ADAM_RULES}")
    if rule != "malladi":
        return dataclasses.replace(base, lr=scaled_lr(base.lr, batch, base_batch, rule))
    if not base.lr > 0:
        raise ValueError(f"base lr must be positive, got lr={base.lr}")
    kappa = _kappa(batch, base_batch)
    b1 = 1.0 - kappa * (1.0 - base.b1)
    b2 = 1.0 - kappa * (1.0 - base.b2)
    for name, old, new in (("b1", base.b1, b1), ("b2", base.b2, b2)):
        if not new > 1e-12:  # tolerance: kappa = 1/(1-beta) lands on +2e-16, not 0

            raise ValueError(
                f"malladi rule: {name}={old} scaled by kappa={kappa:g} (batch={batch}, "
                f"base_batch={base_batch}) gives {name}={new:g} <= 0; the rule only holds for "
                f"kappa < 1/(1-{name}) = {1.0 / (1.0 - old):g}")
    return AdamHParams(lr=base.lr * math.sqrt(kappa), b1=b1, b2=b2,
                       eps=base.eps / math.sqrt(kappa))


def current_lr(hparams: AdamHParams, step, warmup_steps: int):
    """Learning rate used by the update with 0-based index `step` (linear warmup, then flat).

    lr * min(1, (step + 1) / warmup_steps): the first update already moves (at lr/warmup),
    since every update costs a full rollout batch. Works on Python ints and traced arrays.
    """
    if warmup_steps <= 0:
        return hparams.lr if isinstance(step, int) else jnp.full([], hparams.lr, jnp.float32)
    if isinstance(step, int):
        return hparams.lr * min(1.0, (step + 1) / warmup_steps)
    frac = (jnp.asarray(step, jnp.float32) + 1.0) / warmup_steps
    return hparams.lr * jnp.minimum(1.0, frac)


class SkipNonfiniteState(NamedTuple):
    """State of `skip_nonfinite_updates`: the wrapped state and the total of skipped updates."""

    inner_state: Any
    nonfinite_count: jax.Array


def _all_finite(tree) -> jax.Array:
    leaves = jax.tree_util.tree_leaves(tree)
    if not leaves:
        return jnp.array(True)
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def skip_nonfinite_updates(inner: optax.GradientTransformation) -> optax.GradientTransformation:
    """Wraps `inner` so that a step whose gradients or updates are not all finite is dropped.

    A dropped step emits zero updates (params stay bit-identical), keeps the inner state
    (Adam moments and step count) unchanged, and increments `nonfinite_count`. Unlike
    optax.apply_if_finite it never gives up and applies a NaN after many failures.
    """

    def init_fn(params):
        return SkipNonfiniteState(inner.init(params), jnp.zeros([], jnp.int32))

    def update_fn(updates, state, params=None):
        new_updates, new_inner = inner.update(updates, state.inner_state, params)
        ok = _all_finite(updates) & _all_finite(new_updates)
        new_updates = jax.tree_util.tree_map(
            lambda u: jnp.where(ok, u, jnp.zeros_like(u)), new_updates)
        new_inner = jax.tree_util.tree_map(
            lambda new, old: jnp.where(ok, new, old), new_inner, state.inner_state)
        count = state.nonfinite_count + jnp.where(ok, 0, 1).astype(jnp.int32)
        return new_updates, SkipNonfiniteState(new_inner, count)

    return optax.GradientTransformation(init_fn, update_fn)


def make_optimizer(hparams: AdamHParams, *, warmup_steps: int = 0,
                   max_grad_norm: Optional[float] = 1.0, weight_decay: float = 0.0,
                   skip_nonfinite: bool = True,
                   weight_decay_mask: Any = None) -> optax.GradientTransformation:
    """clip_by_global_norm(max_grad_norm) -> Adam / AdamW (Loshchilov & Hutter 2019) with the
    `current_lr` linear-warmup schedule, wrapped in `skip_nonfinite_updates`.

    max_grad_norm=None disables clipping; weight_decay=0 uses plain Adam (no params needed);
    `weight_decay_mask` is passed to optax.adamw (e.g. to exempt norms and biases).
    """
    if not hparams.lr > 0:
        raise ValueError(f"lr must be positive, got lr={hparams.lr}")
    if max_grad_norm is not None and not max_grad_norm > 0:
        raise ValueError(f"max_grad_norm must be positive or None, got {max_grad_norm}")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")

    def schedule(count):
        return current_lr(hparams, count, warmup_steps)

    parts = []
    if max_grad_norm is not None:
        parts.append(optax.clip_by_global_norm(max_grad_norm))
    if weight_decay:
        parts.append(optax.adamw(schedule, b1=hparams.b1, b2=hparams.b2, eps=hparams.eps,
                                 weight_decay=weight_decay, mask=weight_decay_mask))
    else:
        parts.append(optax.adam(schedule, b1=hparams.b1, b2=hparams.b2, eps=hparams.eps))
    tx = optax.chain(*parts)
    return skip_nonfinite_updates(tx) if skip_nonfinite else tx


def nonfinite_count(opt_state) -> jax.Array:
    """Total skipped (non-finite) updates found anywhere in `opt_state`, int32 scalar.

    Looks for a `SkipNonfiniteState` or an optax `ApplyIfFiniteState` at any depth (so
    wrapping in optax.chain, MultiSteps or a dict still works); 0 if there is none.
    """
    kinds = (SkipNonfiniteState, optax.ApplyIfFiniteState)
    found = [x for x in jax.tree_util.tree_leaves(opt_state, is_leaf=lambda x: isinstance(x, kinds))
             if isinstance(x, kinds)]
    total = jnp.zeros([], jnp.int32)
    for s in found:
        c = s.nonfinite_count if isinstance(s, SkipNonfiniteState) else s.total_notfinite
        total = total + jnp.asarray(c, jnp.int32)
    return total


__all__ = [
    "AdamHParams", "LR_RULES", "ADAM_RULES", "scaled_lr", "scaled_adam_hparams",
    "make_optimizer", "skip_nonfinite_updates", "SkipNonfiniteState", "nonfinite_count",
    "current_lr",
]
