"""generate(): greedy == a reference loop over the full forward, EOS / padding, log-probs,
bucketing without recompiles, input validation before compilation, sharding over fake devices,
and token-for-token equality with HF transformers' generate."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from numerics import assert_tree_close, permute_mlp, reorder_floor, tree_norm

from jaxrl_scale.models import extend, forward, get_config, init_cache, init_params
from jaxrl_scale.models.decoder import rope_table, unstack_layers
from jaxrl_scale.sampling import (
    bucket_shape, clear_cache, compile_count, generate, masked_logits)
from jaxrl_scale.sampling.decode import decode_step, to_step_cache

N_NEW = 32
_FIRST_CALL_COMPILES = []
PROMPTS = [[3, 17, 5], list(range(20, 30)), [99], [7, 8, 9, 10, 11, 12, 13]]  # bucket (4, 16)


@pytest.fixture(scope="module")
def model():
    cfg = get_config("tiny")
    # a larger init scale than N(0, 0.02) gives peaked, tie-free next-token distributions
    params = jax.tree.map(lambda a: a * 4.0 if a.ndim >= 2 else a, init_params(cfg, 0))
    return cfg, params


def _greedy(cfg, params, prompts=PROMPTS, **kw):
    kw = dict(max_new_tokens=N_NEW, temperature=0.0, eos_id=None, pad_id=0) | kw
    return generate(cfg, params, prompts, **kw)


@pytest.fixture(scope="module")
def greedy_out(model):
    clear_cache()  # so the first call in its bucket surely compiles
    before = compile_count()
    out = _greedy(*model)
    _FIRST_CALL_COMPILES.append(compile_count() - before)
    return out


@pytest.fixture(scope="module")
def greedy_floor(model, greedy_out):
    """The rounding floor of greedy log-probs: generate with the MLP units permuted
    (numerics.permute_mlp: the same model, the down projection summed in another order)."""
    cfg, params = model
    other = _greedy(cfg, permute_mlp(params))
    np.testing.assert_array_equal(other.tokens, greedy_out.tokens)
    return reorder_floor(np.asarray(greedy_out.logprobs), np.asarray(other.logprobs))


def assert_logprobs_close(got, want, floor):
    assert_tree_close(np.asarray(got), np.asarray(want), floor, tree_norm(np.asarray(want)))


def _reference_greedy(cfg, params, prompts, n):
    """argmax of the full (uncached) forward, one token at a time, each prompt unpadded at the
    start of its own row, and the temperature-1 log-prob of each token. Causality makes the
    tail of a fixed-size buffer irrelevant, so one shape serves every step (one compile)."""
    fwd = jax.jit(lambda t: jax.nn.log_softmax(forward(cfg, params, t), axis=-1))
    B = len(prompts)
    buf = np.zeros((B, 64), np.int32)
    for i, p in enumerate(prompts):
        buf[i, :len(p)] = p
    pos = np.array([len(p) for p in prompts])
    tokens, logps = np.zeros((B, n), np.int32), np.zeros((B, n), np.float32)
    for t in range(n):
        logp_BV = np.asarray(fwd(buf))[np.arange(B), pos - 1]
        tokens[:, t] = np.argmax(logp_BV, axis=-1)
        logps[:, t] = logp_BV[np.arange(B), tokens[:, t]]
        buf[np.arange(B), pos] = tokens[:, t]
        pos += 1
    return tokens, logps


def test_greedy_matches_full_forward_reference(model, greedy_out):
    cfg, params = model
    out = greedy_out
    assert out.tokens.shape == (len(PROMPTS), N_NEW) and out.tokens.dtype == jnp.int32
    assert out.logprobs.dtype == jnp.float32 and out.lengths.dtype == jnp.int32
    np.testing.assert_array_equal(out.lengths, N_NEW)
    tokens, logps = _reference_greedy(cfg, params, PROMPTS, N_NEW)
    tokens_p, logps_p = _reference_greedy(cfg, permute_mlp(params), PROMPTS, N_NEW)
    np.testing.assert_array_equal(out.tokens, tokens)
    np.testing.assert_array_equal(tokens_p, tokens)
    # cached decoding reproduces the full forward at every generated position
    assert_logprobs_close(out.logprobs, logps, reorder_floor(logps, logps_p))


def test_prepared_weights_follow_params(model, greedy_out):
    """generate reuses its per-layer weight copy only for the very same params arrays: new
    params (an RL update) are decoded with the new weights, never a stale copy."""
    from jaxrl_scale.sampling import decode
    cfg, params = model
    layers = decode._PREPARED.get(cfg, params, True)
    assert decode._PREPARED.get(cfg, params, True) is layers  # same arrays: reused
    updated = jax.tree.map(lambda a: a[::-1] if a.ndim >= 3 else a, params)  # permute layers
    out = _greedy(cfg, updated, PROMPTS[:2], max_new_tokens=8)
    tokens, _ = _reference_greedy(cfg, updated, PROMPTS[:2], 8)
    np.testing.assert_array_equal(out.tokens, tokens)
    assert not np.array_equal(out.tokens, greedy_out.tokens[:2, :8])  # it did change
    assert decode._PREPARED.get(cfg, params, True) is not layers  # replaced, then rebuilt


@pytest.mark.parametrize("fuse,chunks,live", [(True, (1, 2), (1, 2, 2)), (False, (3,), (1, 1, 1))])
def test_decode_step_equals_extend(model, fuse, chunks, live):
    """The loop's specialised one-token step == the decoder's generic cached `extend`, over
    several steps (later steps read cache slots the step itself wrote), with the fused and the
    plain per-layer weight layouts, and with the new slots in one chunk or split over two
    (attending to the live chunks only)."""
    cfg, params = model
    B, T, S = 3, 6, 12
    tokens = jax.random.randint(jax.random.PRNGKey(1), (B, T), 0, cfg.vocab_size)
    valid = jnp.arange(T)[None, :] >= jnp.array([0, 2, 5])[:, None]   # left padded
    steps = [(jnp.array([4, 5, 6]), jnp.array([True, False, True])),
             (jnp.array([7, 8, 9]), jnp.array([True, True, False])),
             (jnp.array([3, 2, 1]), jnp.array([True, True, True]))]

    @jax.jit
    def both(params):
        layers = unstack_layers(cfg, params, fuse=fuse)
        _, cache = extend(cfg, params, init_cache(cfg, B, S), tokens, valid)
        _, cache2 = extend(cfg, params, init_cache(cfg, B, T), tokens, valid, layers=layers)
        step = to_step_cache(cache2, chunks)
        # keys at real tokens (padding slots differ: their queries see no key at all)
        real = valid[None, :, :, None, None]
        outs = [(jnp.where(real, cache.k_LBSKH[:, :, :T], 0), jnp.where(real, cache2.k_LBSKH, 0))]
        for (tok, ok), n_live in zip(steps, live):
            ref, cache = extend(cfg, params, cache, tok[:, None], ok[:, None])
            got, step = decode_step(cfg, params, layers, step, tok, ok, live=n_live,
                                    rope_table=rope_table(cfg, S) if fuse else None)
            outs.append((got, ref[:, 0], step.next_pos_B, cache.next_pos_B, step.valid_BS,
                         cache.valid_BS[:, :T + len(steps)]))
        return outs

    outs = both(params)
    # the floor: extend's keys and logits with the MLP units permuted (numerics.permute_mlp)
    outs_p = both(permute_mlp(params))
    assert_tree_close(outs[0][1], outs[0][0], reorder_floor(outs[0][0], outs_p[0][0]),
                      tree_norm(outs[0][0]))   # prefill through prepared layers
    for (got, ref, pos, ref_pos, slots, ref_slots), out_p in zip(outs[1:], outs_p[1:]):
        assert_tree_close(got, ref, reorder_floor(ref, out_p[1]), tree_norm(ref))
        np.testing.assert_array_equal(pos, ref_pos)
        np.testing.assert_array_equal(slots, ref_slots)


def test_phase_sizes():
    """Phases cover max_new_tokens exactly; one phase when the KV cache is small next to the
    weights (nothing to save), up to MAX_PHASES of >= MIN_PHASE_TOKENS when it is not."""
    from jaxrl_scale.sampling.decode import MAX_PHASES, phase_sizes
    cfg = get_config("small")
    assert phase_sizes(cfg, 1, 16, 64) == (64,)
    assert phase_sizes(cfg, 256, 16, 64) == (16, 16, 16, 16)
    for n in (1, 5, 17, 33, 49, 100, 1000):
        sizes = phase_sizes(cfg, 1024, 16, n)
        assert sum(sizes) == n and min(sizes) >= 1 and len(sizes) <= MAX_PHASES


def test_eos_pads_after_and_lengths(model, greedy_out, greedy_floor):
    cfg, params = model
    ref = np.asarray(greedy_out.tokens)
    ref_lp = np.asarray(greedy_out.logprobs)
    # an EOS every row emits if one exists (then the loop must also exit early), else row 0's 6th
    common = set(ref[0]).intersection(*map(set, ref[1:]))
    first = lambda row, e: int(np.flatnonzero(row == e)[0]) if e in row else N_NEW  # noqa: E731
    eos = min(common, key=lambda e: max(first(r, e) for r in ref)) if common else int(ref[0, 5])
    pad = cfg.vocab_size + 7  # any int works as pad_id, even outside the vocabulary
    out = _greedy(cfg, params, eos_id=eos, pad_id=pad)
    tokens, lp, lengths = map(np.asarray, (out.tokens, out.logprobs, out.lengths))
    for i, row in enumerate(ref):
        n = min(first(row, eos) + 1, N_NEW)
        assert lengths[i] == n, i
        np.testing.assert_array_equal(tokens[i, :n], row[:n])
        assert np.all(tokens[i, n:] == pad) and np.all(lp[i, n:] == 0.0)
        assert_logprobs_close(lp[i, :n], ref_lp[i, :n], greedy_floor)
        if n < N_NEW:
            assert tokens[i, n - 1] == eos
    assert int(out.steps) == lengths.max()  # leaves the loop once every row is done


def _forward_logprobs(cfg, params, prompts, tokens, temperature, top_k=0, top_p=1.0):
    """log-probs of the generated tokens under the full forward (left-padded, valid mask)."""
    B, N = tokens.shape
    T = max(map(len, prompts))
    seq = np.zeros((B, T + N), np.int32)
    valid = np.zeros((B, T + N), bool)
    for i, p in enumerate(prompts):
        seq[i, T - len(p):T] = p
        valid[i, T - len(p):] = True
    seq[:, T:] = tokens

    @jax.jit
    def ref(seq, valid, tokens):
        logits = forward(cfg, params, seq, valid)[:, T - 1:-1]
        x = masked_logits(logits.reshape(B * N, -1), temperature, top_k, top_p)
        logp = jax.nn.log_softmax(x, axis=-1).reshape(B, N, -1)
        return jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]

    return np.asarray(ref(seq, valid, tokens))


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 20, 0.9)])
def test_sampled_logprobs_match_forward(model, temperature, top_k, top_p):
    cfg, params = model
    out = generate(cfg, params, PROMPTS, max_new_tokens=16, temperature=temperature,
                   top_k=top_k, top_p=top_p, eos_id=None, pad_id=0, seed=3)
    tokens = np.asarray(out.tokens)
    ref = _forward_logprobs(cfg, params, PROMPTS, tokens, temperature, top_k, top_p)
    assert np.all(np.isfinite(ref))  # every sampled token lies inside the top-k / top-p set
    ref_p = _forward_logprobs(cfg, permute_mlp(params), PROMPTS, tokens, temperature, top_k,
                              top_p)
    assert_logprobs_close(out.logprobs, ref, reorder_floor(ref, ref_p))
    again = generate(cfg, params, PROMPTS, max_new_tokens=16, temperature=temperature,
                     top_k=top_k, top_p=top_p, eos_id=None, pad_id=0, seed=4)
    assert not np.array_equal(np.asarray(again.tokens), tokens)  # the seed matters


def test_no_recompile_within_a_bucket(model, greedy_out, greedy_floor):
    cfg, params = model
    assert bucket_shape(3, 9) == (4, 16) and bucket_shape(5, 3) == (8, 8)
    assert bucket_shape(3, 9, data_size=8) == (8, 16) and bucket_shape(9, 1, 6) == (18, 8)
    assert _FIRST_CALL_COMPILES == [1]  # the first call in bucket (4, 16) compiled once
    before = compile_count()
    a = _greedy(cfg, params, [[1] * 16, [2] * 9, [3]])          # batch 3 -> 4, prompt 16
    b = _greedy(cfg, params, [[1] * 16, [2] * 9, [3], [4, 5]])  # batch 4, prompt 9 -> 16
    assert compile_count() == before
    assert a.tokens.shape == (3, N_NEW) and b.tokens.shape == (4, N_NEW)
    np.testing.assert_array_equal(a.tokens, b.tokens[:3])  # dummy / extra rows change nothing
    assert_logprobs_close(a.logprobs, b.logprobs[:3], greedy_floor)


@pytest.mark.parametrize("prompts,kw,word", [
    ([], {}, "empty prompt list"),
    ([[1, 2], []], {}, "prompt 1 is empty"),
    ([[1, 2], [3, 128]], {}, "outside the vocabulary"),
    ([[-1]], {}, "outside the vocabulary"),
    ([[1] * 200], dict(max_new_tokens=57), "exceeds the cache"),
    ([[1]], dict(max_new_tokens=0), "max_new_tokens"),
    ([[1]], dict(top_p=0.0), "top_p"),
    ([[1]], dict(top_p=1.01), "top_p"),
    ([[1]], dict(top_k=-1), "top_k"),
    ([[1]], dict(temperature=-0.1), "temperature"),
    ([[1.5, 2.0]], {}, "integer"),
])
def test_bad_input_raises_before_compiling(model, prompts, kw, word):
    cfg, params = model  # tiny: vocab 128, max_seq_len 256
    before = compile_count()
    kw = dict(max_new_tokens=4, eos_id=1, pad_id=0) | kw
    with pytest.raises(ValueError, match=word):
        generate(cfg, params, prompts, **kw)
    assert compile_count() == before


def test_sharded_over_8_devices_equals_unsharded(model, greedy_out, greedy_floor):
    cfg, params = model
    devices = np.array(jax.devices()[:8])
    assert devices.size == 8
    data = _greedy(cfg, params, mesh=Mesh(devices, ("data",)))
    assert data.tokens.shape == (len(PROMPTS), N_NEW)
    np.testing.assert_array_equal(data.tokens, greedy_out.tokens)
    assert_logprobs_close(data.logprobs, greedy_out.logprobs, greedy_floor)
    # params sharded over an fsdp axis, batch over data x fsdp
    mesh = Mesh(devices.reshape(2, 4), ("data", "fsdp"))
    fsdp = jax.tree.map(
        lambda a: jax.device_put(a, NamedSharding(
            mesh, P(*([None] * (a.ndim - 1) + ["fsdp"])) if a.shape[-1] % 4 == 0 else P())),
        params)
    both = _greedy(cfg, fsdp, mesh=mesh)
    np.testing.assert_array_equal(both.tokens, greedy_out.tokens)
    np.testing.assert_allclose(both.lengths, greedy_out.lengths)


HF_CASES = {  # (config class, model class, extra config): tiny random checkpoints
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=24, tie_word_embeddings=False)),
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(tie_word_embeddings=False)),
}


@pytest.mark.parametrize("case", list(HF_CASES))
def test_greedy_matches_hf_transformers(case, tmp_path):
    """Our batched, left-padded greedy decode == HF generate on each prompt alone."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from jaxrl_scale.models import load_hf
    cfg_cls, model_cls, extra = HF_CASES[case]
    hf_cfg = getattr(transformers, cfg_cls)(
        vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=96, max_position_embeddings=256, **extra)
    torch.manual_seed(0)
    hf = getattr(transformers, model_cls)(hf_cfg).float().eval()
    with torch.no_grad():  # random norms and biases too; large enough to avoid argmax near-ties
        for name, p in hf.named_parameters():
            scale, shift = (0.2, 1.0) if "norm" in name else (0.1, 0.0)
            p.copy_(shift + scale * torch.randn_like(p))
    hf.save_pretrained(tmp_path)
    cfg, params = load_hf(tmp_path)
    out = generate(cfg, params, PROMPTS, max_new_tokens=N_NEW, temperature=0.0, eos_id=None,
                   pad_id=0)
    for i, p in enumerate(PROMPTS):
        ids = torch.tensor([p])
        with torch.no_grad():
            ref = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=N_NEW, min_new_tokens=N_NEW, pad_token_id=0,
                              use_cache=True)
        assert ref[0, len(p):].tolist() == np.asarray(out.tokens[i]).tolist(), (case, i)
