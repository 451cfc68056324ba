"""Decoder: KV-cached decoding vs full forward, dtype policy, config validation, param counts."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numerics import assert_tree_close, permute_mlp, reorder_floor, tree_norm

from jaxrl_scale.models import (
    PRESETS, ModelConfig, extend, forward, get_config, init_cache, init_params, param_shapes)



def assert_forward_close(got, want, want_permuted):
    """got equals the forward `want` up to the rounding floor measured by the same forward
    with its MLP units permuted (numerics.permute_mlp)."""
    assert_tree_close(got, want, reorder_floor(want, want_permuted), tree_norm(want))

_fwd = jax.jit(forward, static_argnums=0)
_ext = jax.jit(extend, static_argnums=0)

CONFIGS = {
    # Qwen2 layout: q/k/v bias, untied head.
    "tiny": get_config("tiny"),
    # Everything else at once: q/k norm, head_dim != hidden/heads, o bias, llama3 RoPE, tied.
    "qwen3_llama3": get_config(
        "tiny", arch="qwen3", qk_norm=True, head_dim=24, o_bias=True, tie_word_embeddings=True,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=64)),
}


def _random_params(cfg, seed=0, dtype=np.float32):
    """Non-trivial params (random norms and biases) from numpy: no per-shape jax compiles."""
    rng = np.random.RandomState(seed)

    def make(path, shape):
        name = path[-1] if isinstance(path, tuple) else path
        if "norm" in name:
            x = 1.0 + 0.2 * rng.standard_normal(shape)
        elif name.startswith("b"):
            x = 0.1 * rng.standard_normal(shape)
        else:
            x = 0.08 * rng.standard_normal(shape)
        return jnp.asarray(x, dtype)

    shapes = param_shapes(cfg)
    return {"embed": make("embed", shapes["embed"]),
            "final_norm": make("final_norm", shapes["final_norm"]),
            **({"lm_head": make("lm_head", shapes["lm_head"])} if "lm_head" in shapes else {}),
            "layers": {k: make(k, s) for k, s in shapes["layers"].items()}}


def _decode_teacher_forced(cfg, params, prompt_BP, valid_BP, cont_BC, max_len=16):
    """Prefill the (left-padded) prompt block, then feed `cont` one token at a time.
    Returns logits [B, P + C, V] from the cache path."""
    B = prompt_BP.shape[0]
    cache = init_cache(cfg, B, max_len)
    logits, cache = _ext(cfg, params, cache, jnp.asarray(prompt_BP), jnp.asarray(valid_BP))
    out = [np.asarray(logits)]
    for t in range(cont_BC.shape[1]):
        logits, cache = _ext(cfg, params, cache, jnp.asarray(cont_BC[:, t:t + 1]),
                             jnp.ones((B, 1), bool))
        out.append(np.asarray(logits))
    assert int(cache.index) == prompt_BP.shape[1] + cont_BC.shape[1]
    np.testing.assert_array_equal(np.asarray(cache.next_pos_B),
                                  valid_BP.sum(1) + cont_BC.shape[1])
    return np.concatenate(out, axis=1)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_cached_decoding_matches_forward(name):
    """Left-padded mixed-length prompts; each row compared with the full forward over its own
    unpadded sequence (right padding leaves causal logits of the real tokens untouched)."""
    cfg = CONFIGS[name]
    params = _random_params(cfg)
    rng = np.random.RandomState(1)
    lengths, P, C = [6, 3, 5], 6, 5
    B = len(lengths)
    rows = [rng.randint(0, cfg.vocab_size, n + C) for n in lengths]
    prompt = np.zeros((B, P), np.int32)
    valid = np.zeros((B, P), bool)
    cont = np.stack([r[n:] for r, n in zip(rows, lengths)]).astype(np.int32)
    for i, (r, n) in enumerate(zip(rows, lengths)):
        prompt[i, P - n:] = r[:n]
        valid[i, P - n:] = True
    cached = _decode_teacher_forced(cfg, params, prompt, valid, cont)

    full = np.zeros((B, P + C), np.int32)  # unpadded rows, right padded to one length
    for i, r in enumerate(rows):
        full[i, :len(r)] = r
    ref, ref_p = (np.asarray(_fwd(cfg, p, jnp.asarray(full), jnp.ones((B, P + C), bool)))
                  for p in (params, permute_mlp(params)))
    assert np.all(np.isfinite(cached))
    # every real prompt position and every decoded position of each row
    got = [cached[i, P - n:] for i, n in enumerate(lengths)]
    want = [ref[i, :n + C] for i, n in enumerate(lengths)]
    assert [g.shape for g in got] == [w.shape for w in want]
    assert_forward_close(got, want, [ref_p[i, :n + C] for i, n in enumerate(lengths)])

    # the batch's own left-padded forward agrees with the cache too
    padded = np.concatenate([prompt, cont], axis=1)
    pvalid = np.concatenate([valid, np.ones_like(cont, bool)], axis=1)
    ref_pad, ref_pad_p = (np.where(pvalid[..., None], np.asarray(
        _fwd(cfg, p, jnp.asarray(padded), jnp.asarray(pvalid))), 0)
        for p in (params, permute_mlp(params)))
    assert_forward_close(np.where(pvalid[..., None], cached, 0), ref_pad, ref_pad_p)


def test_single_prefill_equals_forward_no_padding():
    cfg = CONFIGS["tiny"]
    params = _random_params(cfg, seed=2)
    tokens = np.random.RandomState(3).randint(0, cfg.vocab_size, (3, 11)).astype(np.int32)
    prompt, cont = tokens[:, :6], tokens[:, 6:]
    cached = _decode_teacher_forced(cfg, params, prompt, np.ones_like(prompt, bool), cont)
    ref, ref_p = (np.asarray(_fwd(cfg, p, jnp.asarray(tokens), jnp.ones(tokens.shape, bool)))
                  for p in (params, permute_mlp(params)))
    assert_forward_close(cached, ref, ref_p)


def test_bfloat16_compute_gives_float32_logits():
    """The accelerator policy (bfloat16 params and compute, bfloat16 KV cache) runs; logits stay
    float32 and close to the float32 model. Shapes as above so the float32 compile is reused."""
    cfg32 = CONFIGS["tiny"]
    params = _random_params(cfg32, seed=4)
    tokens = jnp.asarray(np.random.RandomState(5).randint(0, cfg32.vocab_size, (3, 11)))
    ones = jnp.ones(tokens.shape, bool)
    ref = np.asarray(_fwd(cfg32, params, tokens, ones))
    cfg = cfg32.replace(dtype="bfloat16", param_dtype="bfloat16")
    p = jax.tree.map(lambda a: a.astype(jnp.bfloat16), params)
    logits = _fwd(cfg, p, tokens, ones)
    assert logits.dtype == jnp.float32 and logits.shape == (3, 11, cfg.vocab_size)
    assert np.all(np.isfinite(np.asarray(logits)))
    assert np.max(np.abs(np.asarray(logits) - ref)) <= 0.1 * np.max(np.abs(ref))
    cache = init_cache(cfg, 3, 16)
    assert cache.k_LBSKH.dtype == jnp.bfloat16
    step, cache = _ext(cfg, p, cache, tokens[:, :6], ones[:, :6])
    assert step.dtype == jnp.float32 and int(cache.index) == 6
    assert np.max(np.abs(np.asarray(step) - ref[:, :6])) <= 0.1 * np.max(np.abs(ref))


def test_config_validation():
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        get_config("tiny", num_heads=6, num_kv_heads=4)
    with pytest.raises(ValueError, match="Unknown model preset 'nope'"):
        get_config("nope")
    with pytest.raises(ValueError, match="arch"):
        get_config("tiny", arch="gpt2")
    with pytest.raises(ValueError, match="head_dim"):
        get_config("tiny", head_dim=15)
    with pytest.raises(ValueError, match="rope_scaling"):
        get_config("tiny", rope_scaling={"rope_type": "yarn", "factor": 4.0})
    cfg = CONFIGS["qwen3_llama3"]
    assert isinstance(cfg.rope_scaling, tuple) and hash(cfg) == hash(cfg.replace())


VARIANTS = {**PRESETS, **CONFIGS}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_num_params_matches_pytree(name):
    cfg = VARIANTS[name]
    shapes = jax.eval_shape(functools.partial(init_params, cfg, 0))  # no allocation
    leaves = jax.tree.leaves(shapes)
    assert sum(int(np.prod(x.shape)) for x in leaves) == cfg.num_params()
    assert all(x.dtype == cfg.jnp_param_dtype for x in leaves)
    sizes = jax.tree.leaves(param_shapes(cfg), is_leaf=lambda x: isinstance(x, tuple))
    assert sum(int(np.prod(s)) for s in sizes) == cfg.num_params()


def test_preset_shapes():
    small = get_config("small")
    assert (small.hidden_size, small.num_layers, small.num_heads, small.num_kv_heads,
            small.intermediate_size, small.vocab_size) == (512, 8, 8, 4, 1536, 4096)
    assert 0.45e9 < get_config("qwen2.5-0.5b").num_params() < 0.52e9
    assert 1.5e9 < get_config("qwen2.5-1.5b").num_params() < 1.6e9
    assert 0.55e9 < get_config("qwen3-0.6b").num_params() < 0.65e9
    assert 1.65e9 < get_config("qwen3-1.7b").num_params() < 1.75e9
    assert isinstance(small, ModelConfig)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_dense_custom_vjp_gradients_equal_autodiff(name, monkeypatch):
    """`decoder.dense` has a hand-written VJP (for XLA:CPU's layouts); its parameter and input
    gradients must equal autodiff's through plain dot_generals."""
    from jaxrl_scale.models import decoder
    cfg = CONFIGS[name]
    params = _random_params(cfg, seed=3)
    rng = np.random.RandomState(4)
    tokens = jnp.asarray(rng.randint(0, cfg.vocab_size, (3, 7)), jnp.int32)
    valid = jnp.asarray(np.arange(7)[None] >= np.array([[0], [2], [1]]))
    w_BTV = jnp.asarray(rng.standard_normal((3, 7, cfg.vocab_size)), jnp.float32)

    def loss(p, rows=slice(None)):
        return jnp.sum(forward(cfg, p, tokens[rows], valid[rows]) * w_BTV[rows])

    got = jax.grad(loss)(params)
    monkeypatch.setattr(decoder, "_dense", lambda x, w, n_in: jax.lax.dot_general(
        x, w, decoder._dense_dims(x.ndim, n_in)))
    want = jax.grad(loss)(params)
    # the rounding floor: autodiff's gradient with the rows summed in other orders
    floor = reorder_floor(want, *[jax.grad(loss)(params, np.array(r)) for r in ([2, 0, 1],
                                                                               [1, 2, 0])])
    assert_tree_close(got, want, floor, tree_norm(want))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_shared_prompt_hidden_states_equal_full_rows(name):
    """response_hidden_states runs each group's prompt once; its hidden states at positions
    Tp - 1 .. T - 2 (and their gradients) equal hidden_states on every row."""
    from jaxrl_scale.models import decoder
    cfg = CONFIGS[name]
    params = _random_params(cfg, seed=5)
    rng = np.random.RandomState(6)
    P, G, Tp, R = 3, 4, 5, 6
    plen = np.array([5, 2, 3])                    # left-padded prompts of different lengths
    tok = rng.randint(0, cfg.vocab_size, (P * G, Tp + R))
    tok[:, :Tp] = np.repeat(tok[::G, :Tp], G, axis=0)
    valid = np.ones_like(tok, bool)
    valid[:, :Tp] = np.repeat(np.arange(Tp)[None] >= Tp - plen[:, None], G, axis=0)
    valid[:, Tp:] = np.arange(R)[None] < rng.randint(1, R + 1, (P * G, 1))   # right padding
    tok, valid = jnp.asarray(tok, jnp.int32), jnp.asarray(valid)
    w_BRD = jnp.asarray(rng.standard_normal((P * G, R, cfg.hidden_size)), jnp.float32)
    # positions Tp - 1 .. T - 2 that are real tokens (padding's hidden states are unused)
    m_BR1 = jnp.concatenate([jnp.ones((P * G, 1), bool), valid[:, Tp:-1]], axis=1)[..., None]

    def full(p):
        return decoder.hidden_states(cfg, p, tok, valid)[:, Tp - 1:-1]

    def shared(p):
        return decoder.response_hidden_states(cfg, p, tok, valid, prompt_len=Tp, group=G)

    h_full, h_full_p = (np.asarray(jax.jit(full)(p) * m_BR1)
                        for p in (params, permute_mlp(params)))
    assert_forward_close(np.asarray(jax.jit(shared)(params) * m_BR1), h_full, h_full_p)

    def full_grad(p, groups):      # the prompt groups in another order: another summation order
        rows = (np.asarray(groups)[:, None] * G + np.arange(G)).reshape(-1)
        h = decoder.hidden_states(cfg, p, tok[rows], valid[rows])[:, Tp - 1:-1]
        return jnp.sum(h * w_BRD[rows] * m_BR1[rows])

    grad_full = jax.jit(jax.grad(full_grad), static_argnums=1)
    g_full = grad_full(params, (0, 1, 2))
    g_shared = jax.jit(jax.grad(lambda p: jnp.sum(shared(p) * w_BRD * m_BR1)))(params)
    # float32 summation order differs (the prompt's gradient sums over the group first)
    floor = reorder_floor(g_full, grad_full(params, (2, 0, 1)), grad_full(params, (1, 2, 0)))
    assert_tree_close(g_shared, g_full, floor, tree_norm(g_full))
    with pytest.raises(ValueError, match="groups of 5"):
        decoder.response_hidden_states(cfg, params, tok, valid, prompt_len=Tp, group=5)
