"""LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models") on the
decoder's projections, in PEFT's convention so adapters move between this library and
Hugging Face PEFT unchanged.

A target projection W [in, out] (q k v o gate up down) becomes W x + (alpha / r) B(A x) with
A [in, r] drawn like PEFT's kaiming_uniform(a=sqrt(5)) (U(-1/sqrt(in), 1/sqrt(in))) and B
[r, out] zeros, so training starts exactly at the base model. The trainable pytree holds only
the adapters, {"layers": {"lora_a_<t>": [L, in, r], "lora_b_<t>": [L, r, out]}}; the base
params stay a separate, frozen input (rl/state.TrainState.frozen), so gradients and Adam
moments exist for the adapters alone. `compose` builds the params the decoder runs (the base
with the adapters beside their weights, B scaled by alpha / r, decoder._lora); `merge` folds
them into the weights for decoding and HF export.

Sharding: adapter kinds are not in sharding.PARAM_RULES, so they (and their Adam moments)
are replicated; at r << D they are a small fraction of the weights.

Shapes: L layers, D hidden, N / K query / kv heads, H head dim, F mlp hidden, r rank.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_scale.models.config import ModelConfig
from jaxrl_scale.models.decoder import LORA_BASE, Params, merge_adapters

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
MLP_TARGETS = ("gate", "up", "down")
# Our target -> the HF module PEFT names it by (Qwen2 / Qwen3 / Llama).
HF_MODULE = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
             "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
             "down": "mlp.down_proj"}
PEFT_CONFIG_FILE = "adapter_config.json"
PEFT_WEIGHTS_FILE = "adapter_model.safetensors"


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Rank r, alpha (the update is scaled by alpha / r) and the target projections."""

    rank: int
    alpha: float = 16.0
    targets: tuple[str, ...] = TARGETS

    def __post_init__(self):
        why = invalid(self.rank, self.alpha, self.targets)
        if why:
            raise ValueError(f"LoraConfig: {why[0]}: {why[1]}")

    @property
    def scale(self) -> float:
        return float(self.alpha) / int(self.rank)


def invalid(rank, alpha, targets, cfg: ModelConfig | None = None) -> tuple[str, str] | None:
    """None for a valid adapter setting, else (field, problem); `cfg` adds the model's checks
    (the MLP targets do not exist on a mixture-of-experts model)."""
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 1:
        return "lora_rank", f"must be an integer >= 1, got {rank!r}"
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0 \
            or alpha == float("inf"):
        return "lora_alpha", f"must be a finite number > 0, got {alpha!r}"
    targets = tuple(targets)
    bad = [t for t in targets if t not in TARGETS]
    if not targets or bad:
        return "lora_targets", (f"unknown target(s) {', '.join(map(repr, bad))}" if bad else
                                "is empty") + f"; valid: {','.join(TARGETS)}"
    if len(set(targets)) != len(targets):
        return "lora_targets", f"lists a target twice: {','.join(targets)}"
    if cfg is not None and cfg.is_moe and set(targets) & set(MLP_TARGETS):
        return "lora_targets", (f"{','.join(sorted(set(targets) & set(MLP_TARGETS)))} "
                                f"adapt the dense MLP, and arch={cfg.arch!r} has experts instead")
    return None


def _in_out(cfg: ModelConfig, target: str) -> tuple[int, int]:
    D, F = cfg.hidden_size, cfg.intermediate_size
    NH, KH = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    return {"q": (D, NH), "k": (D, KH), "v": (D, KH), "o": (NH, D), "gate": (D, F),
            "up": (D, F), "down": (F, D)}[target]


def adapter_shapes(cfg: ModelConfig, lcfg: LoraConfig) -> Params:
    """The adapter pytree with shape tuples as leaves (no allocation)."""
    L, r = cfg.num_layers, lcfg.rank
    layers = {}
    for t in lcfg.targets:
        i, o = _in_out(cfg, t)
        layers["lora_a_" + t], layers["lora_b_" + t] = (L, i, r), (L, r, o)
    return {"layers": layers}


def init_adapters(cfg: ModelConfig, lcfg: LoraConfig, key: jax.Array) -> Params:
    """PEFT's init: A ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform with a = sqrt(5)), B = 0,
    so the adapted model starts equal to the base. Traceable (eval_shape / jit)."""
    bad = invalid(lcfg.rank, lcfg.alpha, lcfg.targets, cfg)
    if bad:
        raise ValueError(f"{bad[0]}: {bad[1]}")
    shapes = adapter_shapes(cfg, lcfg)["layers"]
    keys = jax.random.split(key, len(lcfg.targets))
    dt = cfg.jnp_param_dtype
    layers = {}
    for k, t in zip(keys, lcfg.targets):
        a_shape = shapes["lora_a_" + t]
        bound = 1.0 / np.sqrt(a_shape[1])
        layers["lora_a_" + t] = jax.random.uniform(k, a_shape, jnp.float32, -bound,
                                                   bound).astype(dt)
        layers["lora_b_" + t] = jnp.zeros(shapes["lora_b_" + t], dt)
    return {"layers": layers}


def compose(base: Params, adapters: Params, scale: float) -> Params:
    """The params the decoder runs: the base with the adapters beside their weights, B
    scaled by alpha / r. Differentiable in `adapters` (the train step's loss takes this)."""
    scaled = {k: v * jnp.asarray(scale, v.dtype) if k.startswith("lora_b_") else v
              for k, v in adapters["layers"].items()}
    return {**base, "layers": {**base["layers"], **scaled}}


def merge(base: Params, adapters: Params, scale: float) -> Params:
    """Plain params with W + (alpha / r) A B in every target weight: the same function as
    `compose`'s, with no adapter left (decoding, HF export, anything that takes params)."""
    composed = compose(base, adapters, scale)
    return {**composed, "layers": merge_adapters(composed["layers"])}


def tree_bytes(tree: Any) -> int:
    """Bytes of the arrays in a pytree (params, optimizer state)."""
    return int(sum(np.prod(x.shape) * jnp.dtype(x.dtype).itemsize
                   for x in jax.tree_util.tree_leaves(tree) if hasattr(x, "shape")))


def tree_size(tree: Any) -> int:
    """Number of scalars in a pytree's arrays."""
    return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(tree)
                   if hasattr(x, "shape")))


# ----------------------------------------------------------------------------- export

def peft_state_dict(cfg: ModelConfig, lcfg: LoraConfig, adapters: Params) -> dict[str, np.ndarray]:
    """{PEFT tensor name: array}: lora_A.weight [r, in] = A^T, lora_B.weight [out, r] = B^T
    (torch Linear's [out, in]), unscaled, under the names PEFT's save_pretrained writes for a
    Qwen2 / Qwen3 / Llama causal LM, e.g.
    base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight. The flattened N*H axis
    is HF's head-major row order already (hf.py: wq = q_proj.weight.T.reshape(D, N, H))."""
    out = {}
    layers = adapters["layers"]
    for t in lcfg.targets:
        a_LIR, b_LRO = np.asarray(layers["lora_a_" + t]), np.asarray(layers["lora_b_" + t])
        for i in range(cfg.num_layers):
            name = f"base_model.model.model.layers.{i}.{HF_MODULE[t]}"
            out[name + ".lora_A.weight"] = np.ascontiguousarray(a_LIR[i].T)
            out[name + ".lora_B.weight"] = np.ascontiguousarray(b_LRO[i].T)
    return out


def peft_config(lcfg: LoraConfig, base_model_name_or_path: str = "") -> dict[str, Any]:
    """adapter_config.json for PEFT's LoraConfig: plain LoRA (no dropout, bias, rslora or
    DoRA), the HF module names of the targets."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": int(lcfg.rank),
            "lora_alpha": lcfg.alpha, "target_modules": sorted(
                HF_MODULE[t].split(".")[1] for t in lcfg.targets),
            "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
            "use_rslora": False, "use_dora": False, "init_lora_weights": True,
            "inference_mode": True, "modules_to_save": None,
            "base_model_name_or_path": base_model_name_or_path or None}


def save_peft(path, cfg: ModelConfig, lcfg: LoraConfig, adapters: Params, *,
              base_model_name_or_path: str = "") -> None:
    """Write a PEFT adapter directory (adapter_config.json + adapter_model.safetensors) that
    `peft.PeftModel.from_pretrained(base_hf_model, path)` loads."""
    from safetensors.numpy import save_file
    from jaxrl_scale.numbers import write_json
    if cfg.arch not in ("qwen2", "qwen3", "llama"):
        raise ValueError(f"save_peft: PEFT module names are known for qwen2 / qwen3 / llama "
                         f"decoders, not arch={cfg.arch!r}")
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    write_json(os.path.join(path, PEFT_CONFIG_FILE), peft_config(lcfg, base_model_name_or_path),
               indent=2, sort_keys=True)
    save_file(peft_state_dict(cfg, lcfg, adapters), os.path.join(path, PEFT_WEIGHTS_FILE),
              metadata={"format": "pt"})


def load_peft(path, cfg: ModelConfig) -> tuple[LoraConfig, Params]:
    """(LoraConfig, adapters) from a PEFT adapter directory `save_peft` (or PEFT) wrote for
    a plain-LoRA Qwen2 / Qwen3 / Llama adapter on every layer."""
    from safetensors.numpy import load_file
    with open(os.path.join(os.fspath(path), PEFT_CONFIG_FILE)) as f:
        pc = json.load(f)
    hf_to_ours = {m.split(".")[1]: t for t, m in HF_MODULE.items()}
    mods = pc["target_modules"]
    targets = tuple(t for t in TARGETS if any(m == HF_MODULE[t].split(".")[1] for m in mods))
    if len(targets) != len(mods) or any(m not in hf_to_ours for m in mods):
        raise ValueError(f"load_peft: target_modules {mods} are not all among "
                         f"{sorted(hf_to_ours)}")
    lcfg = LoraConfig(rank=int(pc["r"]), alpha=float(pc["lora_alpha"]), targets=targets)
    sd = load_file(os.path.join(os.fspath(path), PEFT_WEIGHTS_FILE))
    layers = {}
    for t in targets:
        name = "base_model.model.model.layers.{}." + HF_MODULE[t]
        layers["lora_a_" + t] = jnp.asarray(np.stack(
            [sd[name.format(i) + ".lora_A.weight"].T for i in range(cfg.num_layers)]))
        layers["lora_b_" + t] = jnp.asarray(np.stack(
            [sd[name.format(i) + ".lora_B.weight"].T for i in range(cfg.num_layers)]))
    return lcfg, {"layers": layers}


def save_merged_hf(path, cfg: ModelConfig, base: Params, adapters: Params, lcfg: LoraConfig,
                   **kw) -> None:
    """HF safetensors of the merged model (W + (alpha / r) A B): models/hf.save_hf."""
    from jaxrl_scale.models.hf import save_hf
    save_hf(path, cfg, jax.device_get(jax.jit(merge, static_argnums=2)(base, adapters,
                                                                        lcfg.scale)), **kw)


__all__ = ["TARGETS", "LoraConfig", "invalid", "adapter_shapes", "init_adapters", "compose",
           "merge", "tree_bytes", "tree_size", "peft_state_dict", "peft_config", "save_peft",
           "load_peft", "save_merged_hf", "LORA_BASE"]
