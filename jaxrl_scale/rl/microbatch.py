"""Micro-batching and optimizer updates shared by the GRPO and PPO steps (rl/steps.py).

Shapes: B rows (responses), M micro-batches, U optimizer updates in one call.

Rows are prompt-major (group i is rows i*G .. i*G + G - 1); `split_rows` gives micro-batch m
the whole groups m, m + M, m + 2M, ..., so a group is never split and every micro-batch still
spans all data-parallel shards. `accumulate_grads` sums the micro-batches' gradients in a
`lax.scan` (the update does not depend on M), `apply_grads` makes one optimizer update, and
`multi_update` makes U of them over row splits and epochs.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import optax

from jaxrl_scale import optim
from jaxrl_scale.rl.state import TrainState

Array = jax.Array


def f32(x):
    """`x` as a float32 array."""
    return jnp.asarray(x, jnp.float32)


def split_rows(x: Array, parts: int, group: int = 1) -> Array:
    """[B, ...] -> [parts, B / parts, ...]; part m holds the row blocks of size ``group``
    numbered m, m + parts, m + 2 parts, ... (whole groups, in order)."""
    B = x.shape[0]
    x = x.reshape(B // (parts * group), parts, group, *x.shape[1:])
    return jnp.swapaxes(x, 0, 1).reshape(parts, B // parts, *x.shape[3:])


def sqnorm(tree) -> Array:
    """|tree|^2: the sum of squares of every leaf, in float32."""
    return sum(jnp.sum(jnp.square(f32(x))) for x in jax.tree_util.tree_leaves(tree))


def check_rows(B: int, parts: int, what: str, group: int = 1):
    """A ValueError naming `what` unless `parts` splits B rows into equal parts of whole groups."""
    if parts < 1 or B % (parts * group):
        per = f" groups of {group} rows" if group > 1 else " batch rows"
        raise ValueError(f"{what}={parts} must be >= 1 and divide the {B // group}{per}")


def accumulate_grads(loss_fn: Callable, params: Any, data: dict[str, Array],
                     micro_batches: int = 1, group_size: int = 1):
    """Sum the gradients of `loss_fn(params, micro_batch)` over M micro-batches in a lax.scan.

    Micro-batches hold whole groups of `group_size` consecutive rows (see `split_rows`).
    loss_fn returns (loss, (additive, token_sums, scale)): `additive` metrics are summed over
    micro-batches, `token_sums` are summed too (the caller divides by the token count), and
    `scale` turns the micro-batch's share of the gradient into the gradient of its own loss.
    Returns (grads float32, loss, additive, token_sums, grad_sqnorm_micro [M]).
    """
    M, G = int(micro_batches), int(group_size)
    B = jax.tree_util.tree_leaves(data)[0].shape[0]
    check_rows(B, M, "micro_batches", G)
    split = jax.tree.map(lambda x: split_rows(x, M, G), data)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def body(acc, mb):
        (loss, (additive, token_sums, scale)), g = grad_fn(params, mb)
        acc = jax.tree.map(lambda a, x: a + f32(x), acc, g)
        return acc, (loss, additive, token_sums, sqnorm(g) * jnp.square(scale))

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    grads, (loss_M, add_M, sums_M, sq_M) = jax.lax.scan(body, zeros, split)
    total = functools.partial(jnp.sum, axis=0)
    return grads, jnp.sum(loss_M), jax.tree.map(total, add_M), jax.tree.map(total, sums_M), sq_M


def _schedule_count(opt_state, default):
    """The step count the lr schedule will see in this update (optax ScaleByScheduleState)."""
    found = [x for x in jax.tree_util.tree_leaves(
        opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByScheduleState))
        if isinstance(x, optax.ScaleByScheduleState)]
    return found[0].count if found else default


def apply_grads(state: TrainState, grads: Any, tx: optax.GradientTransformation,
                lr_fn: Optional[Callable] = None) -> tuple[TrainState, dict[str, Array]]:
    """One optimizer update; logs the lr actually used and the skipped-update counter."""
    metrics = {}
    if lr_fn is not None:
        metrics["lr"] = f32(lr_fn(_schedule_count(state.opt_state, state.step)))
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    rng, _ = jax.random.split(state.rng)
    metrics["nonfinite_count"] = optim.nonfinite_count(opt_state)
    new_state = state.replace(params=params, opt_state=opt_state, step=state.step + 1, rng=rng)
    return new_state, metrics


def _skip_if_empty(one_update: Callable, mask_key: str) -> Callable:
    """`one_update` that keeps the old state when the minibatch's `mask_key` is all zero (with
    filter_zero_variance a minibatch can hold only filtered groups): its gradient is zero,
    but Adam's momentum would still move the params and the step count would advance. Adds
    the metric empty_minibatch (1.0 skipped, 0.0 applied)."""
    def update(state, mb):
        new, metrics = one_update(state, mb)
        empty = jnp.sum(mb[mask_key]) == 0
        state = jax.tree.map(lambda old, upd: jnp.where(empty, old, upd), state, new)
        return state, dict(metrics, empty_minibatch=f32(empty))
    return update


def multi_update(one_update: Callable, state: TrainState, data: dict[str, Array],
                  num_minibatches: int, epochs: int, group: int = 1,
                  mask_key: str = "mask_BS"):
    """`epochs` passes over `num_minibatches` row splits, one optimizer update each.

    The splits hold whole groups of `group` consecutive rows (`split_rows`: minibatch m has
    groups m, m + K, m + 2K, ...), so GRPO's groups, its shared prompts and the micro-batches
    inside each minibatch stay whole. U = 1 (the default protocol) returns that update's
    metrics; otherwise every metric gets a leading [U] axis in update order, and a minibatch
    whose data[mask_key] is all zero makes no update (`_skip_if_empty`; U = 1 needs no
    guard: the trainer makes no update for an all-filtered batch).
    """
    K, E = int(num_minibatches), int(epochs)
    if K == 1 and E == 1:
        return one_update(state, data)
    if E < 1:
        raise ValueError(f"epochs={E} must be >= 1")
    B = jax.tree_util.tree_leaves(data)[0].shape[0]
    check_rows(B, K, "num_minibatches", group)
    split = jax.tree.map(lambda x: split_rows(x, K, group), data)
    if mask_key in data:
        one_update = _skip_if_empty(one_update, mask_key)
    per_epoch = []
    for _ in range(E):
        state, m = jax.lax.scan(one_update, state, split)
        per_epoch.append(m)
    return state, jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0), *per_epoch)
