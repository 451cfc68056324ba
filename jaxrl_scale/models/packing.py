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


def segment_attention(segment_ids_BT: jax.Array, attention, window: int = 0):
    """attend(q_BTNH, k_BTKH, v_BTKH) over packed rows with `attention(q, k, v, mask)`.

    window = C > 0 (dividing T, at least the longest sequence): a token's sequence lies within
    its C-column block and the one before, so each block of queries attends to those 2C keys
    only: T * 2C scores per row instead of T * T (a long packed row is then no dearer per
    token than the padded rows it replaces). The scores kept are the same either way."""
    seg_BT = jnp.asarray(segment_ids_BT)
    B, T = seg_BT.shape
    if not window or window >= T:
        mask_BTS = segment_mask(seg_BT)
        return lambda q, k, v: attention(q, k, v, mask_BTS)
    C = int(window)
    if T % C:
        raise ValueError(f"packed rows of {T} tokens do not split into blocks of {C}")
    nb = T // C

    def two_blocks(x_BT):   # [B, T, ...] -> [B * nb, 2C, ...]: the block before, then its own
        x = x_BT.reshape(B, nb, C, *x_BT.shape[2:])
        prev = jnp.concatenate([jnp.zeros_like(x[:, :1]), x[:, :-1]], axis=1)
        return jnp.concatenate([prev, x], axis=2).reshape(B * nb, 2 * C, *x_BT.shape[2:])

    seg_q = seg_BT.reshape(B * nb, C)
    seg_k = two_blocks(seg_BT)   # the first block's "before" is padding (segment 0)
    t_q = jnp.arange(C)[:, None] + C                    # columns within the 2C window
    t_k = jnp.arange(2 * C)[None, :]
    mask = (seg_q[:, :, None] == seg_k[:, None, :]) & (seg_k[:, None, :] > 0) & (t_k <= t_q)

    def attend(q_BTNH, k_BTKH, v_BTKH):
        out = attention(q_BTNH.reshape(B * nb, C, *q_BTNH.shape[2:]), two_blocks(k_BTKH),
                        two_blocks(v_BTKH), mask)
        return out.reshape(B, T, *q_BTNH.shape[2:])

    return attend


__all__ = ["segment_attention", "segment_mask", "segment_positions"]
