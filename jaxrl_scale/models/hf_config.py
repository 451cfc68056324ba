"""Hugging Face config.json <-> ModelConfig, and the error every HF checkpoint check raises.

Supported families (decoder-only, SwiGLU, RMSNorm, full causal attention):
  qwen2  (Qwen2ForCausalLM): q/k/v bias, no o bias.
  qwen3  (Qwen3ForCausalLM): per-head q/k RMSNorm, explicit head_dim, optional attention_bias.
  llama  (LlamaForCausalLM): optional attention_bias (q/k/v/o), RoPE plain or "llama3" scaling.
  qwen3_moe (Qwen3MoeForCausalLM): Qwen3 attention, every layer a top-k mixture of experts
         (decoder_sparse_step=1, no mlp_only_layers: Qwen3-30B-A3B's layout).

config.json's fields are type-checked (an integer field holding 8.5 or "8" is an
HFCheckpointError naming it, never truncated); the tensors are models/hf.py's.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any

import jax.numpy as jnp

from jaxrl_scale.models.config import ModelConfig

__all__ = ["config_from_hf", "config_to_hf", "read_config_json", "read_json_object",
           "HFCheckpointError", "CheckpointNotFoundError"]


_ARCH_OF_CLASS = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
                  "Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3_moe"}
_CLASS_OF_ARCH = {v: k for k, v in _ARCH_OF_CLASS.items()}
_SUPPORTED = tuple(sorted(_CLASS_OF_ARCH))
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


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
        d = read_config_json(d)
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


def read_config_json(path) -> dict:
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.isfile(path):
        raise CheckpointNotFoundError(f"HF config not found: {path} does not exist.")
    return read_json_object(path)


def read_json_object(path: str) -> dict:
    with open(path, "rb") as f:
        raw = f.read()
    try:
        d = json.loads(raw)
    except ValueError as e:   # JSONDecodeError, or bytes that are not UTF-8
        raise _err(f"{path} is not valid JSON: {e}") from None
    if not isinstance(d, dict):
        raise _err(f"{path} holds a JSON {type(d).__name__}, not an object.")
    return d
