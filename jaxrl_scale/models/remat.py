"""Rematerialisation of the decoder's layers: what each layer keeps from the forward for its
backward pass, traded against computing it again.

  "none"   every intermediate the backward needs is kept (the fastest, the most memory: per
           layer a few [B, T, F] and [B, N, T, T] tensors per micro-batch);
  "full"   only each layer's input is kept and its forward runs again in the backward
           (jax.checkpoint: the least memory, about one more forward of compute);
  a name of jax.checkpoint_policies (POLICIES): the layer is checkpointed with that policy,
           which keeps what it marks saveable and recomputes the rest. dots_saveable keeps
           every matmul's output; dots_with_no_batch_dims_saveable only the products with a
           weight (attention's scores and the elementwise ops are recomputed).

The decoder's weight matmuls are `decoder.dense`, a custom VJP, which JAX's dot policies do
not recognise as a dot (they test for the dot_general primitive): so `dense` names its output
DENSE and the dot policies here also keep what carries that name. Without it both dot policies
would silently recompute every projection.

Remat changes which values are stored, not the operations: tests/test_remat.py checks that
an update's gradients and params agree with the update without it to rounding. On CPU, XLA
removes the recomputation's barriers and merges it back into the forward, so a CPU compile's
memory analysis barely moves; what each setting keeps for the backward is measured
backend-independently by `residual_bytes` (jaxrl-train-bench prints both).
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np

NONE, FULL = "none", "full"
DENSE = "dense"
# The policies of jax.checkpoint_policies that take no arguments (the others, such as
# save_only_these_names, need names the decoder does not give its intermediates).
POLICIES = ("dots_saveable", "dots_with_no_batch_dims_saveable", "nothing_saveable",
            "everything_saveable", "checkpoint_dots", "checkpoint_dots_with_no_batch_dims")
CHOICES = (NONE, FULL) + POLICIES
_DOT_POLICIES = ("dots_saveable", "dots_with_no_batch_dims_saveable", "checkpoint_dots",
                 "checkpoint_dots_with_no_batch_dims")


def policy(remat: bool | str | None):
    """(checkpointed, policy): (False, None) for no remat, (True, None) for "full"
    (jax.checkpoint's default: keep nothing), (True, the policy) for a policy's name. True and
    False are "full" and "none" (the benchmarks' flag). ValueError for anything else."""
    if remat is None or remat is False or remat == NONE:
        return False, None
    if remat is True or remat == FULL:
        return True, None
    if not (isinstance(remat, str) and remat in POLICIES
            and hasattr(jax.checkpoint_policies, remat)):
        raise ValueError(f"remat={remat!r} is unknown: use one of {', '.join(CHOICES)} "
                         f"(or a bool)")
    cp = jax.checkpoint_policies
    pol = getattr(cp, remat)
    if remat in _DOT_POLICIES:
        pol = cp.save_from_both_policies(pol, cp.save_only_these_names(DENSE))
    return True, pol


def remat_block(fn: Callable, remat: bool | str | None) -> Callable:
    """`fn` (one decoder layer) under `remat`: unchanged for False / None / "none",
    jax.checkpoint(fn) for True / "full", jax.checkpoint(fn, policy=...) for a policy name."""
    wrap, pol = policy(remat)
    if not wrap:
        return fn
    return jax.checkpoint(fn) if pol is None else jax.checkpoint(fn, policy=pol)


def residual_bytes(fn: Callable, *args: Any) -> int:
    """Bytes of what jax.vjp(fn, *args) keeps for the backward (its residuals, the inputs it
    holds included), from shapes alone: nothing is computed or compiled. The activation
    memory a remat setting leaves, independent of the backend's compiler."""
    vjp = jax.eval_shape(lambda *a: jax.vjp(fn, *a)[1], *args)
    return int(sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
                   for x in jax.tree.leaves(vjp)))


__all__ = ["NONE", "FULL", "DENSE", "POLICIES", "CHOICES", "policy", "remat_block",
           "residual_bytes"]
