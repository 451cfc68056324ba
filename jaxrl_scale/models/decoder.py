"""Decoder-only transformer (Qwen2 / Qwen3 / Llama) as pure functions over a params pytree.

Shapes: B batch, T query tokens, S cache slots, D hidden, V vocab, L layers, N query heads,
K kv heads, G = N // K, H head dim, F mlp hidden, I a projection's input width, R the LoRA rank.

Params pytree (layers stacked on a leading L axis so sharding rules see one array per kind):
  embed [V, D]; final_norm [D]; lm_head [D, V] (absent when tied);
  layers: attn_norm [L, D], wq [L, D, N, H], wk/wv [L, D, K, H], wo [L, N, H, D],
          (bq [L, N, H], bk/bv [L, K, H] when attention_bias), (q_norm/k_norm [L, H] when qk_norm),
          (bo [L, D] when o_bias),
          mlp_norm [L, D], w_gate/w_up [L, D, F], w_down [L, F, D]
          (MoE, cfg.num_experts = E > 0, instead of w_gate/w_up/w_down: router [L, D, E],
          expert_gate/expert_up [L, E, D, F], expert_down [L, E, F, D], F = moe_intermediate_size;
          the math is in models/moe.py).
  LoRA adapters (models/lora.py; optional, any of the 7 projections t in q k v o gate up
  down): lora_a_t [L, in, r], lora_b_t [L, r, out] with the projection's flattened in/out
  (e.g. q: in D, out N*H; o: in N*H, out D) and B already multiplied by alpha / r
  (`lora.compose`): the projection adds B(A x) (Hu et al. 2021, eq. 3).

Padding: every entry point takes `valid_BT` (True on real tokens). RoPE positions count only
valid tokens, so a left-padded prompt gets the same positions as the unpadded one, and keys
at invalid slots are never attended. This is what makes batched, left-padded generation
token-for-token equal to unpadded HF generation.
"""
from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from jaxrl_scale.models import moe, packing
from jaxrl_scale.models.config import ModelConfig
from jaxrl_scale.models.remat import DENSE, remat_block

Params = dict[str, Any]
_NEG_INF = -1e30  # finite: a fully masked (padding) query row must not produce NaN


# ----------------------------------------------------------------------------- init

def init_params(cfg: ModelConfig, seed: int | jax.Array = 0) -> Params:
    """Random init: N(0, 0.02) matrices, unit norms, zero biases (HF's default init).

    Jitted as one program: eagerly, every random draw would compile on its own.
    Traceable too, so `jax.eval_shape` / `jax.jit(..., out_shardings=...)` can wrap it.
    """
    key = jax.random.PRNGKey(seed) if isinstance(seed, int) else seed
    return _init_params_jit(cfg, key)


@functools.partial(jax.jit, static_argnums=0)
def _init_params_jit(cfg: ModelConfig, key: jax.Array) -> Params:
    shapes = param_shapes(cfg)
    keys = iter(jax.random.split(key, 32))
    dt = cfg.jnp_param_dtype

    def make(path, shape):
        name = path[-1]
        if "norm" in name:
            return jnp.ones(shape, dt)
        if name.startswith("b"):
            return jnp.zeros(shape, dt)
        return (0.02 * jax.random.normal(next(keys), shape, jnp.float32)).astype(dt)

    return _map_with_path(make, shapes)


def param_shapes(cfg: ModelConfig) -> Params:
    """The params pytree with shape tuples as leaves (no allocation)."""
    L, D, V, F = cfg.num_layers, cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size
    N, K, H = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    layers = {
        "attn_norm": (L, D),
        "wq": (L, D, N, H), "wk": (L, D, K, H), "wv": (L, D, K, H), "wo": (L, N, H, D),
        "mlp_norm": (L, D),
    }
    if cfg.num_experts:
        E, Fe = cfg.num_experts, cfg.moe_intermediate_size
        layers.update(router=(L, D, E), expert_gate=(L, E, D, Fe), expert_up=(L, E, D, Fe),
                      expert_down=(L, E, Fe, D))
    else:
        layers.update(w_gate=(L, D, F), w_up=(L, D, F), w_down=(L, F, D))
    if cfg.attention_bias:
        layers.update(bq=(L, N, H), bk=(L, K, H), bv=(L, K, H))
    if cfg.qk_norm:
        layers.update(q_norm=(L, H), k_norm=(L, H))
    if cfg.o_bias:
        layers.update(bo=(L, D))
    shapes = {"embed": (V, D), "layers": layers, "final_norm": (D,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head"] = (D, V)
    return shapes


def _map_with_path(fn, tree, path=()):
    if isinstance(tree, dict):
        return {k: _map_with_path(fn, v, path + (k,)) for k, v in tree.items()}
    return fn(path, tree)


# ----------------------------------------------------------------------------- blocks

def rms_norm(x, weight, eps):
    """RMSNorm (Zhang & Sennrich 2019), computed in float32 like HF's Qwen2RMSNorm."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight.astype(x.dtype) * x32.astype(x.dtype)


def rope_inv_freq(head_dim, theta, scaling=None):
    """RoPE inverse frequencies [H/2], float32; `scaling` = ModelConfig.rope_scaling (llama3)."""
    H = head_dim
    inv_freq = 1.0 / (theta ** (jnp.arange(0, H, 2, dtype=jnp.float32) / H))
    if scaling is None:
        return inv_freq
    # Llama 3.1 frequency-dependent scaling, as HF's _compute_llama3_parameters.
    s = dict(scaling)
    factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    wavelen = 2 * jnp.pi / inv_freq
    scaled = jnp.where(wavelen > old_len / lo, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / hi) & ~(wavelen > old_len / lo)
    return jnp.where(medium, smoothed, scaled).astype(jnp.float32)


def rope_tables(cfg: ModelConfig, positions_BT, table=None):
    """(cos, sin) [B, T, 1, H] float32 for RoPE at `positions_BT`, shared by every layer.

    table: `rope_table(cfg, P)` to look positions < P up instead of computing sines and
    cosines; XLA fuses such elementwise producers into each consumer, so in a decode loop the
    transcendentals would otherwise be recomputed for q and k of every layer on every step.
    """
    if table is not None:
        return tuple(t_PH[positions_BT][:, :, None, :] for t_PH in table)
    return _rope_tables(positions_BT, cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)


def rope_table(cfg: ModelConfig, length: int):
    """(cos, sin) [P, H] for positions 0..length-1 (see `rope_tables`)."""
    cos, sin = _rope_tables(jnp.arange(length)[None], cfg.head_dim, cfg.rope_theta,
                            cfg.rope_scaling)
    return cos[0, :, 0], sin[0, :, 0]


def _rope_tables(positions_BT, head_dim, theta, scaling):
    inv_freq = rope_inv_freq(head_dim, theta, scaling)
    freqs_BTh = positions_BT.astype(jnp.float32)[..., None] * inv_freq
    emb_BTH = jnp.concatenate([freqs_BTh, freqs_BTh], axis=-1)[:, :, None, :]
    return jnp.cos(emb_BTH), jnp.sin(emb_BTH)


def apply_rope(x_BTnH, tables):
    """x*cos + rotate_half(x)*sin: HF's rotate-half layout (Su et al. 2021)."""
    cos, sin = tables
    x1, x2 = jnp.split(x_BTnH.astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return (x_BTnH.astype(jnp.float32) * cos + rotated * sin).astype(x_BTnH.dtype)


def _attention(q_BTNH, k_BSKH, v_BSKH, mask_BTS):
    """Grouped-query softmax attention; scores and softmax in float32."""
    B, T, N, H = q_BTNH.shape
    K = k_BSKH.shape[2]
    q_BTKGH = q_BTNH.reshape(B, T, K, N // K, H)
    scores_BKGTS = jnp.einsum("btkgh,bskh->bkgts", q_BTKGH, k_BSKH,
                              preferred_element_type=jnp.float32) * (H ** -0.5)
    scores_BKGTS = jnp.where(mask_BTS[:, None, None], scores_BKGTS, _NEG_INF)
    probs_BKGTS = jax.nn.softmax(scores_BKGTS, axis=-1).astype(v_BSKH.dtype)
    out_BTKGH = jnp.einsum("bkgts,bskh->btkgh", probs_BKGTS, v_BSKH)
    return out_BTKGH.reshape(B, T, N, H)


def dense(x, w, n_in: int = 1):
    """x [..., in] @ w [in, out]: contract the last `n_in` axes of x with the first of w.

    Custom VJP so the weight gradient is dot(x, g) over the leading (batch/time) axes, with
    the activation as left operand. Autodiff's transpose rule emits dot(g, x) and a transpose
    of the [in, out] result; XLA:CPU then materialises g transposed ([out, B*T], fused with
    the elementwise backward of its producer), which on `rl_cpu` cost as much as the matmul.
    Same math either way; `tests/test_decoder.py` checks the gradients against autodiff's.
    The output is named DENSE: remat's dot policies see a custom VJP as no dot (remat.py).
    """
    return checkpoint_name(_dense(x, w, n_in), DENSE)


def _dense_dims(x_ndim, n_in):
    return (tuple(range(x_ndim - n_in, x_ndim)), tuple(range(n_in))), ((), ())


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _dense(x, w, n_in):
    return jax.lax.dot_general(x, w, _dense_dims(x.ndim, n_in))


def _dense_fwd(x, w, n_in):
    return _dense(x, w, n_in), (x, w)


def _dense_bwd(n_in, res, g):
    x, w = res
    n_lead = x.ndim - n_in
    dx = jax.lax.dot_general(g, w, ((tuple(range(n_lead, g.ndim)), tuple(range(n_in, w.ndim))),
                                    ((), ())))
    # Rows flattened first: a contraction over two leading axes makes XLA:CPU copy x into a
    # [in, B*T] transposed layout; over one axis its matmul reads x transposed in place.
    x2 = x.reshape(-1, *x.shape[n_lead:])
    g2 = g.reshape(-1, *g.shape[n_lead:])
    dw = jax.lax.dot_general(x2, g2, (((0,), (0,)), ((), ())))
    return dx.astype(x.dtype), dw.astype(w.dtype)


_dense.defvjp(_dense_fwd, _dense_bwd)


def _lora(lp, target: str, x_BTI):
    """The LoRA term B(A x) of `target`'s adapter in the layer params, [B, T, out], or None
    without one. Two thin matmuls through the rank r instead of the [in, out] product, so the
    update never forms (or differentiates) a full-size weight for the adapter."""
    a_IR = lp.get("lora_a_" + target)
    if a_IR is None:
        return None
    b_RO = lp["lora_b_" + target]
    return dense(dense(x_BTI, a_IR.astype(x_BTI.dtype)), b_RO.astype(x_BTI.dtype))


def _plus_lora(y, lp, target, x_BTI):
    """y (the base projection of x, any trailing shape) plus target's LoRA term, if any."""
    d = _lora(lp, target, x_BTI)
    return y if d is None else y + d.reshape(y.shape)


def merge_adapters(lp: Params) -> Params:
    """Layer params with every LoRA adapter folded into its base weight, W + A B (B already
    scaled), and the adapter leaves dropped; works on one layer's or the stacked [L, ...]
    params. The same function as the unmerged `_lora` path up to float rounding."""
    out = {k: v for k, v in lp.items() if not k.startswith("lora_")}
    for key in lp:
        if not key.startswith("lora_a_"):
            continue
        t = key[len("lora_a_"):]
        w = out[LORA_BASE[t]]
        a, b = lp["lora_a_" + t], lp["lora_b_" + t]
        delta = jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32))  # [(L,) in, out]
        out[LORA_BASE[t]] = (w.astype(jnp.float32) + delta.reshape(w.shape)).astype(w.dtype)
    return out


# LoRA target -> the base weight it adapts (layers dict key).
LORA_BASE = {"q": "wq", "k": "wk", "v": "wv", "o": "wo", "gate": "w_gate", "up": "w_up",
             "down": "w_down"}


def _qkv(cfg, lp, x_BTD, rope_BT):
    dt = cfg.jnp_dtype
    N, K, H = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    if "w_qkv" in lp:  # fused layout from `unstack_layers`: one matmul instead of three
        qkv = dense(x_BTD, lp["w_qkv"].astype(dt))
        if cfg.attention_bias:
            qkv = qkv + lp["b_qkv"].astype(dt)
        B, T = qkv.shape[:2]
        q = qkv[..., :N * H].reshape(B, T, N, H)
        k = qkv[..., N * H:(N + K) * H].reshape(B, T, K, H)
        v = qkv[..., (N + K) * H:].reshape(B, T, K, H)
    else:
        q = _plus_lora(dense(x_BTD, lp["wq"].astype(dt)), lp, "q", x_BTD)
        k = _plus_lora(dense(x_BTD, lp["wk"].astype(dt)), lp, "k", x_BTD)
        v = _plus_lora(dense(x_BTD, lp["wv"].astype(dt)), lp, "v", x_BTD)
        if cfg.attention_bias:
            q, k, v = q + lp["bq"].astype(dt), k + lp["bk"].astype(dt), v + lp["bv"].astype(dt)
    if cfg.qk_norm:  # Qwen3: per-head RMSNorm before RoPE
        q = rms_norm(q, lp["q_norm"], cfg.rms_norm_eps)
        k = rms_norm(k, lp["k_norm"], cfg.rms_norm_eps)
    return apply_rope(q, rope_BT), apply_rope(k, rope_BT), v


def _mlp(cfg, lp, x_BTD):
    if cfg.num_experts:
        return moe.moe_mlp(cfg, lp, x_BTD)[0]
    dt = cfg.jnp_dtype
    if "w_gate_up" in lp:  # fused layout from `unstack_layers`
        gate, up = jnp.split(dense(x_BTD, lp["w_gate_up"].astype(dt)), 2, axis=-1)
    else:
        # One [D, 2, F] matmul instead of two [D, F] ones (fewer, larger kernels: -20% update
        # time on rl_cpu). Stacked, not concatenated, so a tensor-sharded F stays block-sharded.
        w_D2F = jnp.stack([lp["w_gate"], lp["w_up"]], axis=1).astype(dt)
        gate, up = (h[:, :, 0] for h in jnp.split(dense(x_BTD, w_D2F), 2, axis=2))
        gate, up = _plus_lora(gate, lp, "gate", x_BTD), _plus_lora(up, lp, "up", x_BTD)
    h_BTF = jax.nn.silu(gate) * up
    if "w_down_DF" in lp:  # prepared layout from `unstack_layers`
        return jnp.einsum("btf,df->btd", h_BTF, lp["w_down_DF"].astype(dt))
    return _plus_lora(dense(h_BTF, lp["w_down"].astype(dt)), lp, "down", h_BTF)


def _layer(cfg, lp, x_BTD, rope_BT, attend, *, with_router: bool = False):
    """Pre-norm residual block; `attend(q, k, v) -> out` hides where keys come from.
    rope_BT: `rope_tables` at the tokens' positions. with_router: see `_layer_rest`."""
    q, k, v = _qkv(cfg, lp, rms_norm(x_BTD, lp["attn_norm"], cfg.rms_norm_eps), rope_BT)
    return _layer_rest(cfg, lp, x_BTD, attend(q, k, v), with_router=with_router)


def _layer_rest(cfg, lp, x_BTD, attn_BTNH, *, with_router: bool = False):
    """The block after attention: output projection, residual, pre-norm MLP, residual.
    with_router (MoE only): return (x_BTD, router_logits_BTE) instead."""
    # Contract over the merged N*H axis: with "btnh,nhd" XLA (CPU) may pick a (h, n) order for
    # the contraction and transpose the whole wo matrix on every call.
    B, T, N, H = attn_BTNH.shape
    wo_ED = lp["wo"].reshape(N * H, -1).astype(cfg.jnp_dtype)  # [N, H, D] or fused [N*H, D]
    attn_BTI = attn_BTNH.reshape(B, T, N * H)
    out_BTD = _plus_lora(dense(attn_BTI, wo_ED), lp, "o", attn_BTI)
    if cfg.o_bias:
        out_BTD = out_BTD + lp["bo"].astype(cfg.jnp_dtype)
    x_BTD = x_BTD + out_BTD
    h_BTD = rms_norm(x_BTD, lp["mlp_norm"], cfg.rms_norm_eps)
    if with_router:
        y_BTD, logits_BTE = moe.moe_mlp(cfg, lp, h_BTD)
        return x_BTD + y_BTD, logits_BTE
    return x_BTD + _mlp(cfg, lp, h_BTD)


def _layer_params(params, i):
    return jax.tree.map(lambda a: a[i], params["layers"])


def unstack_layers(cfg: ModelConfig, params: Params, *, fuse: bool = True) -> tuple[Params, ...]:
    """Per-layer parameter dicts for decoding, one copy of every layer weight (in the compute
    dtype).

    Slicing a layer out of the stacked [L, ...] arrays is a copy on CPU; done once here, the
    decode loop reads the slices directly. With `fuse`, q/k/v become one [D, (N+2K)*H] matrix
    (biases [(N+2K)*H]), gate/up one [D, 2F] and wo a [N*H, D] matrix, so a one-token step
    runs 4 matmuls per layer instead of 7 (fewer, larger kernels: what bounds a step at small
    batch). Both layouts go through the same `_layer`.

    w_down is stored transposed, [D, F] ("w_down_DF"): XLA CPU streams a matrix-vector
    product with a long contraction (F = 3D) twice as fast as output rows of F contiguous
    floats (32 vs 17 GB/s for 1536 x 512 at batch 1; the other matrices, contracting over D,
    are fastest as they are). In-process A/B on `small`: tokens/s +8% at batch 1, +13% at 4,
    +7% at 16, +4% at 64, +1% at 256.

    LoRA adapters in the params are merged into their weights (`merge_adapters`).

    MoE layers (cfg.num_experts > 0): the experts' gate/up become one [D, 2, E, F] array
    ("expert_gate_up", moe.fuse_gate_up), or [E, D, 2F] ("expert_gate_up_ED2F") under sparse
    dispatch (moe.decode_layout); router and expert_down stay as they are.
    """
    out = []
    for i in range(cfg.num_layers):
        # LoRA adapters are folded into the weights here, once per call: a decode step then
        # costs exactly what the base model's does.
        lp = merge_adapters(_layer_params(params, i))
        if fuse:
            D = lp["wq"].shape[0]
            lp = dict(lp)
            lp["w_qkv"] = jnp.concatenate(
                [lp.pop(n).reshape(D, -1) for n in ("wq", "wk", "wv")], axis=1)
            if cfg.attention_bias:
                lp["b_qkv"] = jnp.concatenate([lp.pop(n).reshape(-1) for n in ("bq", "bk", "bv")])
            lp["wo"] = lp["wo"].reshape(-1, lp["wo"].shape[-1])
            if cfg.num_experts:
                lp.update(moe.decode_layout(cfg, lp))
                del lp["expert_gate"], lp["expert_up"]
            else:
                lp["w_gate_up"] = jnp.concatenate([lp.pop("w_gate"), lp.pop("w_up")], axis=1)
                lp["w_down_DF"] = lp.pop("w_down").T
        # Every use casts to the compute dtype anyway; casting the copy once means a decode
        # step streams bf16, not float32 master weights (accelerator presets).
        out.append({k: v.astype(cfg.jnp_dtype) for k, v in lp.items()})
    return tuple(out)


def positions_from_valid(valid_BT, offset_B=None):
    """RoPE position of each token = number of valid tokens before it (+ offset)."""
    pos_BT = jnp.cumsum(valid_BT.astype(jnp.int32), axis=1) - 1
    if offset_B is not None:
        pos_BT = pos_BT + offset_B[:, None]
    return jnp.maximum(pos_BT, 0)


def embed(cfg, params, tokens_BT):
    return params["embed"].astype(cfg.jnp_dtype)[tokens_BT]


def logits_from_hidden(cfg: ModelConfig, params: Params, h_BTD) -> jax.Array:
    """Final norm + LM head; logits in float32 whatever the compute dtype."""
    h_BTD = rms_norm(h_BTD, params["final_norm"], cfg.rms_norm_eps)
    w_DV = params["embed"].T if cfg.tie_word_embeddings else params["lm_head"]
    return jnp.einsum("btd,dv->btv", h_BTD, w_DV.astype(cfg.jnp_dtype),
                      preferred_element_type=jnp.float32)


# ----------------------------------------------------------------------------- full sequences

def hidden_states(cfg: ModelConfig, params: Params, tokens_BT, valid_BT=None, *,
                  remat: bool | str = False, return_router_logits: bool = False,
                  segment_ids_BT=None, window: int = 0) -> jax.Array:
    """Residual stream before the final norm, [B, T, D]. Used by the LM head and value heads.

    return_router_logits (MoE only): return (h_BTD, router_logits_LBTE float32), the inputs of
    the load-balancing loss (moe.load_balancing_loss). segment_ids_BT: packed rows (models/
    packing.py; valid_BT is then ignored: padding is segment 0), attended in blocks of
    `window` when given."""
    _check_router(cfg, return_router_logits)
    B, T = tokens_BT.shape
    if valid_BT is None:
        valid_BT = jnp.ones((B, T), bool)
    if segment_ids_BT is not None:
        rope_BT = rope_tables(cfg, packing.segment_positions(segment_ids_BT))
        attend = packing.segment_attention(segment_ids_BT, _attention, window)
    else:
        rope_BT = rope_tables(cfg, positions_from_valid(valid_BT))
        mask_BTS = jnp.tril(jnp.ones((T, T), bool))[None] & valid_BT[:, None, :]

        def attend(q, k, v):
            return _attention(q, k, v, mask_BTS)

    def block(x, lp):
        return _layer(cfg, lp, x, rope_BT, attend, with_router=return_router_logits)

    block = remat_block(block, remat)   # remat: False/True, "none", "full" or a policy name
    x_BTD = embed(cfg, params, tokens_BT)
    router_L = []
    for i in range(cfg.num_layers):
        x_BTD = block(x_BTD, _layer_params(params, i))
        if return_router_logits:
            x_BTD, logits_BTE = x_BTD
            router_L.append(logits_BTE)
    return (x_BTD, jnp.stack(router_L)) if return_router_logits else x_BTD


def _check_router(cfg, return_router_logits):
    if return_router_logits and not cfg.num_experts:
        raise ValueError("return_router_logits needs a mixture-of-experts model "
                         f"(ModelConfig.num_experts > 0); this one is dense (arch={cfg.arch!r}).")


def response_hidden_states(cfg: ModelConfig, params: Params, tokens_BT, valid_BT, *,
                           prompt_len: int, group: int, remat: bool | str = False,
                           return_router_logits: bool = False) -> jax.Array:
    """`hidden_states` at positions prompt_len - 1 .. T - 2, [B, R, D] with R = T - prompt_len:
    the positions whose logits score the response tokens prompt_len .. T - 1.

    Rows come in groups of `group` consecutive rows that share their first `prompt_len` tokens
    and valid flags (G responses to one prompt, the GRPO layout of rl/batch.py). The prompt is
    then run once per group, not G times: a causal prompt token attends only to the prompt, so
    its hidden states are the same in every row of the group, and the response queries attend
    to the group's prompt keys/values broadcast over its rows (as decoding from a shared
    KV cache does). Same math as `hidden_states` on the full rows; the prompt's gradients sum
    over the group through the broadcast. Callers must guarantee the shared prefix.

    return_router_logits (MoE only): also return the router logits [L, B, T, E] of the full
    rows (the prompt's broadcast over its group), equal to `hidden_states`'s.
    """
    _check_router(cfg, return_router_logits)
    B, T = tokens_BT.shape
    G, Tp = int(group), int(prompt_len)
    if B % G or not 0 < Tp < T:
        raise ValueError(f"response_hidden_states: {B} rows in groups of {G}, prompt_len={Tp} "
                         f"of T={T}; need groups that divide the rows and 0 < prompt_len < T")
    P = B // G

    def first_of_group(x_BT):  # [B, T] -> [P, Tp]; a reshape keeps row sharding on P
        return x_BT.reshape(P, G, T)[:, 0, :Tp]

    def per_row(x_P):          # [P, ...] -> [B, ...], each group's value on its G rows
        return jnp.broadcast_to(x_P[:, None], (P, G) + x_P.shape[1:]).reshape(B, *x_P.shape[1:])

    pos_BT = positions_from_valid(valid_BT)
    rope_PT, rope_BR = rope_tables(cfg, first_of_group(pos_BT)), rope_tables(cfg, pos_BT[:, Tp:])
    valid_PT = first_of_group(valid_BT)
    mask_PTT = jnp.tril(jnp.ones((Tp, Tp), bool))[None] & valid_PT[:, None, :]
    R = T - Tp
    mask_BRS = jnp.concatenate([   # response query -> [prompt keys | response keys]
        jnp.broadcast_to(per_row(valid_PT)[:, None, :], (B, R, Tp)),
        jnp.tril(jnp.ones((R, R), bool))[None] & valid_BT[:, None, Tp:]], axis=2)

    def block(xs, lp):
        x_PTD, x_BRD = xs
        qp, kp, vp = _qkv(cfg, lp, rms_norm(x_PTD, lp["attn_norm"], cfg.rms_norm_eps), rope_PT)
        qr, kr, vr = _qkv(cfg, lp, rms_norm(x_BRD, lp["attn_norm"], cfg.rms_norm_eps), rope_BR)
        k_BSKH = jnp.concatenate([per_row(kp), kr], axis=1)
        v_BSKH = jnp.concatenate([per_row(vp), vr], axis=1)
        kw = dict(with_router=return_router_logits)
        return (_layer_rest(cfg, lp, x_PTD, _attention(qp, kp, vp, mask_PTT), **kw),
                _layer_rest(cfg, lp, x_BRD, _attention(qr, k_BSKH, v_BSKH, mask_BRS), **kw))

    block = remat_block(block, remat)
    xs = (embed(cfg, params, first_of_group(tokens_BT)), embed(cfg, params, tokens_BT[:, Tp:]))
    router_L = []
    for i in range(cfg.num_layers):
        xs = block(xs, _layer_params(params, i))
        if return_router_logits:
            (x_PTD, lp_PTE), (x_BRD, lr_BRE) = xs
            xs = (x_PTD, x_BRD)
            router_L.append(jnp.concatenate([per_row(lp_PTE), lr_BRE], axis=1))
    x_PTD, x_BRD = xs
    h_BRD = jnp.concatenate([per_row(x_PTD[:, -1:]), x_BRD[:, :-1]], axis=1)
    return (h_BRD, jnp.stack(router_L)) if return_router_logits else h_BRD


def forward(cfg: ModelConfig, params: Params, tokens_BT, valid_BT=None, *,
            remat: bool | str = False) -> jax.Array:
    """Causal forward over full sequences -> float32 logits [B, T, V].

    With `valid_BT`, padded tokens (left-padded prompts, right-padded responses) are neither
    attended to nor counted in positions; logits at padded positions are meaningless.
    """
    return logits_from_hidden(cfg, params, hidden_states(cfg, params, tokens_BT, valid_BT,
                                                         remat=remat))


def forward_with_aux(cfg: ModelConfig, params: Params, tokens_BT, valid_BT=None, *,
                     remat: bool | str = False) -> tuple[jax.Array, dict[str, jax.Array]]:
    """`forward` plus auxiliaries of a mixture-of-experts model: (logits_BTV, aux) with
    aux["router_logits_LBTE"] (float32) and aux["router_aux_loss"], the load-balancing loss
    over the valid tokens (moe.load_balancing_loss; HF's output_router_logits=True)."""
    h_BTD, router_LBTE = hidden_states(cfg, params, tokens_BT, valid_BT, remat=remat,
                                       return_router_logits=True)
    aux = {"router_logits_LBTE": router_LBTE,
           "router_aux_loss": moe.load_balancing_loss(router_LBTE, cfg.num_experts_per_tok,
                                                      valid_BT)}
    return logits_from_hidden(cfg, params, h_BTD), aux


# ----------------------------------------------------------------------------- KV cache

@flax.struct.dataclass
class KVCache:
    """Decode state. Slots are shared by all rows; `index` is the next slot to write."""
    k_LBSKH: jax.Array
    v_LBSKH: jax.Array
    valid_BS: jax.Array     # bool: slot holds a real (non-pad) token
    next_pos_B: jax.Array   # int32: RoPE position of the next token of each row
    index: jax.Array        # int32 scalar

    @property
    def max_len(self) -> int:
        return self.k_LBSKH.shape[2]


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype=None) -> KVCache:
    dt = jnp.dtype(dtype) if dtype is not None else cfg.jnp_dtype
    shape = (cfg.num_layers, batch, max_len, cfg.num_kv_heads, cfg.head_dim)
    return KVCache(k_LBSKH=jnp.zeros(shape, dt), v_LBSKH=jnp.zeros(shape, dt),
                   valid_BS=jnp.zeros((batch, max_len), bool),
                   next_pos_B=jnp.zeros((batch,), jnp.int32),
                   index=jnp.zeros((), jnp.int32))


def extend(cfg: ModelConfig, params: Params, cache: KVCache, tokens_BT, valid_BT=None, *,
           layers: tuple[Params, ...] | None = None):
    """Append T tokens to the cache and return (logits_BTV float32, new cache).

    Prefill is one call with the left-padded prompt block; each decode step is a call with
    T = 1. Query t (slot index + t) attends to slots <= index + t that hold valid tokens.
    `layers` (from `unstack_layers`) replaces the per-call slicing of params["layers"].
    """
    B, T = tokens_BT.shape
    if valid_BT is None:
        valid_BT = jnp.ones((B, T), bool)
    S = cache.max_len
    start = cache.index
    rope_BT = rope_tables(cfg, positions_from_valid(valid_BT, cache.next_pos_B))
    valid_BS = jax.lax.dynamic_update_slice(cache.valid_BS, valid_BT, (0, start))
    slot_S = jnp.arange(S)
    causal_TS = slot_S[None, :] <= (start + jnp.arange(T))[:, None]
    mask_BTS = causal_TS[None] & valid_BS[:, None, :]

    k_cache, v_cache = cache.k_LBSKH, cache.v_LBSKH
    x_BTD = embed(cfg, params, tokens_BT)
    for i in range(cfg.num_layers):
        def attend(q, k, v, i=i):
            nonlocal k_cache, v_cache
            k_cache = jax.lax.dynamic_update_slice(
                k_cache, k.astype(k_cache.dtype)[None], (i, 0, start, 0, 0))
            v_cache = jax.lax.dynamic_update_slice(
                v_cache, v.astype(v_cache.dtype)[None], (i, 0, start, 0, 0))
            return _attention(q, k_cache[i].astype(q.dtype), v_cache[i].astype(q.dtype),
                              mask_BTS)
        lp = layers[i] if layers is not None else _layer_params(params, i)
        x_BTD = _layer(cfg, lp, x_BTD, rope_BT, attend)

    logits_BTV = logits_from_hidden(cfg, params, x_BTD)
    new_cache = KVCache(k_LBSKH=k_cache, v_LBSKH=v_cache, valid_BS=valid_BS,
                        next_pos_B=cache.next_pos_B + valid_BT.sum(axis=1, dtype=jnp.int32),
                        index=start + T)
    return logits_BTV, new_cache
