"""Hugging Face checkpoint I/O: config.json <-> ModelConfig, safetensors <-> params pytree.

Supported families (decoder-only, SwiGLU, RMSNorm, full causal attention):
  qwen2  (Qwen2ForCausalLM): q/k/v bias, no o bias.
  qwen3  (Qwen3ForCausalLM): per-head q/k RMSNorm, explicit head_dim, optional attention_bias.
  llama  (LlamaForCausalLM): optional attention_bias (q/k/v/o), RoPE plain or "llama3" scaling.
  qwen3_moe (Qwen3MoeForCausalLM): Qwen3 attention, every layer a top-k mixture of experts
         (decoder_sparse_step=1, no mlp_only_layers: Qwen3-30B-A3B's layout).

HF stores torch Linear weights as [out, in]; our layout (decoder.py) stores [in, ...out]:
  wq [D, N, H] = q_proj.weight.T.reshape(D, N, H);  wo [N, H, D] = o_proj.weight.T.reshape(N, H, D)
  w_gate/w_up [D, F] = weight.T;  w_down [F, D] = down_proj.weight.T;  lm_head [D, V] = weight.T
  MoE: router [D, E] = mlp.gate.weight.T; expert_gate[e] / expert_up[e] [D, F] =
  mlp.experts.{e}.gate_proj / up_proj .weight.T; expert_down[e] [F, D] = down_proj.weight.T.
  That per-expert layout is what transformers 5.x writes to disk (it fuses the experts into
  3-D gate_up_proj [E, 2F, D] / down_proj [E, D, F] parameters only in memory); load_hf also
  reads checkpoints stored in that fused layout. save_hf writes the per-expert one.

Every check (architecture, config.json's field types, tensor names, shapes, each safetensors
header against its file's size) runs on config.json and the safetensors headers before any
tensor data is read (`check_hf`): a truncated or corrupt file, or a config.json that does not
describe a model, is an HFCheckpointError (a ValueError) naming the file, and nothing of the
checkpoint is used.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Callable, Iterator

import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from jaxrl_scale.models.config import ModelConfig
from jaxrl_scale.models.decoder import Params, param_shapes
from jaxrl_scale.numbers import write_json

__all__ = ["load_hf", "check_hf", "save_hf", "config_from_hf", "config_to_hf",
           "HFCheckpointError", "CheckpointNotFoundError"]

_ARCH_OF_CLASS = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
                  "Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3_moe"}
_CLASS_OF_ARCH = {v: k for k, v in _ARCH_OF_CLASS.items()}
_SUPPORTED = tuple(sorted(_CLASS_OF_ARCH))
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class HFCheckpointError(ValueError):
    """An HF checkpoint that cannot be used as it is: a file missing, truncated or corrupt, a
    config.json field of the wrong type, an unsupported architecture, tensors that do not
    match config.json. The message names the file and the field or tensor."""


class CheckpointNotFoundError(HFCheckpointError, FileNotFoundError):
    """A checkpoint directory or file is missing (a ValueError and a FileNotFoundError)."""


_err = HFCheckpointError


def _int(d: dict, key: str, default: Any = None, lowest: int = 1) -> Any:
    """config.json's integer field `key` (`default` when absent or null): a JSON integer >=
    lowest, else an HFCheckpointError naming it (8.5 or "8" is not silently truncated)."""
    v = d.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < lowest:
        raise _err(f"config.json {key}={v!r} must be an integer >= {lowest}.")
    return v


def _num(d: dict, key: str, default: float, positive: bool = True) -> float:
    """config.json's number field `key` (`default` when absent or null): finite, and > 0
    (positive) or >= 0."""
    v = d.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or \
            v < 0 or (positive and v == 0):
        raise _err(f"config.json {key}={v!r} must be a finite number "
                   f"{'> 0' if positive else '>= 0'}.")
    return float(v)


# ----------------------------------------------------------------------------- config

def _rope_from_hf(d: dict) -> tuple[float, tuple | None]:
    """(rope_theta, ModelConfig.rope_scaling) from either transformers-5 `rope_parameters` or
    transformers-4 `rope_theta` + `rope_scaling`."""
    rp = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if not isinstance(rp, dict):
        raise _err(f"config.json rope_parameters/rope_scaling={rp!r} must be a dict or null.")
    if rp and all(isinstance(v, dict) or v is None for v in rp.values()):
        # nested per layer type, e.g. {"full_attention": {...}}: fine if they all agree
        subs = [v for v in rp.values() if v is not None]
        if any(s != subs[0] for s in subs):
            raise _err(f"config.json rope_parameters={rp!r}: different RoPE per layer type "
                       "is not supported; all layers must share one RoPE.")
        rp = subs[0] if subs else {}
    theta = _num(rp, "rope_theta", _num(d, "rope_theta", 0.0, False), False) or 10000.0
    partial = rp.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise _err(f"config.json partial_rotary_factor={partial} is not supported; "
                   "only full rotary embeddings (1.0).")
    rope_type = rp.get("rope_type", rp.get("type", "default")) or "default"
    if rope_type == "default":
        return theta, None
    if rope_type == "llama3":
        scaling = {"rope_type": "llama3"}
        for k in _LLAMA3_KEYS:
            v = rp.get(k)
            if v is None and k == "original_max_position_embeddings":
                v = d.get("original_max_position_embeddings", d.get("max_position_embeddings"))
            if v is None:
                raise _err(f"config.json rope_parameters: rope_type 'llama3' needs {k!r}.")
            scaling[k] = _num({k: v}, k, 0.0) if k != "original_max_position_embeddings" \
                else _int({k: v}, k)
        return theta, tuple(sorted(scaling.items()))
    raise _err(f"config.json rope_type={rope_type!r} (rope_parameters/rope_scaling) is not "
               "supported; supported: 'default' (no scaling) and 'llama3'.")


def config_from_hf(hf_config: dict | Any, *, dtype: Any = None,
                   compute_dtype: Any = None) -> ModelConfig:
    """ModelConfig from an HF config (the config.json dict, a transformers config, or a path
    to config.json or its directory). Parameters use `dtype` (default float32); matmuls use
    `compute_dtype` (default: `dtype`), e.g. float32 master weights with bfloat16 compute."""
    d = hf_config
    if isinstance(d, (str, os.PathLike)):
        d = _read_config_json(d)
    elif hasattr(d, "to_dict"):
        d = d.to_dict()
    if not isinstance(d, dict):
        raise _err(f"config_from_hf expects a config.json dict, got {type(hf_config)}.")
    d = dict(d)
    arch = d.get("model_type")
    if arch is None:
        classes = d.get("architectures") or []
        arch = next((_ARCH_OF_CLASS[c] for c in classes if c in _ARCH_OF_CLASS), None)
        if arch is None:
            raise _err(f"config.json has no model_type and architectures={classes!r} names "
                       f"no supported class; supported: {sorted(_ARCH_OF_CLASS)}.")
    if arch not in _SUPPORTED:
        raise _err(f"config.json model_type={arch!r} is not supported; supported model_type: "
                   f"{list(_SUPPORTED)}.")
    classes = d.get("architectures") or []
    if classes and not any(c in _ARCH_OF_CLASS for c in classes):
        raise _err(f"config.json architectures={classes!r} is not supported; supported: "
                   f"{sorted(_ARCH_OF_CLASS)} (causal LM heads only).")

    missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers",
                           "num_attention_heads", "intermediate_size") if d.get(k) is None]
    if missing:
        raise _err(f"config.json is missing required field(s) {missing}.")
    act = d.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise _err(f"config.json hidden_act={act!r} is not supported; only 'silu' (SwiGLU).")
    if d.get("mlp_bias"):
        raise _err("config.json mlp_bias=true is not supported; only bias-free MLPs.")
    if d.get("use_sliding_window"):
        raise _err("config.json use_sliding_window=true is not supported; only full "
                   "causal attention.")
    layer_types = d.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types):
        raise _err(f"config.json layer_types={sorted(set(layer_types))} is not supported; "
                   "only 'full_attention'.")
    heads, hidden = _int(d, "num_attention_heads"), _int(d, "hidden_size")
    head_dim = _int(d, "head_dim") or hidden // heads
    theta, scaling = _rope_from_hf(d)
    if arch == "qwen2":
        attention_bias, o_bias, qk_norm = True, False, False
    else:
        attention_bias = o_bias = bool(d.get("attention_bias", False))
        qk_norm = arch in ("qwen3", "qwen3_moe")
    moe_kw = {}
    if arch == "qwen3_moe":
        moe_kw = _moe_from_hf(d)
    dt = jnp.dtype(dtype).name if dtype is not None else "float32"
    default_len = {"llama": 2048, "qwen2": 32768, "qwen3": 32768, "qwen3_moe": 32768}[arch]
    try:
        return ModelConfig(
            vocab_size=_int(d, "vocab_size"), hidden_size=hidden,
            num_layers=_int(d, "num_hidden_layers"), num_heads=heads,
            num_kv_heads=_int(d, "num_key_value_heads") or heads, head_dim=head_dim,
            intermediate_size=_int(d, "intermediate_size"), rope_theta=theta,
            rope_scaling=scaling, rms_norm_eps=_num(d, "rms_norm_eps", 1e-6),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=attention_bias, o_bias=o_bias, qk_norm=qk_norm,
            max_seq_len=_int(d, "max_position_embeddings") or default_len, arch=arch,
            param_dtype=dt,
            dtype=jnp.dtype(compute_dtype).name if compute_dtype is not None else dt, **moe_kw)
    except HFCheckpointError:
        raise
    except ValueError as e:   # ModelConfig's own checks (e.g. heads vs kv heads)
        raise _err(f"config.json describes a model jaxrl_scale cannot build: {e}") from None


def _moe_from_hf(d: dict) -> dict:
    """ModelConfig MoE fields of a qwen3_moe config.json (transformers 5 writes the expert
    count as num_local_experts, the released checkpoints as num_experts)."""
    E = d.get("num_experts", d.get("num_local_experts"))
    missing = [k for k, v in (("num_experts", E), ("num_experts_per_tok", d.get(
        "num_experts_per_tok")), ("moe_intermediate_size", d.get("moe_intermediate_size")))
               if v is None]
    if missing:
        raise _err(f"config.json (model_type 'qwen3_moe') is missing {missing}.")
    step = _int(d, "decoder_sparse_step", 1, lowest=0) or 1
    dense_layers = list(d.get("mlp_only_layers") or [])
    if step != 1 or dense_layers:
        raise _err(f"config.json decoder_sparse_step={step}, mlp_only_layers={dense_layers} "
                   "is not supported; only every layer sparse (decoder_sparse_step=1, "
                   "mlp_only_layers=[]), as in Qwen3-30B-A3B.")
    return dict(num_experts=_int({"num_experts": E}, "num_experts"),
                num_experts_per_tok=_int(d, "num_experts_per_tok"),
                moe_intermediate_size=_int(d, "moe_intermediate_size"),
                norm_topk_prob=bool(d.get("norm_topk_prob", False)),
                router_aux_loss_coef=_num(d, "router_aux_loss_coef", 0.001, positive=False))


def _hf_arch(cfg: ModelConfig) -> str:
    """The HF family that represents cfg's flags exactly (arch is only a hint)."""
    if cfg.num_experts:
        if not cfg.qk_norm or cfg.attention_bias != cfg.o_bias:
            raise ValueError("a mixture-of-experts model is saved as HF qwen3_moe, which needs "
                             "qk_norm=True and attention_bias == o_bias.")
        return "qwen3_moe"
    if cfg.qk_norm:
        if cfg.attention_bias != cfg.o_bias:
            raise ValueError("Qwen3 (qk_norm) needs attention_bias == o_bias to be saved for HF.")
        return "qwen3"
    if cfg.attention_bias and not cfg.o_bias:
        return "qwen2"
    if cfg.o_bias and not cfg.attention_bias:
        raise ValueError("o_bias without attention_bias has no HF equivalent.")
    return "llama"


def config_to_hf(cfg: ModelConfig) -> dict:
    """config.json dict that transformers (4.x and 5.x) reads as the same model."""
    arch = _hf_arch(cfg)
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling is not None:
        rope.update(dict(cfg.rope_scaling))
    d = {
        "architectures": [_CLASS_OF_ARCH[arch]],
        "model_type": arch,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": rope,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": cfg.param_dtype,
        "dtype": cfg.param_dtype,
    }
    if arch == "qwen2":
        d.update(use_sliding_window=False, sliding_window=None, max_window_layers=cfg.num_layers)
    elif arch == "qwen3":
        d.update(attention_bias=cfg.attention_bias, use_sliding_window=False,
                 sliding_window=None, max_window_layers=cfg.num_layers)
    elif arch == "qwen3_moe":
        d.update(attention_bias=cfg.attention_bias, use_sliding_window=False,
                 sliding_window=None, max_window_layers=cfg.num_layers,
                 num_experts=cfg.num_experts, num_experts_per_tok=cfg.num_experts_per_tok,
                 moe_intermediate_size=cfg.moe_intermediate_size,
                 norm_topk_prob=cfg.norm_topk_prob, decoder_sparse_step=1, mlp_only_layers=[],
                 router_aux_loss_coef=cfg.router_aux_loss_coef, output_router_logits=False)
    else:
        d.update(attention_bias=cfg.attention_bias, mlp_bias=False)
    return d


# ----------------------------------------------------------------------------- name mapping

def _ident(a):
    return a


def _spec(cfg: ModelConfig, fused_experts: bool = False
          ) -> list[tuple[tuple[str, ...], str, tuple[int, ...], Callable, Callable]]:
    """(our path, HF name, HF shape, hf->ours, ours->hf) for every tensor. A name with one
    "{}" is one tensor per layer, with two ("{}" layer, "{}" expert) one per layer and expert.
    fused_experts: the experts as transformers 5's in-memory 3-D tensors (load only)."""
    D, V, F = cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size
    N, K, H = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim

    def lin_in(*out):  # torch [out, in] -> ours [in, *out]
        return (lambda a: a.T.reshape(a.shape[1], *out),
                lambda a: a.reshape(a.shape[0], -1).T)

    def lin_out(*inn):  # torch [out, in] -> ours [*in, out]  (o_proj)
        return (lambda a: a.T.reshape(*inn, a.shape[0]),
                lambda a: a.reshape(-1, a.shape[-1]).T)

    def vec(*shape):
        return (lambda a: a.reshape(shape), lambda a: a.reshape(-1))

    att = "model.layers.{}.self_attn."
    mlp = "model.layers.{}.mlp."
    layer = [
        ("attn_norm", "model.layers.{}.input_layernorm.weight", (D,), (_ident, _ident)),
        ("wq", att + "q_proj.weight", (N * H, D), lin_in(N, H)),
        ("wk", att + "k_proj.weight", (K * H, D), lin_in(K, H)),
        ("wv", att + "v_proj.weight", (K * H, D), lin_in(K, H)),
        ("wo", att + "o_proj.weight", (D, N * H), lin_out(N, H)),
        ("mlp_norm", "model.layers.{}.post_attention_layernorm.weight", (D,), (_ident, _ident)),
    ]
    if not cfg.num_experts:
        layer += [
            ("w_gate", mlp + "gate_proj.weight", (F, D), (np.transpose, np.transpose)),
            ("w_up", mlp + "up_proj.weight", (F, D), (np.transpose, np.transpose)),
            ("w_down", mlp + "down_proj.weight", (D, F), (np.transpose, np.transpose)),
        ]
    elif fused_experts:
        E, Fe = cfg.num_experts, cfg.moe_intermediate_size
        swap = (lambda a: np.swapaxes(a, -1, -2))
        layer += [
            ("router", mlp + "gate.weight", (E, D), (np.transpose, np.transpose)),
            ("expert_gate", mlp + "experts.gate_up_proj", (E, 2 * Fe, D),
             (lambda a: swap(a[:, :Fe]), None)),
            ("expert_up", mlp + "experts.gate_up_proj", (E, 2 * Fe, D),
             (lambda a: swap(a[:, Fe:]), None)),
            ("expert_down", mlp + "experts.down_proj", (E, D, Fe), (swap, None)),
        ]
    else:
        E, Fe = cfg.num_experts, cfg.moe_intermediate_size
        ex = mlp + "experts.{}."
        layer += [
            ("router", mlp + "gate.weight", (E, D), (np.transpose, np.transpose)),
            ("expert_gate", ex + "gate_proj.weight", (Fe, D), (np.transpose, np.transpose)),
            ("expert_up", ex + "up_proj.weight", (Fe, D), (np.transpose, np.transpose)),
            ("expert_down", ex + "down_proj.weight", (D, Fe), (np.transpose, np.transpose)),
        ]
    if cfg.attention_bias:
        layer += [("bq", att + "q_proj.bias", (N * H,), vec(N, H)),
                  ("bk", att + "k_proj.bias", (K * H,), vec(K, H)),
                  ("bv", att + "v_proj.bias", (K * H,), vec(K, H))]
    if cfg.o_bias:
        layer += [("bo", att + "o_proj.bias", (D,), (_ident, _ident))]
    if cfg.qk_norm:
        layer += [("q_norm", att + "q_norm.weight", (H,), (_ident, _ident)),
                  ("k_norm", att + "k_norm.weight", (H,), (_ident, _ident))]
    spec = [(("embed",), "model.embed_tokens.weight", (V, D), _ident, _ident)]
    spec += [(("layers", k), n, s, f, b) for k, n, s, (f, b) in layer]
    spec.append((("final_norm",), "model.norm.weight", (D,), _ident, _ident))
    if not cfg.tie_word_embeddings:
        spec.append((("lm_head",), "lm_head.weight", (V, D), np.transpose, np.transpose))
    return spec


def _indices(cfg, name) -> list[tuple[int, ...]]:
    """The format arguments of `name`: (), (layer,) or (layer, expert)."""
    n = name.count("{}")
    if n == 2:
        return [(i, e) for i in range(cfg.num_layers) for e in range(cfg.num_experts)]
    return [(i,) for i in range(cfg.num_layers)] if n == 1 else [()]


def _names(cfg, name):
    return [name.format(*ix) for ix in _indices(cfg, name)]


# ----------------------------------------------------------------------------- load

def _read_config_json(path) -> dict:
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.isfile(path):
        raise CheckpointNotFoundError(f"HF config not found: {path} does not exist.")
    return _read_json_object(path)


def _read_json_object(path: str) -> dict:
    with open(path, "rb") as f:
        raw = f.read()
    try:
        d = json.loads(raw)
    except ValueError as e:   # JSONDecodeError, or bytes that are not UTF-8
        raise _err(f"{path} is not valid JSON: {e}") from None
    if not isinstance(d, dict):
        raise _err(f"{path} holds a JSON {type(d).__name__}, not an object.")
    return d


def _weight_map(path: str) -> dict[str, str]:
    """tensor name -> safetensors file (absolute path)."""
    index = os.path.join(path, INDEX_FILE)
    single = os.path.join(path, SINGLE_FILE)
    if os.path.isfile(index):
        wm = _read_json_object(index).get("weight_map")
        if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
            raise _err(f"{index} has no 'weight_map' dict of tensor name -> file name.")
        for fname in sorted(set(wm.values())):
            if not os.path.isfile(os.path.join(path, fname)):
                raise CheckpointNotFoundError(
                        f"shard {fname!r} listed in {index} does not exist.")
        return {k: os.path.join(path, v) for k, v in wm.items()}
    if os.path.isfile(single):
        return {k: single for k in safetensors_header(single)}
    raise CheckpointNotFoundError(
            f"no weights in {path}: expected {SINGLE_FILE} or {INDEX_FILE} (only safetensors "
            "checkpoints are supported).")


# bytes per element of the safetensors dtypes this loader reads; the format's others
_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
                "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4,
                "I64": 8, "U64": 8, "F64": 8}
_DTYPES_NOT_READ = ("F4", "F6_E2M3", "F6_E3M2", "C64")
_HEADER_MAX = 100 * 2 ** 20   # safetensors' own limit on the header's JSON


def safetensors_header(fname: str) -> dict[str, dict]:
    """{tensor name: {"dtype", "shape", "data_offsets"}} of a safetensors file, read and checked
    without the library: the 8-byte header length, the header's JSON, and every tensor's byte
    span against its shape and dtype, the spans tiling the data exactly to the end of the file.
    A truncated or corrupt file is an HFCheckpointError naming it, before any tensor is read
    (so nothing of it is used)."""
    size = os.path.getsize(fname)

    def bad(why: str) -> HFCheckpointError:
        return _err(f"{fname} is truncated or corrupt: {why}.")

    with open(fname, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise bad(f"{size} bytes, less than the 8-byte header length")
        n = int.from_bytes(head, "little")
        if n > min(size - 8, _HEADER_MAX):
            raise bad(f"the header length field says {n} bytes, " + (
                f"the file has {size - 8} after it" if n > size - 8 else
                f"over the format's {_HEADER_MAX >> 20} MiB limit"))
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except ValueError as e:
        raise bad(f"its header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise bad(f"its header is a JSON {type(header).__name__}, not an object")
    header.pop("__metadata__", None)
    spans = []
    for name, t in header.items():
        try:
            dtype, shape, (begin, end) = t["dtype"], list(t["shape"]), t["data_offsets"]
            ok = isinstance(dtype, str) and begin <= end and all(
                isinstance(x, int) and not isinstance(x, bool) and x >= 0
                for x in (*shape, begin, end))
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok:
            raise bad(f"tensor {name!r} has a malformed header entry {str(t)[:120]}")
        if dtype in _DTYPES_NOT_READ:
            raise _err(f"{fname}: tensor {name!r} has dtype {dtype}, which this loader does "
                       f"not read (it reads {', '.join(_DTYPE_BYTES)}).")
        if dtype not in _DTYPE_BYTES:
            raise bad(f"tensor {name!r} has dtype {dtype[:20]!r}, which safetensors does not "
                      "define")
        if end - begin != math.prod(shape) * _DTYPE_BYTES[dtype]:
            raise bad(f"tensor {name!r} ({dtype} {shape}) spans {end - begin} bytes, its shape "
                      f"needs {math.prod(shape) * _DTYPE_BYTES[dtype]}")
        spans.append((begin, end, name))
    at = 0
    for begin, end, name in sorted(spans):
        if begin != at:
            raise bad(f"tensor {name!r}'s data starts at byte {begin} of the data, expected {at}")
        at = end
    if 8 + n + at != size:
        raise bad(f"the header describes {at} bytes of tensor data, the file holds "
                  f"{size - 8 - n}")
    return header


def _header_shapes(weight_map: dict[str, str]) -> dict[str, tuple[int, ...]]:
    shapes = {}
    by_file: dict[str, list[str]] = {}
    for name, fname in weight_map.items():
        by_file.setdefault(fname, []).append(name)
    for fname, names in by_file.items():
        header = safetensors_header(fname)
        for name in names:
            if name not in header:
                raise _err(f"tensor {name!r} is listed in the index for "
                           f"{os.path.basename(fname)} but that file does not hold it.")
            shapes[name] = tuple(header[name]["shape"])
    return shapes


def _checked(path: str, dtype: Any, compute_dtype: Any):
    """(ModelConfig, weight map, tensor spec): every check of `check_hf`."""
    if not os.path.isdir(path):
        raise CheckpointNotFoundError(f"HF checkpoint directory {path} does not exist.")
    cfg = config_from_hf(_read_config_json(path), dtype=dtype, compute_dtype=compute_dtype)
    weight_map = _weight_map(path)
    shapes = _header_shapes(weight_map)
    fused = cfg.num_experts > 0 and "model.layers.0.mlp.experts.down_proj" in shapes
    spec = _spec(cfg, fused_experts=fused)

    expected = set()
    for _, name, shape, _, _ in spec:
        for n in _names(cfg, name):
            expected.add(n)
            if n not in shapes:
                where = (os.path.join(path, INDEX_FILE) if os.path.isfile(
                    os.path.join(path, INDEX_FILE)) else os.path.join(path, SINGLE_FILE))
                raise _err(f"tensor {n!r} is missing from {where} (needed by "
                           f"model_type={cfg.arch!r}).")
            if shapes[n] != shape:
                raise _err(f"tensor {n!r} in {os.path.basename(weight_map[n])} has shape "
                           f"{list(shapes[n])}, expected {list(shape)} from config.json.")
    allowed = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    extra = sorted(n for n in shapes if n not in expected and n not in allowed
                   and not n.endswith("rotary_emb.inv_freq"))
    if extra:
        more = f" (+{len(extra) - 5} more)" if len(extra) > 5 else ""
        raise _err(f"unexpected tensors in {path} for model_type={cfg.arch!r}: "
                   f"{extra[:5]}{more}; is config.json right for these weights?")
    return cfg, weight_map, spec


def check_hf(path, *, dtype: Any = None, compute_dtype: Any = None) -> ModelConfig:
    """The ModelConfig of the HF checkpoint directory `path` after every check `load_hf` makes
    before it reads tensor data: config.json (architecture, field types), each safetensors
    file's header against the file's size, the tensor names and shapes against config.json.
    Reads config.json and the headers only (cheap at any model size); HFCheckpointError
    naming the file otherwise."""
    return _checked(os.fspath(path), dtype, compute_dtype)[0]


def load_hf(path, *, dtype: Any = None, compute_dtype: Any = None
            ) -> tuple[ModelConfig, Params]:
    """Load an HF checkpoint directory -> (ModelConfig, params).

    Reads config.json and model.safetensors or a sharded model.safetensors.index.json. `dtype`
    (default float32) is the param dtype, `compute_dtype` (default `dtype`) the matmuls'.
    Raises HFCheckpointError (a ValueError) naming the problem (unsupported architecture,
    a config.json field of the wrong type, missing / unexpected tensor, wrong shape, missing,
    truncated or corrupt file) before reading any tensor data (`check_hf`).
    """
    cfg, weight_map, spec = _checked(os.fspath(path), dtype, compute_dtype)

    np_dt = np.dtype(jnp.dtype(cfg.param_dtype))
    handles: dict[str, Any] = {}

    def get(name):
        fname = weight_map[name]
        try:   # the headers are checked: only a file changed since then fails here
            if fname not in handles:
                handles[fname] = safe_open(fname, framework="np")
            return handles[fname].get_tensor(name)
        except SafetensorError as e:
            raise _err(f"{fname}: cannot read tensor {name!r} ({e}).") from None

    ours = param_shapes(cfg)
    params: Params = {"layers": {}}
    try:
        for key, name, _, to_ours, _ in spec:
            target = ours[key[0]] if len(key) == 1 else ours["layers"][key[1]]
            if "{}" in name:  # stacked over layers (and experts), filled one at a time
                out = np.empty(target, np_dt)
                for ix in _indices(cfg, name):
                    out[ix] = to_ours(get(name.format(*ix))).astype(np_dt, copy=False)
            else:
                out = np.ascontiguousarray(to_ours(get(name)).astype(np_dt, copy=False))
            assert out.shape == tuple(target), (key, out.shape, target)
            arr = jnp.asarray(out)
            del out
            if len(key) == 1:
                params[key[0]] = arr
            else:
                params["layers"][key[1]] = arr
    finally:
        for h in handles.values():
            try:
                h.__exit__(None, None, None)
            except Exception:  # pragma: no cover - older safetensors handles need no closing
                pass
    return cfg, params


# ----------------------------------------------------------------------------- save

def _hf_tensors(cfg: ModelConfig, params: Params) -> Iterator[tuple[str, tuple, Callable]]:
    """(HF name, HF shape, thunk producing the numpy tensor) in a stable order."""
    for key, name, shape, _, to_hf in _spec(cfg):
        arr = params[key[0]] if len(key) == 1 else params["layers"][key[1]]
        if "{}" in name:
            for ix in _indices(cfg, name):
                yield (name.format(*ix), shape,
                       lambda arr=arr, ix=ix, to_hf=to_hf: to_hf(np.asarray(arr[ix])))
        else:
            yield name, shape, lambda arr=arr, to_hf=to_hf: to_hf(np.asarray(arr))


def save_hf(path, cfg: ModelConfig, params: Params, *, max_shard_bytes: int | None = None,
            extra_config: dict | None = None) -> None:
    """Write an HF checkpoint directory (config.json + safetensors) that
    `transformers.AutoModelForCausalLM.from_pretrained(path)` and `load_hf` read back.

    Tensors are stored in the dtype of the params. With `max_shard_bytes`, weights are split
    into model-0000i-of-0000n.safetensors files plus model.safetensors.index.json.
    `extra_config` entries (e.g. bos_token_id, eos_token_id) are added to config.json.
    """
    path = os.fspath(path)
    shapes = param_shapes(cfg)
    for key, want in [(("embed",), shapes["embed"]), (("final_norm",), shapes["final_norm"])] + [
            (("layers", k), v) for k, v in shapes["layers"].items()] + (
            [(("lm_head",), shapes["lm_head"])] if "lm_head" in shapes else []):
        node = params.get(key[0]) if len(key) == 1 else params.get("layers", {}).get(key[1])
        if node is None:
            raise ValueError(f"params is missing {'/'.join(key)} needed by the ModelConfig.")
        if tuple(node.shape) != tuple(want):
            raise ValueError(f"params {'/'.join(key)} has shape {tuple(node.shape)}, expected "
                             f"{tuple(want)} from the ModelConfig.")
    os.makedirs(path, exist_ok=True)
    dt = jnp.dtype(params["embed"].dtype)
    hf_cfg = config_to_hf(cfg)
    hf_cfg["torch_dtype"] = hf_cfg["dtype"] = dt.name
    hf_cfg.update(extra_config or {})
    write_json(os.path.join(path, "config.json"), hf_cfg, indent=2, sort_keys=True)

    tensors = list(_hf_tensors(cfg, params))
    itemsize = np.dtype(dt).itemsize
    shards: list[list] = [[]]
    size = 0
    for t in tensors:
        nbytes = int(np.prod(t[1])) * itemsize
        if max_shard_bytes and shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += nbytes
    meta = {"format": "pt"}
    for stale in os.listdir(path):  # an older save could leave conflicting weight files
        if (stale.startswith("model") and stale.endswith(".safetensors")) or stale == INDEX_FILE:
            os.remove(os.path.join(path, stale))
    if len(shards) == 1:
        save_file({n: np.ascontiguousarray(make()) for n, _, make in shards[0]},
                  os.path.join(path, SINGLE_FILE), metadata=meta)
        return
    weight_map = {}
    for j, shard in enumerate(shards):
        fname = f"model-{j + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: np.ascontiguousarray(make()) for n, _, make in shard},
                  os.path.join(path, fname), metadata=meta)
        weight_map.update({n: fname for n, _, _ in shard})
    total = sum(int(np.prod(s)) * itemsize for _, s, _ in tensors)
    write_json(os.path.join(path, INDEX_FILE),
               {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
