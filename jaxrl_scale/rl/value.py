"""PPO critic: the policy's transformer trunk with a scalar value head.

Critic params pytree: the trunk keys of the actor (embed [V, D], layers, final_norm [D]) plus
value_w [D] and value_b []. The LM head is dropped. Shapes: B batch, T time, D hidden.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_scale.models.config import ModelConfig
from jaxrl_scale.models.decoder import hidden_states, rms_norm

TRUNK_KEYS = ("embed", "layers", "final_norm")


def init_value_head(hidden_size: int, key: jax.Array, *, init_scale: float | None = None,
                    dtype=jnp.float32) -> dict[str, jax.Array]:
    """value_w ~ N(0, init_scale^2), value_b = 0.

    Default init_scale = 1 / (D + 1) (OpenRLHF's critic head): small enough that the first
    values are ~0, non-zero so the trunk receives gradient from the first update.
    init_scale=0 gives a zero head.
    """
    scale = 1.0 / (hidden_size + 1) if init_scale is None else float(init_scale)
    w = scale * jax.random.normal(key, (hidden_size,), jnp.float32)
    return {"value_w": w.astype(dtype), "value_b": jnp.zeros([], dtype)}


def init_critic_from_actor(actor_params: dict[str, Any], key: jax.Array, *,
                           init_scale: float | None = None) -> dict[str, Any]:
    """Critic = a copy of the actor's trunk + a fresh value head.

    The trunk is copied (not aliased), so donating the actor state never invalidates the critic.
    """
    trunk = {k: jax.tree.map(jnp.copy, actor_params[k]) for k in TRUNK_KEYS}
    d = actor_params["embed"].shape[1]
    return {**trunk, **init_value_head(d, key, init_scale=init_scale,
                                       dtype=actor_params["final_norm"].dtype)}


def critic_values(cfg: ModelConfig, critic_params: dict[str, Any], tokens_BT, valid_BT=None, *,
                  remat: bool = False) -> jax.Array:
    """V(prefix up to and including token t), float32 [B, T]: final norm, then a linear head."""
    h_BTD = hidden_states(cfg, critic_params, tokens_BT, valid_BT, remat=remat)
    h_BTD = rms_norm(h_BTD, critic_params["final_norm"], cfg.rms_norm_eps)
    values_BT = jnp.einsum("btd,d->bt", h_BTD.astype(jnp.float32),
                           critic_params["value_w"].astype(jnp.float32))
    return values_BT + critic_params["value_b"].astype(jnp.float32)


__all__ = ["TRUNK_KEYS", "init_value_head", "init_critic_from_actor", "critic_values"]
