"""Packed rows: several sequences laid end to end in one row of a fixed length.

`segment_ids_BT` numbers the sequences of each row 1, 2, ... (0 on the padding after the last
one). A packed token attends only to earlier tokens of its own sequence, and its RoPE position
counts only those: the same hidden states as the sequence alone in a row of its own
(tests/test_packing.py). Sequences are contiguous within a row.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def segment_positions(segment_ids_BT: jax.Array) -> jax.Array:
    """int32 [B, T]: each token's index within its sequence (0 at its first token)."""
    seg_BT = jnp.asarray(segment_ids_BT)
    t_BT = jnp.broadcast_to(jnp.arange(seg_BT.shape[1], dtype=jnp.int32), seg_BT.shape)
    prev_BT = jnp.pad(seg_BT[:, :-1], ((0, 0), (1, 0)), constant_values=-1)
    start_BT = jnp.where(seg_BT != prev_BT, t_BT, 0)   # a sequence's first column, else 0
    return t_BT - jax.lax.cummax(start_BT, axis=1)


def segment_mask(segment_ids_BT: jax.Array) -> jax.Array:
    """bool [B, T, S]: causal, within one sequence, never to or from padding."""
    seg_BT = jnp.asarray(segment_ids_BT)
    T = seg_BT.shape[1]
    same_BTS = (seg_BT[:, :, None] == seg_BT[:, None, :]) & (seg_BT[:, None, :] > 0)
    return same_BTS & jnp.tril(jnp.ones((T, T), bool))[None]


__all__ = ["segment_mask", "segment_positions"]
