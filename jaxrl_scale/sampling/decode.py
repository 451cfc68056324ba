"""Batched generation with a KV cache: one jitted prefill + `lax.while_loop` of one-token steps.

Shapes: B batch (bucketed), T prompt bucket, N max_new_tokens, V vocab.

Host side (`generate`): validate every input before anything is traced, left-pad the prompts
into a bucket (prompt length -> power of two >= 8, batch -> power of two, times the data-axis
size under a mesh) so repeated calls inside one bucket reuse one executable.

Device side (`_decode`, one jit per bucket and setting): the cache is created inside the jitted
function (so there is nothing to donate and XLA updates it in place across loop steps); the
prompt block minus its last column is prefilled with one `extend` call whose logits are dead
code, then every loop step feeds one token (the last prompt token first), samples from its
logits and stops when every row has emitted EOS or N tokens exist (gemma sampler shape).

The loop step is `decode_step`, not `extend`: the decoder's own layer function with a
one-query attention over per-layer caches (keys [B, K, H, S], values [B, K, S, H]); tests check
it equals `extend` to 1e-5. What makes it fast on CPU (each measured with XLA's profiler on
`small`; see experiments/decode_bench.py for the end-to-end figures):
- weights come from `unstack_layers` (per-layer slices, q/k/v and gate/up fused, w_down
  transposed to the layout XLA's matrix-vector product streams fastest), prepared once
  per params and reused across calls (`_PreparedLayers`) instead of sliced in every call;
- the step never reads the cache it writes, and the write depends on the read, so XLA updates
  the caches in place (reading the updated cache cost 3 full cache copies per layer per step);
- RoPE is a table lookup (sines and cosines were recomputed in every layer's fusions);
- the keys' [H, S] layout makes the score contraction a plain matmul (3x faster than [S, H]).
"""
from __future__ import annotations

import functools
import math
import numbers
import weakref
from typing import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxrl_scale.models.config import ModelConfig
from jaxrl_scale.models.decoder import (
    _NEG_INF, KVCache, _layer, embed, extend, init_cache, logits_from_hidden, positions_from_valid,
    rope_table, rope_tables, unstack_layers)
from jaxrl_scale.sampling.rules import SamplingConfig, validate_sampling

MIN_PROMPT_BUCKET = 8
DATA_AXES = ("data", "fsdp", "expert")  # mesh axes the batch rows are split over, when present


@flax.struct.dataclass
class GenerateOutput:
    tokens: jax.Array     # int32 [B, N]: pad_id after a row's EOS (EOS kept)
    logprobs: jax.Array   # float32 [B, N]: log-prob under the sampled-from distribution, 0 on pads
    lengths: jax.Array    # int32 [B]: generated tokens per row, EOS included
    steps: jax.Array      # int32 []: loop steps run (< N when every row stopped early)


@flax.struct.dataclass
class StepCache:
    """The KV cache in the decode loop: per layer and chunk, keys [B, K, H, S_c] and values
    [B, K, S_c, H].

    Per-layer arrays (not the decoder's stacked [L, B, S, K, H]) so a step never copies a
    layer out of the stack; layouts chosen so the one-query attention is plain batched matmuls
    without transposes (see `decode_step`). The slots are split into chunks of static sizes
    (chunk 0: the prefilled prompt and the first decode phase; then one chunk per further
    phase) so that a step attends only to the chunks that can hold tokens yet. Same slot
    semantics as `KVCache`, with slots numbered through the chunks in order.
    """
    k_BKHS: tuple[tuple[jax.Array, ...], ...]   # [layer][chunk]
    v_BKSH: tuple[tuple[jax.Array, ...], ...]
    valid_BS: jax.Array     # bool [B, all slots]: slot holds a real token
    next_pos_B: jax.Array   # int32: RoPE position of each row's next token
    index: jax.Array        # int32 []: next slot to write

    @property
    def chunk_starts(self) -> tuple[int, ...]:
        sizes = [k.shape[-1] for k in self.k_BKHS[0]]
        return tuple(int(x) for x in np.cumsum([0] + sizes))


@flax.struct.dataclass
class DecodeState:
    """The while-loop carry."""
    step: jax.Array        # int32 []: index of the token emitted by the next step
    cache: StepCache
    input_B: jax.Array     # int32: token fed to the next step
    tokens_BN: jax.Array
    logprobs_BN: jax.Array
    lengths_B: jax.Array
    done_B: jax.Array      # bool: row has emitted EOS
    rng: jax.Array


def to_step_cache(cache: KVCache, new_chunks: Sequence[int] = ()) -> StepCache:
    """Decoder cache [L, B, S, K, H] -> a `StepCache` for `sum(new_chunks)` more tokens: chunk 0
    holds the S slots (one transposing copy, after prefill) plus new_chunks[0] empty slots,
    then one empty chunk per further size (one chunk when there is one phase, so a single
    phase loop attends with one matmul pair per layer, as without chunks)."""
    L, B, _, K, H = cache.k_LBSKH.shape
    dt = cache.k_LBSKH.dtype
    first, rest = (new_chunks[0], tuple(new_chunks[1:])) if new_chunks else (0, ())
    k = tuple((jnp.pad(jnp.transpose(cache.k_LBSKH[i], (0, 2, 3, 1)),
                       ((0, 0), (0, 0), (0, 0), (0, first))),)
              + tuple(jnp.zeros((B, K, H, c), dt) for c in rest) for i in range(L))
    v = tuple((jnp.pad(jnp.transpose(cache.v_LBSKH[i], (0, 2, 1, 3)),
                       ((0, 0), (0, 0), (0, first), (0, 0))),)
              + tuple(jnp.zeros((B, K, c, H), dt) for c in rest) for i in range(L))
    valid_BS = jnp.pad(cache.valid_BS, ((0, 0), (0, sum(new_chunks))))
    return StepCache(k_BKHS=k, v_BKSH=v, valid_BS=valid_BS, next_pos_B=cache.next_pos_B,
                     index=cache.index)


def decode_step(cfg: ModelConfig, params, layers, cache: StepCache, token_B, valid_B, *,
                rope_table=None, live: int | None = None):
    """One token per row through the decoder with a `StepCache` -> (logits_BV, cache).

    The same math as `extend(cfg, params, cache, token_B[:, None], valid_B[:, None])`
    (the decoder's own layer function; only the attention kernel is specialised to one
    query), which tests check to 1e-5. `layers` comes from `unstack_layers`; `rope_table` from
    `decoder.rope_table` (RoPE by lookup instead of per-layer sines and cosines).

    Keys are stored [B, K, H, S] and values [B, K, S, H]: both attention contractions are
    then plain row-major batched matmuls ([G, H] x [H, S] and [G, S] x [S, H]); with keys
    [B, K, S, H] the score matmul ran 3x slower than the value one (XLA CPU, B=256).

    live: the step attends to chunks [0, live) only and writes slot `cache.index` into chunk
    live - 1 (default: all chunks, the last one written); the caller keeps the index inside
    that chunk. Slots in later chunks are empty, so skipping them changes nothing but time.

    The query attends to the cache as it was before this step plus the new key/value as a
    separate score column; the updated cache is only written, never read, in the step.
    Reading the freshly updated cache instead makes XLA (CPU) copy every layer's cache on
    each step (3 extra full copies per layer: ~1 GB per step at B=256 for `small`).
    """
    B = token_B.shape[0]
    N, K, H = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    idx = cache.index
    starts = cache.chunk_starts
    live = len(starts) - 1 if live is None else live
    offset = idx - starts[live - 1]  # write position inside chunk live - 1
    valid_B1 = valid_B[:, None]
    rope_B1 = rope_tables(cfg, positions_from_valid(valid_B1, cache.next_pos_B), rope_table)
    new_k, new_v = [], []
    x_B1D = embed(cfg, params, token_B[:, None])
    for i, lp in enumerate(layers):
        def attend(q_B1NH, k_B1KH, v_B1KH, i=i):
            ks, vs = cache.k_BKHS[i], cache.v_BKSH[i]
            dt = ks[0].dtype
            k_BKH1 = jnp.transpose(k_B1KH, (0, 2, 3, 1)).astype(dt)
            v_BK1H = jnp.transpose(v_B1KH, (0, 2, 1, 3)).astype(dt)
            q_BKGH = q_B1NH.reshape(B, K, N // K, H)
            scores = []
            for c in range(live):
                s_BKGS = jnp.einsum("bkgh,bkhs->bkgs", q_BKGH, ks[c].astype(q_BKGH.dtype),
                                    preferred_element_type=jnp.float32)
                ok_BS = cache.valid_BS[:, starts[c]:starts[c + 1]]
                scores.append(jnp.where(ok_BS[:, None, None, :], s_BKGS, _NEG_INF))
            cur_BKG1 = jnp.einsum("bkgh,bkht->bkgt", q_BKGH, k_BKH1.astype(q_BKGH.dtype),
                                  preferred_element_type=jnp.float32)
            scores.append(jnp.where(valid_B[:, None, None, None], cur_BKG1, _NEG_INF))
            probs = jax.nn.softmax(jnp.concatenate(scores, axis=-1) * (H ** -0.5),
                                   axis=-1).astype(dt)
            out_BKGH = probs[..., -1:] * v_BK1H
            for c in range(live):
                out_BKGH = out_BKGH + jnp.einsum(
                    "bkgs,bksh->bkgh", probs[..., starts[c]:starts[c + 1]], vs[c])
            # In-place cache writes need the reads above ordered before them, and XLA's copy
            # insertion only sees data dependencies: without one it copies both caches every
            # step. `0 * out` (not folded for floats) makes the write depend on the read.
            tie_BK1H = 0 * out_BKGH[:, :, :1, :].astype(dt)
            w = live - 1
            new_k.append(ks[:w] + (jax.lax.dynamic_update_slice(
                ks[w], k_BKH1 + jnp.swapaxes(tie_BK1H, 2, 3), (0, 0, 0, offset)),) + ks[w + 1:])
            new_v.append(vs[:w] + (jax.lax.dynamic_update_slice(
                vs[w], v_BK1H + tie_BK1H, (0, 0, offset, 0)),) + vs[w + 1:])
            return out_BKGH.reshape(B, 1, N, H).astype(q_B1NH.dtype)
        x_B1D = _layer(cfg, lp, x_B1D, rope_B1, attend)
    logits_BV = logits_from_hidden(cfg, params, x_B1D)[:, 0]
    valid_BS = jax.lax.dynamic_update_slice(cache.valid_BS, valid_B1, (0, idx))
    return logits_BV, StepCache(k_BKHS=tuple(new_k), v_BKSH=tuple(new_v), valid_BS=valid_BS,
                                next_pos_B=cache.next_pos_B + valid_B.astype(jnp.int32),
                                index=idx + 1)


# ----------------------------------------------------------------------------- prepared weights

@functools.partial(jax.jit, static_argnums=(0, 2))
def _unstack_jit(cfg, params, fuse):
    return unstack_layers(cfg, params, fuse=fuse)


class _PreparedLayers:
    """The per-layer decode weights of the last params seen, reused while those params live.

    RL calls `generate` several times per update (rollouts, evals) with the same params, and
    benchmarks call it repeatedly: re-slicing the stacked weights costs a full weight copy
    into fresh memory per call (about 30 ms for `small` on CPU). One entry only, so at most
    one extra copy of the weights is alive; identity is checked through weak references.
    """

    def __init__(self):
        self._key, self._refs, self._layers = None, (), None

    def get(self, cfg: ModelConfig, params, fuse: bool):
        leaves = jax.tree.leaves(params)
        key = (cfg, fuse, jax.tree.structure(params), tuple(map(id, leaves)))
        if key == self._key and all(r() is x for r, x in zip(self._refs, leaves)):
            return self._layers
        self.clear()
        layers = _unstack_jit(cfg, params, fuse)
        try:
            refs = tuple(weakref.ref(x) for x in leaves)
        except TypeError:  # leaves without weakref support (e.g. Python floats): no reuse
            return layers
        self._key, self._refs, self._layers = key, refs, layers
        return layers

    def clear(self):
        self._key, self._refs, self._layers = None, (), None


_PREPARED = _PreparedLayers()


def prepared_layers(cfg: ModelConfig, params, mesh: Mesh | None):
    """The per-layer decode weights of `params` (cached while they live; see _PreparedLayers).

    q/k/v and gate/up fusion concatenates weights: kept to unsharded params, where it never
    forces a reshard of tensor-parallel weights."""
    fuse = mesh is None and all(getattr(x, "sharding", None) is None or
                                len(x.sharding.device_set) == 1 for x in jax.tree.leaves(params))
    return _PREPARED.get(cfg, params, fuse)


# ----------------------------------------------------------------------------- jit cache

_JIT_CACHE: dict = {}
_TRACES = [0]


def compile_count() -> int:
    """How many times the decode function has been traced (== compiled) in this process."""
    return _TRACES[0]


def clear_cache() -> None:
    """Drop the compiled decode functions and the prepared weights (the counter keeps counting)."""
    _JIT_CACHE.clear()
    _PREPARED.clear()


MAX_PHASES = 4
MIN_PHASE_TOKENS = 16


def phase_sizes(cfg: ModelConfig, batch: int, prompt_len: int, max_new_tokens: int
                ) -> tuple[int, ...]:
    """Tokens per decode phase (static): each phase's cache chunk holds its tokens.

    The loop attends only to chunks that can hold tokens, so with P phases it reads on average
    about (P + 1) / 2P of the generated slots instead of all of them. Each phase is one more
    compiled loop body and each chunk two more small matmuls per layer, which costs more than
    it saves when the KV cache is small next to the weights a step reads anyway (small batch,
    short context): then there is one phase.
    """
    N = max_new_tokens
    itemsize = np.dtype(cfg.dtype).itemsize
    kv_bytes = 2 * cfg.num_layers * batch * (prompt_len + N) * cfg.num_kv_heads * cfg.head_dim \
        * itemsize
    weight_bytes = cfg.num_params() * np.dtype(cfg.param_dtype).itemsize
    if 4 * kv_bytes < weight_bytes:
        return (N,)
    p = min(MAX_PHASES, -(-N // MIN_PHASE_TOKENS))
    size = -(-N // p)
    return (size,) * (p - 1) + (N - size * (p - 1),)


def _decode(params, layers, tokens_BT, valid_BT, rng, *, cfg: ModelConfig, max_new_tokens: int,
            sampling: SamplingConfig, eos_id: int | None, pad_id: int, batch_spec):
    _TRACES[0] += 1
    B, T = tokens_BT.shape
    N = max_new_tokens

    def constrain(x, batch_axis=0):
        if batch_spec is None:
            return x
        return jax.lax.with_sharding_constraint(x, batch_spec(x.ndim, batch_axis))

    def constrain_cache(c):
        if batch_spec is None:
            return c
        if isinstance(c, KVCache):
            return c.replace(k_LBSKH=jax.lax.with_sharding_constraint(c.k_LBSKH, batch_spec(5, 1)),
                             v_LBSKH=jax.lax.with_sharding_constraint(c.v_LBSKH, batch_spec(5, 1)),
                             valid_BS=constrain(c.valid_BS), next_pos_B=constrain(c.next_pos_B))
        return c.replace(k_BKHS=jax.tree.map(constrain, c.k_BKHS),
                         v_BKSH=jax.tree.map(constrain, c.v_BKSH),
                         valid_BS=constrain(c.valid_BS), next_pos_B=constrain(c.next_pos_B))

    table = rope_table(cfg, T + N)  # positions never exceed the slots
    # Prefill all but the last column into a cache of exactly those T - 1 slots; the logits
    # of this call are unused and DCE'd, so the LM head runs only in the loop (left padding:
    # the last column is real for every row).
    _, prefill = extend(cfg, params, constrain_cache(init_cache(cfg, B, T - 1)),
                        tokens_BT[:, :-1], valid_BT[:, :-1], layers=layers)
    phases = phase_sizes(cfg, B, T, N)

    state = DecodeState(
        step=jnp.zeros((), jnp.int32), cache=constrain_cache(to_step_cache(prefill, phases)),
        input_B=tokens_BT[:, -1],
        tokens_BN=constrain(jnp.full((B, N), pad_id, jnp.int32)),
        logprobs_BN=constrain(jnp.zeros((B, N), jnp.float32)),
        lengths_B=constrain(jnp.zeros((B,), jnp.int32)),
        done_B=constrain(~valid_BT[:, -1]),  # bucket dummy rows start done
        rng=rng)

    def step(s: DecodeState, live: int):
        logits_BV, cache = decode_step(cfg, params, layers, s.cache, s.input_B, ~s.done_B,
                                       rope_table=table, live=live)
        tok_B, logp_B = sampling.get_next_tokens(logits_BV, jax.random.fold_in(s.rng, s.step))
        tok_B = jnp.where(s.done_B, pad_id, tok_B)
        logp_B = jnp.where(s.done_B, 0.0, logp_B)
        done_B = s.done_B if eos_id is None else s.done_B | (tok_B == eos_id)
        return DecodeState(
            step=s.step + 1, cache=constrain_cache(cache),
            input_B=jnp.where(done_B, 0, tok_B),
            tokens_BN=jax.lax.dynamic_update_slice(s.tokens_BN, tok_B[:, None], (0, s.step)),
            logprobs_BN=jax.lax.dynamic_update_slice(s.logprobs_BN, logp_B[:, None], (0, s.step)),
            lengths_B=s.lengths_B + (~s.done_B).astype(jnp.int32),
            done_B=done_B, rng=s.rng)

    # One while_loop per phase: phase p writes chunk p and attends to chunks 0..p only.
    # A phase whose rows are all done runs zero steps, so later phases cost nothing.
    s, end = state, 0
    for p, size in enumerate(phases):
        end += size
        s = jax.lax.while_loop(lambda s, end=end: (s.step < end) & ~jnp.all(s.done_B),
                               functools.partial(step, live=p + 1), s)
    return GenerateOutput(tokens=s.tokens_BN, logprobs=s.logprobs_BN, lengths=s.lengths_B,
                          steps=s.step)


def _batch_spec_fn(mesh: Mesh, data_axes: tuple[str, ...]):
    def spec(ndim: int, batch_axis: int = 0) -> NamedSharding:
        parts = [None] * ndim
        parts[batch_axis] = data_axes
        return NamedSharding(mesh, P(*parts))
    return spec


def _get_decode_fn(key, **static):
    fn = _JIT_CACHE.get(key)
    if fn is None:
        fn = jax.jit(functools.partial(_decode, **static))
        _JIT_CACHE[key] = fn
    return fn


# ----------------------------------------------------------------------------- host side

def next_pow2(n: int, minimum: int = 1) -> int:
    return max(minimum, 1 << max(0, int(n) - 1).bit_length())


def bucket_shape(batch: int, prompt_len: int, data_size: int = 1) -> tuple[int, int]:
    """(batch bucket, prompt bucket): powers of two, batch a multiple of `data_size`."""
    b = next_pow2(batch)
    b = data_size * math.ceil(b / data_size)
    return b, next_pow2(prompt_len, MIN_PROMPT_BUCKET)


def _check_int(name, value, minimum=None):
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise ValueError(f"{name} must be an int, got {value!r}.")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}.")


def _validate_prompts(cfg: ModelConfig, prompts, max_new_tokens: int) -> list[np.ndarray]:
    if prompts is None or len(prompts) == 0:
        raise ValueError("generate got an empty prompt list; pass at least one prompt.")
    rows = []
    for i, p in enumerate(prompts):
        a = np.asarray(p)
        if a.ndim != 1:
            raise ValueError(f"prompt {i} must be a flat list of token ids, got shape {a.shape}.")
        if a.size == 0:
            raise ValueError(f"prompt {i} is empty; every prompt needs at least one token.")
        if not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"prompt {i} must hold integer token ids, got dtype {a.dtype}.")
        lo, hi = int(a.min()), int(a.max())
        if lo < 0 or hi >= cfg.vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"prompt {i} has token id {bad} outside the vocabulary "
                             f"[0, {cfg.vocab_size}).")
        if a.size + max_new_tokens > cfg.max_seq_len:
            raise ValueError(
                f"prompt {i} length {a.size} + max_new_tokens {max_new_tokens} = "
                f"{a.size + max_new_tokens} exceeds the cache (cfg.max_seq_len={cfg.max_seq_len}).")
        rows.append(a.astype(np.int32))
    return rows


def _data_axes(mesh: Mesh, data_axes) -> tuple[str, ...]:
    axes = tuple(a for a in DATA_AXES if a in mesh.axis_names) if data_axes is None \
        else tuple(data_axes)
    missing = [a for a in axes if a not in mesh.axis_names]
    if missing or not axes:
        raise ValueError(f"mesh axes {mesh.axis_names} have no batch axis {missing or DATA_AXES}.")
    return axes


def generate(cfg: ModelConfig, params, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
             eos_id: int | None, pad_id: int, seed: int | jax.Array = 0,
             mesh: Mesh | None = None, data_axes: Sequence[str] | None = None) -> GenerateOutput:
    """Sample up to `max_new_tokens` tokens for each prompt (docs/api.md, Sampling).

    prompts: list of token-id lists of any lengths (left-padded internally).
    temperature=0.0 is greedy (top_k / top_p ignored). eos_id=None (or an id outside the
    vocabulary) never stops early: every row gets exactly max_new_tokens tokens (benchmarks).
    mesh: batch rows are split over its data axes (default: 'data' and 'fsdp' where present);
    params keep whatever sharding they have.
    Memory: generate keeps one per-layer copy of the weights of the last params it saw (reused
    while those arrays live; `clear_cache()` drops it), i.e. up to twice the weight memory.
    Returns GenerateOutput(tokens int32 [B, N], logprobs float32 [B, N], lengths int32 [B],
    steps): tokens after a row's EOS are pad_id with logprob 0; EOS is kept and counted.
    """
    # ---- validation: all of it before anything is traced
    _check_int("max_new_tokens", max_new_tokens, 1)
    validate_sampling(temperature, top_k, top_p)
    _check_int("pad_id", pad_id)
    if eos_id is not None:
        _check_int("eos_id", eos_id)
    rows = _validate_prompts(cfg, prompts, max_new_tokens)
    axes = _data_axes(mesh, data_axes) if mesh is not None else None
    data_size = int(np.prod([mesh.shape[a] for a in axes])) if axes else 1

    # ---- bucketing and left padding
    B = len(rows)
    Bb, Tb = bucket_shape(B, max(r.size for r in rows), data_size)
    tokens = np.zeros((Bb, Tb), np.int32)
    valid = np.zeros((Bb, Tb), bool)
    for i, r in enumerate(rows):
        tokens[i, Tb - r.size:] = r
        valid[i, Tb - r.size:] = True

    sampling = SamplingConfig(float(temperature), int(top_k), float(top_p))
    rng = jax.random.PRNGKey(seed) if isinstance(seed, numbers.Integral) else seed
    if mesh is not None:
        spec = _batch_spec_fn(mesh, axes)
        tokens, valid = jax.device_put(tokens, spec(2)), jax.device_put(valid, spec(2))
        rng = jax.device_put(rng, NamedSharding(mesh, P()))
    else:
        spec = None
    eos = int(eos_id) if eos_id is not None and 0 <= eos_id < cfg.vocab_size else None
    static = dict(cfg=cfg, max_new_tokens=int(max_new_tokens), sampling=sampling, eos_id=eos,
                  pad_id=int(pad_id), batch_spec=spec)
    key = (cfg, Bb, Tb, int(max_new_tokens), sampling, eos, int(pad_id), mesh, axes)
    layers = prepared_layers(cfg, params, mesh)
    out = _get_decode_fn(key, **static)(params, layers, tokens, valid, rng)
    if Bb != B:
        out = GenerateOutput(tokens=out.tokens[:B], logprobs=out.logprobs[:B],
                             lengths=out.lengths[:B], steps=out.steps)
    return out


generate.compile_count = compile_count
