"""Model configuration: one frozen dataclass covering Qwen2, Qwen3 and Llama decoders.

Shape letters used across jaxrl_scale.models:
    B batch, T time (query tokens), S cache slots, D hidden, V vocab, L layers,
    N query heads, K kv heads, G = N // K query heads per kv head, H head dim, F mlp hidden,
    E experts (mixture-of-experts layers; F is then the per-expert moe_intermediate_size).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

ARCHS = ("llama", "qwen2", "qwen3", "qwen3_moe")
MOE_DISPATCHES = ("dense", "sparse", "auto")   # ModelConfig.moe_dispatch (models/moe.py)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a decoder-only transformer.

    `arch` only documents the family; behaviour is driven by the flags:
    Qwen2 = attention_bias, Qwen3 = qk_norm (per-head RMSNorm on q and k, explicit head_dim),
    Llama = neither. Qwen3-MoE = qk_norm + num_experts > 0: every layer's MLP is a top-k routed
    mixture of num_experts SwiGLU experts of width moe_intermediate_size (models/moe.py);
    intermediate_size is then unused (kept for the HF config round trip).
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    # Bias on the attention output projection (HF Llama/Qwen3 with attention_bias=True set
    # both this and attention_bias; Qwen2 has q/k/v bias only).
    o_bias: bool = False
    # RoPE frequency scaling as sorted (key, value) pairs of HF's rope_parameters (a dict is
    # accepted and converted); None = plain RoPE. Only rope_type "llama3" is implemented.
    rope_scaling: tuple | None = None
    max_seq_len: int = 2048
    arch: str = "llama"
    # dtype policy: parameters stored in param_dtype, matmuls in dtype, logits always float32.
    param_dtype: str = "float32"
    dtype: str = "float32"
    # Mixture of experts (Qwen3-MoE): 0 experts = dense MLP. Every layer is sparse (HF's
    # decoder_sparse_step=1, mlp_only_layers=[], as in Qwen3-30B-A3B).
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False   # renormalise the top-k router probabilities to sum to 1
    # HF's config value, carried for the round trip; the RL loss's own weight of the router
    # load-balancing loss is rl.steps.LossConfig.router_aux_coef.
    router_aux_loss_coef: float = 0.001
    # How the experts run (models/moe.py): "dense" (every token through every expert),
    # "sparse" (dropless grouped matmuls over the routed rows, expert parallel on an `expert`
    # mesh axis) or "auto" (per call, by E / k and the routed rows per expert:
    # moe.dispatch_mode). Same math.
    moe_dispatch: str = "auto"

    def __post_init__(self):
        if self.arch not in ARCHS:
            raise ValueError(f"ModelConfig.arch={self.arch!r} is not supported; use one of {ARCHS}.")
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                                  "head_dim", "intermediate_size", "max_seq_len"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}.")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                    f"ModelConfig.num_heads={self.num_heads} must be a multiple of "
                    f"num_kv_heads={self.num_kv_heads} (grouped-query attention).")
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim={self.head_dim} must be even for RoPE.")
        if self.moe_dispatch not in MOE_DISPATCHES:
            raise ValueError(f"ModelConfig.moe_dispatch={self.moe_dispatch!r}; use 'dense', "
                             "'sparse' or 'auto'.")
        if self.num_experts < 0:
            raise ValueError(f"ModelConfig.num_experts must be >= 0 (0 = dense MLP), got "
                             f"{self.num_experts}.")
        if self.num_experts:
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise ValueError(
                        f"ModelConfig.num_experts_per_tok={self.num_experts_per_tok} must be in "
                        f"1..num_experts={self.num_experts} for a mixture-of-experts model.")
            if self.moe_intermediate_size <= 0:
                raise ValueError(
                        f"ModelConfig.moe_intermediate_size must be positive when num_experts="
                        f"{self.num_experts} > 0, got {self.moe_intermediate_size}.")
        elif self.arch == "qwen3_moe":
            raise ValueError("ModelConfig.arch='qwen3_moe' needs num_experts > 0.")
        if self.rope_scaling is not None:
            rs = dict(self.rope_scaling)
            object.__setattr__(self, "rope_scaling", tuple(sorted(rs.items())))
            need = ("factor", "low_freq_factor", "high_freq_factor",
                    "original_max_position_embeddings")
            if rs.get("rope_type") != "llama3" or any(k not in rs for k in need):
                raise ValueError(
                        f"ModelConfig.rope_scaling={rs!r} is not supported; only None (plain "
                        f"RoPE) or rope_type 'llama3' with keys {need} are implemented.")

    @property
    def jnp_dtype(self) -> Any:
        return jnp.dtype(self.dtype)

    @property
    def jnp_param_dtype(self) -> Any:
        return jnp.dtype(self.param_dtype)

    def replace(self, **kw) -> "ModelConfig":
        return dataclasses.replace(self, **kw)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def num_params(self) -> int:
        d, f, h = self.hidden_size, self.intermediate_size, self.head_dim
        n, k = self.num_heads, self.num_kv_heads
        if self.is_moe:  # router [D, E] + E experts' gate/up/down
            mlp = d * self.num_experts + 3 * self.num_experts * d * self.moe_intermediate_size
        else:
            mlp = 3 * d * f
        per_layer = d * h * (n + 2 * k) + n * h * d + mlp + 2 * d
        per_layer += (n + 2 * k) * h if self.attention_bias else 0
        per_layer += 2 * h if self.qk_norm else 0
        per_layer += d if self.o_bias else 0
        head = 0 if self.tie_word_embeddings else d * self.vocab_size
        return self.vocab_size * d + self.num_layers * per_layer + d + head


PRESETS: dict[str, ModelConfig] = {
        # Unit tests: compiles in seconds on CPU.
        "tiny": ModelConfig(vocab_size=128, hidden_size=64, num_layers=2, num_heads=4,
                                                num_kv_heads=2, head_dim=16, intermediate_size=128, max_seq_len=256,
                                                arch="qwen2", attention_bias=True),
        # The CPU benchmark shape (~29M params).
        "small": ModelConfig(vocab_size=4096, hidden_size=512, num_layers=8, num_heads=8,
                                                  num_kv_heads=4, head_dim=64, intermediate_size=1536, max_seq_len=1024),
        # Character-level policy for RL on 2 CPU cores (~1.2M params with the 128-token char vocab).
        "rl_cpu": ModelConfig(vocab_size=128, hidden_size=192, num_layers=3, num_heads=6,
                                                    num_kv_heads=2, head_dim=32, intermediate_size=512, max_seq_len=128,
                                                    tie_word_embeddings=True),
        # rl_cpu's shape with a Qwen3-MoE MLP: 8 experts, top-2, each half rl_cpu's width (so
        # the active MLP width equals rl_cpu's); ~3.9M params.
        "moe_cpu": ModelConfig(vocab_size=128, hidden_size=192, num_layers=3, num_heads=6,
                                                     num_kv_heads=2, head_dim=32, intermediate_size=512,
                                                     max_seq_len=128, tie_word_embeddings=True, qk_norm=True,
                                                     arch="qwen3_moe", num_experts=8, num_experts_per_tok=2,
                                                     moe_intermediate_size=256, norm_topk_prob=True),
        # Real-model shapes for accelerator users: float32 master params (Adam updates float32
        # weights and moments), bfloat16 matmuls (every weight is cast at use, decoder.py).
        "qwen2.5-0.5b": ModelConfig(vocab_size=151936, hidden_size=896, num_layers=24, num_heads=14,
                                                                num_kv_heads=2, head_dim=64, intermediate_size=4864,
                                                                rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                                                attention_bias=True, max_seq_len=32768, arch="qwen2",
                                                                param_dtype="float32", dtype="bfloat16"),
        "qwen2.5-1.5b": ModelConfig(vocab_size=151936, hidden_size=1536, num_layers=28,
                                                                num_heads=12, num_kv_heads=2, head_dim=128,
                                                                intermediate_size=8960, rope_theta=1e6, rms_norm_eps=1e-6,
                                                                tie_word_embeddings=True, attention_bias=True,
                                                                max_seq_len=32768, arch="qwen2", param_dtype="float32",
                                                                dtype="bfloat16"),
        "qwen3-0.6b": ModelConfig(vocab_size=151936, hidden_size=1024, num_layers=28, num_heads=16,
                                                            num_kv_heads=8, head_dim=128, intermediate_size=3072,
                                                            rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                                            qk_norm=True, max_seq_len=40960, arch="qwen3",
                                                            param_dtype="float32", dtype="bfloat16"),
        "qwen3-1.7b": ModelConfig(vocab_size=151936, hidden_size=2048, num_layers=28, num_heads=16,
                                                            num_kv_heads=8, head_dim=128, intermediate_size=6144,
                                                            rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                                            qk_norm=True, max_seq_len=40960, arch="qwen3",
                                                            param_dtype="float32", dtype="bfloat16"),
        # Qwen3-30B-A3B (its HF config.json): 128 experts, 8 active per token; ~30.5B params.
        "qwen3-30b-a3b": ModelConfig(vocab_size=151936, hidden_size=2048, num_layers=48,
                                                                 num_heads=32, num_kv_heads=4, head_dim=128,
                                                                 intermediate_size=6144, rope_theta=1e6, rms_norm_eps=1e-6,
                                                                 tie_word_embeddings=False, qk_norm=True,
                                                                 max_seq_len=40960, arch="qwen3_moe", num_experts=128,
                                                                 num_experts_per_tok=8, moe_intermediate_size=768,
                                                                 norm_topk_prob=True, param_dtype="float32",
                                                                 dtype="bfloat16"),
}


def get_config(name: str, **overrides) -> ModelConfig:
    """A preset by name, with optional field overrides (e.g. dtype="bfloat16")."""
    if name not in PRESETS:
        raise ValueError(f"Unknown model preset {name!r}; available: {sorted(PRESETS)}.")
    return PRESETS[name].replace(**overrides) if overrides else PRESETS[name]
