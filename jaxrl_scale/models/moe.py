"""Qwen3-MoE mixture-of-experts MLP and the router load-balancing loss, as pure functions.

Shapes: B batch, T time, D hidden, E experts, F expert hidden (moe_intermediate_size),
k = num_experts_per_tok.

Per-layer params (stacked over L in the params pytree, decoder.py):
  router [D, E]; expert_gate / expert_up [E, D, F]; expert_down [E, F, D].

Routing is HF's Qwen3MoeTopKRouter: logits = x @ router (compute dtype), softmax in float32,
top-k, optionally renormalised over the k chosen (norm_topk_prob), cast back to the compute
dtype. Every token's output is sum_k weight_k * expert_k(x).

Dispatch (ModelConfig.moe_dispatch; `dispatch_mode` resolves "auto" per call, from E / k and
the routed rows per expert):
- "dense": every token through all E experts, combined with a [B, T, E] weight matrix (the
  top-k weights, 0 elsewhere). E / k times the routed FLOPs, but static shapes and the fewest,
  largest kernels: the faster choice at few rows per expert (decode steps).
- "sparse" (dropless): the k * B * T routed rows are sorted by expert and each expert's rows
  padded up to a multiple of a tile of `tile_rows` rows; the tiles run as one batched matmul
  against their expert's weights, and the rows come back through the inverse map, weighted and
  summed over k. No capacity factor, so no token is ever dropped: the buffer's static size is
  the worst case, M + E (m - 1) rows for M = k B T routed rows and tiles of m. Every row gather
  has a gather as its gradient (`_rows`), not a scatter-add.
  jax.lax.ragged_dot would be the natural grouped matmul, but XLA:CPU lowers it to a dense
  masked product over all E groups: [16384, 192] x [128, 192, 64] took 1.39 s where one
  [16384, 192] x [192, 64] product took 2.9 ms, and the MoE MLP forward at 128 experts on 256
  tokens took 3.66 s with it against 0.35 s with the tiles (results/moe_dispatch/). XLA:GPU
  in jax 0.10 does the same without a cuDNN grouped-GEMM fusion (reported in
  marin-community/marin#7012). `grouped_matmul(..., impl="ragged_dot")` keeps it as the test
  reference and for a backend with a native kernel.
- Expert parallelism: with a context mesh that has an `expert` axis (jax.set_mesh, or
  jax.sharding.use_abstract_mesh as rl.steps.make_train_step traces the update), sparse
  dispatch runs under shard_map: each device gathers the tokens of its expert group
  (all_gather over `expert`), runs the routed rows of its own E / X experts, and the outputs
  are summed back to the tokens' devices (psum_scatter). jax.lax.ragged_all_to_all would send
  each row only where its experts live, but XLA:CPU has no ragged-all-to-all ("UNIMPLEMENTED"
  on jax 0.10.2). This form is dropless with static shapes and keeps each device's expert
  weights and optimizer state at 1 / X; its tile buffer is sized for the worst case (every
  row of the group routed to its experts), so its matmul work is not 1 / X.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxrl_scale.models.config import MOE_DISPATCHES as DISPATCHES
from jaxrl_scale.sharding import BATCH_AXES, EXPERT_AXIS

Array = jax.Array
# "auto" picks sparse when E / k and the mean routed rows per expert, k N / E for N tokens,
# both reach these, per backend. Measured on XLA:CPU by experiments/moe_bench.py
# (results/moe_dispatch/README.md): sparse was faster for GRPO updates at E / k = 16 and 4
# (64 and 256 rows per expert), dense for decode steps of 16 rows (1 and 4 rows per expert);
# E / k < 4 and 4..64 rows per expert are untested, so the thresholds sit at the lowest
# measured win and between the two row counts. Other backends are unmeasured and take the
# CPU's thresholds.
SPARSE_MIN_EXPERT_RATIO = {"cpu": 4.0}
SPARSE_MIN_ROWS_PER_EXPERT = {"cpu": 16.0}


def _dense(x, w, n_in=1):
    from jaxrl_scale.models.decoder import dense  # decoder imports this module
    return dense(x, w, n_in)


def router_logits(cfg, lp, x_BTD) -> Array:
    """Router logits [B, T, E] in float32 (the matmul runs in the compute dtype, as HF's)."""
    return _dense(x_BTD, lp["router"].astype(cfg.jnp_dtype)).astype(jnp.float32)


def route(logits_BTE, top_k: int, norm_topk_prob: bool) -> tuple[Array, Array]:
    """(weights_BTk float32, experts_BTk int32): each token's top-k routing probabilities and
    the experts they choose (HF Qwen3MoeTopKRouter; renormalised to sum to 1 when
    norm_topk_prob)."""
    probs_BTE = jax.nn.softmax(logits_BTE.astype(jnp.float32), axis=-1)
    top_BTk, idx_BTk = jax.lax.top_k(probs_BTE, top_k)
    if norm_topk_prob:
        top_BTk = top_BTk / jnp.sum(top_BTk, axis=-1, keepdims=True)
    return top_BTk, idx_BTk.astype(jnp.int32)


def combine_weights(logits_BTE, top_k: int, norm_topk_prob: bool) -> Array:
    """float32 [B, T, E]: `route`'s weights at the chosen experts, 0 elsewhere."""
    top_BTk, idx_BTk = route(logits_BTE, top_k, norm_topk_prob)
    onehot_BTkE = jax.nn.one_hot(idx_BTk, logits_BTE.shape[-1], dtype=jnp.float32)
    return jnp.einsum("btk,btke->bte", top_BTk, onehot_BTkE)


def dispatch_mode(cfg, n_tokens: int, backend: str | None = None) -> str:
    """"dense" or "sparse" for a call on n_tokens tokens: cfg.moe_dispatch, with "auto"
    decided by E / k and the mean routed rows per expert on this backend (thresholds above)."""
    if cfg.moe_dispatch != "auto":
        return cfg.moe_dispatch
    backend = backend or jax.default_backend()
    E, k = cfg.num_experts, cfg.num_experts_per_tok
    min_ratio = SPARSE_MIN_EXPERT_RATIO.get(backend, SPARSE_MIN_EXPERT_RATIO["cpu"])
    min_rows = SPARSE_MIN_ROWS_PER_EXPERT.get(backend, SPARSE_MIN_ROWS_PER_EXPERT["cpu"])
    return "sparse" if E / k >= min_ratio and k * n_tokens / E >= min_rows else "dense"


def moe_mlp(cfg, lp, x_BTD) -> tuple[Array, Array]:
    """(out_BTD, router_logits_BTE float32): the sparse MoE block (HF Qwen3MoeSparseMoeBlock),
    with the experts run by `dispatch_mode` (module docstring)."""
    dt = cfg.jnp_dtype
    logits_BTE = router_logits(cfg, lp, x_BTD)
    B, T, D = x_BTD.shape
    if dispatch_mode(cfg, B * T) == "sparse":
        w_BTk, idx_BTk = route(logits_BTE, cfg.num_experts_per_tok, cfg.norm_topk_prob)
        k = w_BTk.shape[-1]
        y_ND = routed_experts_on_mesh(
            x_BTD.reshape(B * T, D), w_BTk.reshape(B * T, k).astype(dt),
            idx_BTk.reshape(B * T, k), gate_up_ED2F(lp).astype(dt),
            lp["expert_down"].astype(dt))
        return y_ND.reshape(B, T, D), logits_BTE
    w_BTE = combine_weights(logits_BTE, cfg.num_experts_per_tok, cfg.norm_topk_prob).astype(dt)
    # All experts as one [D, 2, E, F] matmul and one contraction over (E, F): the fewest,
    # largest kernels, through decoder.dense's XLA:CPU-friendly backward.
    w_D2EF = fuse_gate_up(lp)
    gate_BTEF, up_BTEF = (h[:, :, 0] for h in jnp.split(_dense(x_BTD, w_D2EF.astype(dt)), 2, 2))
    h_BTEF = jax.nn.silu(gate_BTEF) * up_BTEF * w_BTE[..., None]
    return _dense(h_BTEF, lp["expert_down"].astype(dt), n_in=2), logits_BTE


def fuse_gate_up(lp) -> Array:
    """[D, 2, E, F] from expert_gate / expert_up [E, D, F] (decoder.unstack_layers stores it
    once for decoding as "expert_gate_up"; from "expert_gate_up_ED2F" when that is stored)."""
    if "expert_gate_up" in lp:
        return lp["expert_gate_up"]
    if "expert_gate_up_ED2F" in lp:
        E, D, F2 = lp["expert_gate_up_ED2F"].shape
        return lp["expert_gate_up_ED2F"].reshape(E, D, 2, F2 // 2).transpose(1, 2, 0, 3)
    return jnp.stack([lp["expert_gate"], lp["expert_up"]], axis=0).transpose(2, 0, 1, 3)


def gate_up_ED2F(lp) -> Array:
    """[E, D, 2F]: gate then up along the last axis, the sparse dispatch's layout
    (decoder.unstack_layers stores it for decoding as "expert_gate_up_ED2F")."""
    if "expert_gate_up_ED2F" in lp:
        return lp["expert_gate_up_ED2F"]
    if "expert_gate_up" in lp:
        D, _, E, F = lp["expert_gate_up"].shape
        return lp["expert_gate_up"].transpose(2, 0, 1, 3).reshape(E, D, 2 * F)
    return jnp.concatenate([lp["expert_gate"], lp["expert_up"]], axis=-1)


def decode_layout(cfg, lp) -> dict[str, Array]:
    """The fused expert gate/up weights a decode step reads: the sparse layout under
    moe_dispatch="sparse", else the dense one (auto's choice for decode steps of up to
    E * SPARSE_MIN_ROWS_PER_EXPERT / k rows; a call that resolves otherwise, a prefill,
    converts it once)."""
    if cfg.moe_dispatch == "sparse":
        return {"expert_gate_up_ED2F": gate_up_ED2F(lp)}
    return {"expert_gate_up": fuse_gate_up(lp)}


# ----------------------------------------------------------------------------- sparse dispatch

class SparseLayout(NamedTuple):
    """Where the M routed rows sit in the expert-sorted buffer of R = nt * m rows (nt tiles of
    m rows, every tile one expert's; each expert's rows padded to whole tiles)."""
    dst_M: Array          # int32 [M]: buffer row of routed row j; R when routed elsewhere
    src_R: Array          # int32 [R]: routed row held by buffer row r; M on padding rows
    tiles_E: Array        # int32 [E]: tiles of each expert (in expert order)
    tile_expert_t: Array  # int32 [nt]: the expert of each tile (unused tail tiles: E - 1)


def tile_rows(n_rows: int, n_experts: int) -> int:
    """Rows per tile m: the power of two at or below half the mean rows per expert, in 1..256.
    Smaller tiles pad less (under m rows per expert) but make more, smaller matmuls, each with
    a copy of its expert's weights. A prototype of this MLP (forward + backward, 2048 tokens,
    D 192, on this project's 2-core CPU, m in 8..128) was fastest at m = 32-64 for 128 experts
    / 8 active (mean 128 rows per expert) and at m = 128 for 8 / 2 (mean 512); the rule lands
    on 64 and 256 there."""
    m = max(1, min(256, n_rows // (2 * n_experts)))
    return 1 << (m.bit_length() - 1)


def sparse_layout(expert_M, num_experts: int, tile: int) -> SparseLayout:
    """The buffer layout of routed rows whose experts are expert_M (int32 [M], in
    0..num_experts; num_experts itself = computed elsewhere, the expert-parallel case).

    Static size: sum_e ceil(c_e / m) <= (M + E (m - 1)) / m tiles whatever the routing, so no
    row is ever dropped."""
    M, E, m = expert_M.shape[0], num_experts, tile
    nt = (M + E * (m - 1)) // m
    R = nt * m
    counts_E1 = jnp.bincount(expert_M, length=E + 1).astype(jnp.int32)
    tiles_E = (counts_E1[:E] + m - 1) // m
    start_E1 = jnp.concatenate([(jnp.cumsum(tiles_E) - tiles_E) * m, jnp.array([R], jnp.int32)])
    first_E1 = jnp.cumsum(counts_E1) - counts_E1
    order_M = jnp.argsort(expert_M, stable=True)     # rows grouped by expert, in token order
    e_sorted_M = expert_M[order_M]
    rank_M = jnp.arange(M, dtype=jnp.int32) - first_E1[e_sorted_M]
    dst_sorted_M = jnp.where(e_sorted_M < E, start_E1[e_sorted_M] + rank_M, R)
    dst_M = jnp.zeros((M,), jnp.int32).at[order_M].set(dst_sorted_M, unique_indices=True)
    # Rows routed elsewhere all land on slot R, cut off.
    src_R = jnp.full((R + 1,), M, jnp.int32).at[dst_M].set(jnp.arange(M, dtype=jnp.int32))[:R]
    tile_expert_t = jnp.minimum(
        jnp.searchsorted(jnp.cumsum(tiles_E), jnp.arange(nt), side="right"), E - 1)
    return SparseLayout(dst_M, src_R, tiles_E, tile_expert_t.astype(jnp.int32))


@jax.custom_vjp
def _rows(x_ID, src_O, dst_I):
    """out[o] = x[src[o]], 0 where src[o] = I (out of range). dst is src's inverse (dst[i] = the
    o with src[o] = i, O when none), so the gradient is also a gather, g_x[i] = g[dst[i]],
    instead of autodiff's scatter-add."""
    return jnp.take(x_ID, src_O, axis=0, mode="fill", fill_value=0)


def _rows_fwd(x_ID, src_O, dst_I):
    return _rows(x_ID, src_O, dst_I), (src_O, dst_I)


def _rows_bwd(res, g_OD):
    src_O, dst_I = res
    return jnp.take(g_OD, dst_I, axis=0, mode="fill", fill_value=0), None, None


_rows.defvjp(_rows_fwd, _rows_bwd)


def grouped_matmul(x_RD, w_EDF, layout: SparseLayout, impl: str = "tiles") -> Array:
    """[R, F]: each buffer row times its expert's [D, F] matrix (padding rows give 0).

    impl "tiles": one batched matmul of the nt tiles against their experts' weights;
    "ragged_dot": jax.lax.ragged_dot over the groups of whole tiles (module docstring: dense
    masked on XLA:CPU, kept as the reference)."""
    R, D = x_RD.shape
    nt = layout.tile_expert_t.shape[0]
    if impl == "ragged_dot":
        return jax.lax.ragged_dot(x_RD, w_EDF, layout.tiles_E * (R // nt))
    if impl != "tiles":
        raise ValueError(f"grouped_matmul impl={impl!r}; use 'tiles' or 'ragged_dot'")
    w_tDF = w_EDF[layout.tile_expert_t]
    return jnp.einsum("tmd,tdf->tmf", x_RD.reshape(nt, R // nt, D), w_tDF).reshape(R, -1)


def routed_experts(x_ND, w_Nk, expert_Nk, w_gate_up_ED2F, w_down_EFD, *,
                   impl: str = "tiles") -> Array:
    """[N, D]: sum_k w_Nk * expert_k(x_N), every expert a SwiGLU, dropless (module docstring).

    expert_Nk in 0..E, E = the experts of w_* (E itself: the row's expert is elsewhere, it
    contributes 0: the expert-parallel shard's view)."""
    N, D = x_ND.shape
    k, E = w_Nk.shape[1], w_gate_up_ED2F.shape[0]
    M = N * k
    layout = sparse_layout(expert_Nk.reshape(M), E, tile_rows(M, E))
    x_MD = jnp.broadcast_to(x_ND[:, None], (N, k, D)).reshape(M, D)   # row j = token j // k
    x_RD = _rows(x_MD, layout.src_R, layout.dst_M)
    gate_RF, up_RF = jnp.split(grouped_matmul(x_RD, w_gate_up_ED2F, layout, impl), 2, axis=-1)
    y_RD = grouped_matmul(jax.nn.silu(gate_RF) * up_RF, w_down_EFD, layout, impl)
    y_NkD = _rows(y_RD, layout.dst_M, layout.src_R).reshape(N, k, D)
    return jnp.einsum("nk,nkd->nd", w_Nk, y_NkD)


def expert_mesh():
    """The context mesh (jax.set_mesh / use_abstract_mesh) when it has an `expert` axis of
    size > 1, else None."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or EXPERT_AXIS not in mesh.axis_names or mesh.shape[EXPERT_AXIS] == 1:
        return None
    return mesh


def routed_experts_on_mesh(x_ND, w_Nk, expert_Nk, w_gate_up_ED2F, w_down_EFD, *,
                           impl: str = "tiles") -> Array:
    """`routed_experts`, expert parallel when the context mesh has an `expert` axis of X > 1.

    Under shard_map each device holds E / X experts and N / (data x fsdp x expert) token rows;
    it gathers the rows of its expert group (all_gather over `expert`: the X devices that
    together hold all experts), runs the rows routed to its own experts and sends each row's
    partial sum back to the device that holds the row (psum_scatter): dropless, each row's k
    outputs summed once over the group. Token rows that do not divide over the batch axes
    (a shared prompt's rows) stay replicated and the partial sums are psum'ed."""
    mesh = expert_mesh()
    E = w_gate_up_ED2F.shape[0]
    if mesh is None or E % mesh.shape[EXPERT_AXIS]:
        return routed_experts(x_ND, w_Nk, expert_Nk, w_gate_up_ED2F, w_down_EFD, impl=impl)
    row_axes = tuple(a for a in BATCH_AXES + (EXPERT_AXIS,) if a in mesh.axis_names)
    n_row_shards = 1
    for a in row_axes:
        n_row_shards *= mesh.shape[a]
    split_rows = x_ND.shape[0] % n_row_shards == 0
    rows = P(row_axes) if split_rows else P()

    def local(x_nD, w_nk, e_nk, wgu_eD2F, wd_eFD):
        if split_rows:
            x_nD, w_nk, e_nk = (jax.lax.all_gather(a, EXPERT_AXIS, axis=0, tiled=True)
                                for a in (x_nD, w_nk, e_nk))
        E_loc = wgu_eD2F.shape[0]
        e_loc = e_nk - jax.lax.axis_index(EXPERT_AXIS) * E_loc
        e_loc = jnp.where((e_loc >= 0) & (e_loc < E_loc), e_loc, E_loc)
        y_nD = routed_experts(x_nD, w_nk, e_loc, wgu_eD2F, wd_eFD, impl=impl)
        if split_rows:
            return jax.lax.psum_scatter(y_nD, EXPERT_AXIS, scatter_dimension=0, tiled=True)
        return jax.lax.psum(y_nD, EXPERT_AXIS)

    return jax.shard_map(local, mesh=mesh, in_specs=(rows, rows, rows, P(EXPERT_AXIS),
                                                     P(EXPERT_AXIS)),
                         out_specs=rows, check_vma=False)(
        x_ND, w_Nk, expert_Nk, w_gate_up_ED2F, w_down_EFD)


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


__all__ = ["DISPATCHES", "router_logits", "route", "combine_weights", "dispatch_mode", "moe_mlp",
           "fuse_gate_up", "gate_up_ED2F", "decode_layout", "SparseLayout", "tile_rows",
           "sparse_layout", "grouped_matmul", "routed_experts", "expert_mesh",
           "routed_experts_on_mesh", "load_balancing_loss"]
