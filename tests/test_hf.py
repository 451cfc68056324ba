"""HF checkpoint I/O against HF transformers: tiny random Qwen2 / Qwen3 / Llama models built here
(nothing is downloaded), logits compared in float32."""
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxrl_scale.models import (  # noqa: E402
    config_from_hf, config_to_hf, forward, get_config, load_hf, param_shapes, save_hf)
from jaxrl_scale.models import hf as hf_mod  # noqa: E402

V = 128
TOL = 1e-4
SMALL = dict(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=96, max_position_embeddings=256)

CASES = {
    # Qwen2: q/k/v bias (always), tied embeddings.
    "qwen2_tied": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    # Qwen3: q/k norm, head_dim 24 != 64/4, untied.
    "qwen3_untied": ("Qwen3Config", "Qwen3ForCausalLM",
                     dict(head_dim=24, tie_word_embeddings=False, rope_theta=1e6)),
    # Llama: plain, untied.
    "llama_untied": ("LlamaConfig", "LlamaForCausalLM",
                     dict(tie_word_embeddings=False, rope_theta=5e5)),
    # Llama: q/k/v/o bias, tied, llama3 RoPE scaling with all three frequency bands in play.
    "llama_bias_llama3": ("LlamaConfig", "LlamaForCausalLM", dict(
        tie_word_embeddings=True, attention_bias=True,
        rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0,
                             low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=64))),
}


def _tokens(seed, shape):
    return np.random.RandomState(seed).randint(0, V, shape)


def _build(case, seed=0):
    cfg_cls, model_cls, kw = CASES[case]
    hf_cfg = getattr(transformers, cfg_cls)(**SMALL, **kw)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(hf_cfg).float().eval()
    with torch.no_grad():  # randomise everything (norms, biases too) so mapping errors show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))
    return model


def _hf_logits(model, tokens):
    with torch.no_grad():
        return model(input_ids=torch.tensor(np.asarray(tokens))).logits.float().numpy()


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """case -> (HF model, checkpoint dir)."""
    out = {}
    for case in CASES:
        model = _build(case)
        d = tmp_path_factory.mktemp(case)
        model.save_pretrained(d)
        out[case] = (model, str(d))
    return out


@pytest.fixture(scope="module")
def loaded(ckpts):
    return {case: load_hf(d) for case, (_, d) in ckpts.items()}


_fwd = jax.jit(forward, static_argnums=0)
B, T = 3, 13  # one token shape everywhere: one compile per model config


def _ours(cfg, params, tokens, valid=None):
    if valid is None:
        valid = np.ones(tokens.shape, bool)
    return np.asarray(_fwd(cfg, params, jnp.asarray(tokens), jnp.asarray(valid)))


def _max_diff(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))))


# ----------------------------------------------------------------------------- logits

@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_hf(case, ckpts, loaded):
    model, _ = ckpts[case]
    cfg, params = loaded[case]
    tokens = _tokens(1, (B, T))
    ref = _hf_logits(model, tokens)
    ours = _ours(cfg, params, tokens)
    assert ours.dtype == np.float32 and ours.shape == (B, T, V)
    assert _max_diff(ours, ref) <= TOL


def test_config_mapping(loaded):
    q2, _ = loaded["qwen2_tied"]
    assert (q2.arch, q2.attention_bias, q2.o_bias, q2.qk_norm, q2.tie_word_embeddings) == (
        "qwen2", True, False, False, True)
    q3, p3 = loaded["qwen3_untied"]
    assert (q3.arch, q3.head_dim, q3.qk_norm, q3.attention_bias, q3.rope_theta) == (
        "qwen3", 24, True, False, 1e6)
    assert p3["layers"]["wq"].shape == (2, 64, 4, 24) and p3["lm_head"].shape == (64, V)
    ll, pl = loaded["llama_untied"]
    assert (ll.arch, ll.attention_bias, ll.rope_theta, ll.rope_scaling) == (
        "llama", False, 5e5, None)
    lb, pb = loaded["llama_bias_llama3"]
    assert lb.attention_bias and lb.o_bias and "lm_head" not in pb
    assert dict(lb.rope_scaling)["rope_type"] == "llama3"
    for cfg, params in loaded.values():
        assert cfg.param_dtype == "float32" and cfg.max_seq_len == 256
        n = sum(x.size for x in jax.tree.leaves(params))
        assert n == cfg.num_params()
        assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))


def test_config_from_hf_legacy_and_architectures():
    # transformers-4 style: top-level rope_theta + rope_scaling, architectures without model_type
    d = dict(SMALL, architectures=["LlamaForCausalLM"], rope_theta=5e5,
             rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    cfg = config_from_hf(d)
    assert cfg.arch == "llama" and cfg.rope_theta == 5e5 and cfg.head_dim == 16
    assert dict(cfg.rope_scaling)["factor"] == 32.0
    assert config_from_hf(dict(SMALL, model_type="qwen2"), dtype=jnp.bfloat16).param_dtype == \
        "bfloat16"
    # config_to_hf -> config_from_hf is the identity
    for name in ("tiny", "small", "rl_cpu", "qwen3-0.6b", "moe_cpu", "qwen3-30b-a3b"):
        c = get_config(name)
        back = config_from_hf(config_to_hf(c), dtype=c.param_dtype, compute_dtype=c.dtype)
        assert back.replace(arch=c.arch) == c


def test_left_padded_batch_matches_unpadded_hf(ckpts, loaded):
    """Mixed-length rows, left padded, with valid_BT: equal to each row run alone through HF."""
    for case in ("qwen2_tied", "qwen3_untied"):
        model, _ = ckpts[case]
        cfg, params = loaded[case]
        rows = [_tokens(10 + i, (n,)) for i, n in enumerate([T, 4, 7])]
        tokens = np.full((B, T), 5, np.int64)  # pad id: any valid token
        valid = np.zeros((B, T), bool)
        for i, r in enumerate(rows):
            tokens[i, T - len(r):] = r
            valid[i, T - len(r):] = True
        ours = _ours(cfg, params, tokens, valid)
        for i, r in enumerate(rows):
            ref = _hf_logits(model, r[None])[0]
            assert _max_diff(ours[i, T - len(r):], ref) <= TOL, (case, i)


# ----------------------------------------------------------------------------- sharding, saving

def test_sharded_checkpoint_loads_identically(ckpts, loaded, tmp_path):
    model, _ = ckpts["llama_untied"]
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    assert os.path.exists(tmp_path / "model.safetensors.index.json")
    assert len([f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]) > 2
    cfg, params = load_hf(tmp_path)
    cfg0, params0 = loaded["llama_untied"]
    assert cfg == cfg0
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                 params, params0)


@pytest.mark.parametrize("case", ["qwen2_tied", "qwen3_untied", "llama_bias_llama3"])
def test_save_hf_loads_in_transformers(case, ckpts, loaded, tmp_path):
    model, _ = ckpts[case]
    cfg, params = loaded[case]
    shard = case == "qwen3_untied"
    save_hf(tmp_path, cfg, params, max_shard_bytes=50_000 if shard else None)
    assert os.path.exists(tmp_path / "model.safetensors.index.json") == shard
    hf2, info = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, output_loading_info=True, dtype=torch.float32)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info["mismatched_keys"], info
    assert type(hf2).__name__ == type(model).__name__
    tokens = _tokens(2, (2, 10))
    ref = _hf_logits(model, tokens)
    assert _max_diff(_hf_logits(hf2.eval(), tokens), ref) <= TOL
    cfg2, params2 = load_hf(tmp_path)  # and back through load_hf, bit-exact
    assert cfg2 == cfg
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                 params2, params)


def test_save_hf_from_init_params_bf16(tmp_path):
    """A preset saved in bfloat16 (tiny = Qwen2 layout) loads in transformers and in load_hf."""
    # tiny, with the shapes of the qwen2_tied checkpoint so the jitted forward is reused
    cfg = get_config("tiny", param_dtype="bfloat16", tie_word_embeddings=True,
                     intermediate_size=SMALL["intermediate_size"])
    rng = np.random.RandomState(3)  # numpy init: eager jax.random compiles per shape (slow)
    params = jax.tree.map(lambda s: jnp.asarray(0.1 * rng.standard_normal(s), jnp.bfloat16),
                          param_shapes(cfg), is_leaf=lambda x: isinstance(x, tuple))
    save_hf(tmp_path, cfg, params)
    hf_cfg = json.load(open(tmp_path / "config.json"))
    assert hf_cfg["model_type"] == "qwen2" and hf_cfg["torch_dtype"] == "bfloat16"
    hf2, info = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, output_loading_info=True, dtype=torch.float32)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    cfg32, params32 = load_hf(tmp_path)  # bf16 on disk -> float32 params
    assert params32["embed"].dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(params32["embed"]),
                                  np.asarray(params["embed"].astype(jnp.float32)))
    tokens = _tokens(4, (B, T))
    assert _max_diff(_ours(cfg32, params32, tokens), _hf_logits(hf2, tokens)) <= TOL
    cfg16, params16 = load_hf(tmp_path, dtype="bfloat16")
    assert cfg16.param_dtype == cfg16.dtype == "bfloat16"
    assert params16["layers"]["wq"].dtype == jnp.bfloat16


# ----------------------------------------------------------------------------- bad input

@pytest.fixture
def no_tensor_reads(monkeypatch):
    """Fail if load_hf reads tensor data: errors must come from config + headers only."""
    real = hf_mod.safe_open

    class Guard:
        def __init__(self, *a, **k):
            self._f = real(*a, **k)

        def __enter__(self):
            self._f.__enter__()
            return self

        def __exit__(self, *a):
            return self._f.__exit__(*a)

        def keys(self):
            return self._f.keys()

        def get_slice(self, name):
            return self._f.get_slice(name)

        def get_tensor(self, name):
            raise AssertionError(f"tensor data read before validation finished ({name})")

    monkeypatch.setattr(hf_mod, "safe_open", Guard)


def _copy(ckpts, case, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(ckpts[case][1], dst)
    return dst


def _edit_config(d, **kw):
    p = d / "config.json"
    c = json.load(open(p))
    c.update(kw)
    json.dump(c, open(p, "w"))


def _rewrite_weights(d, fn):
    from safetensors.numpy import load_file, save_file
    p = d / "model.safetensors"
    t = fn(load_file(p))
    save_file(t, p, metadata={"format": "pt"})


def test_error_unsupported_model_type(ckpts, tmp_path, no_tensor_reads):
    d = _copy(ckpts, "llama_untied", tmp_path)
    _edit_config(d, model_type="mistral", architectures=["MistralForCausalLM"])
    with pytest.raises(ValueError, match=r"model_type='mistral'.*supported.*llama"):
        load_hf(d)


@pytest.mark.parametrize("kw,match", [
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}), "yarn"),
    (dict(mlp_bias=True), "mlp_bias"),
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(use_sliding_window=True), "sliding_window"),
])
def test_error_unsupported_features(kw, match):
    with pytest.raises(ValueError, match=match):
        config_from_hf(dict(SMALL, model_type="llama", **kw))


def test_error_missing_tensor(ckpts, tmp_path, no_tensor_reads):
    d = _copy(ckpts, "qwen3_untied", tmp_path)
    _rewrite_weights(d, lambda t: {k: v for k, v in t.items()
                                   if k != "model.layers.1.self_attn.k_norm.weight"})
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.k_norm\.weight.*missing"
                                         r".*model\.safetensors"):
        load_hf(d)


def test_error_missing_lm_head_when_untied(ckpts, tmp_path, no_tensor_reads):
    d = _copy(ckpts, "qwen2_tied", tmp_path)
    _edit_config(d, tie_word_embeddings=False)
    with pytest.raises(ValueError, match=r"lm_head\.weight.*missing"):
        load_hf(d)


def test_error_shape_mismatch(ckpts, tmp_path, no_tensor_reads):
    d = _copy(ckpts, "llama_untied", tmp_path)
    _edit_config(d, intermediate_size=80)
    with pytest.raises(ValueError, match=r"mlp\.gate_proj\.weight.*shape \[96, 64\].*"
                                         r"expected \[80, 64\]"):
        load_hf(d)
    d2 = tmp_path / "b"
    shutil.copytree(ckpts["qwen2_tied"][1], d2)
    _rewrite_weights(d2, lambda t: {**t, "model.layers.0.self_attn.q_proj.bias":
                                    t["model.layers.0.self_attn.q_proj.bias"][:32]})
    with pytest.raises(ValueError, match=r"q_proj\.bias.*\[32\].*expected \[64\]"):
        load_hf(d2)


def test_error_unexpected_tensor(ckpts, tmp_path, no_tensor_reads):
    d = _copy(ckpts, "llama_untied", tmp_path)
    _rewrite_weights(d, lambda t: {**t, "model.layers.0.mlp.gate_proj.bias":
                                   np.zeros(96, np.float32)})
    with pytest.raises(ValueError, match=r"unexpected.*gate_proj\.bias"):
        load_hf(d)


def test_error_missing_files(ckpts, tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_hf(tmp_path / "nowhere")
    d = _copy(ckpts, "llama_untied", tmp_path)
    os.remove(d / "config.json")
    with pytest.raises(ValueError, match="config.json"):
        load_hf(d)
    d2 = tmp_path / "b"
    shutil.copytree(ckpts["llama_untied"][1], d2)
    os.remove(d2 / "model.safetensors")
    with pytest.raises(ValueError, match="model.safetensors"):
        load_hf(d2)
