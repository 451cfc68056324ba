"""Train state: one pytree per trained network (GRPO: the policy; PPO: an actor and a critic).

The optax GradientTransformation is kept outside the state (passed to the step as a static
argument) so the state is a plain array pytree that jit can shard and donate.
"""
from __future__ import annotations

from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import optax

from jaxrl_scale import sharding as shd


@flax.struct.dataclass
class TrainState:
    params: Any        # the trained leaves: the full model, or LoRA's adapters alone
    opt_state: Any
    step: jax.Array    # int32: optimizer updates attempted (skipped non-finite ones included;
                       # an empty minibatch of multi_update is not one)
    rng: jax.Array     # uint32 [2] PRNG key, split once per step
    # LoRA (models/lora.py): the base model's params, an input of the step that is never
    # differentiated nor given optimizer state (None for a full update). Sharded by the
    # rule table like params; checkpoints leave it out (the run's config names the base).
    frozen: Any = None


def _key(seed_or_key) -> jax.Array:
    if isinstance(seed_or_key, int):
        return jax.random.PRNGKey(seed_or_key)
    return jnp.asarray(seed_or_key)


def create_train_state(params: Any, tx: optax.GradientTransformation,
                       seed_or_key: int | jax.Array = 0, frozen: Any = None) -> TrainState:
    """TrainState for existing params (they stay where they are; see `init_train_state`);
    `frozen`: LoRA's base params (the optimizer sees only `params`)."""
    return TrainState(params=params, opt_state=tx.init(params),
                      step=jnp.zeros([], jnp.int32), rng=_key(seed_or_key), frozen=frozen)


def state_shardings(mesh, state_or_shapes: Any) -> Any:
    """NamedShardings for a TrainState: params and Adam moments by the rule table, the rest
    replicated (see `jaxrl_scale.sharding.tree_shardings`)."""
    return shd.tree_shardings(mesh, state_or_shapes)


def init_train_state(init_fn: Callable[..., Any], tx: optax.GradientTransformation, *args,
                     mesh=None, seed_or_key: int | jax.Array = 0,
                     with_frozen: bool = False) -> TrainState:
    """Create params = init_fn(*args) and the optimizer state, born sharded on `mesh`;
    with_frozen: init_fn returns (params, frozen) (LoRA: the adapters and the base).

    eval_shape -> shardings from the rule table -> jit(out_shardings=...): no device ever holds
    an unsharded copy. Without a mesh this is a plain jitted init on the default device.
    """
    key = _key(seed_or_key)

    def make(key, *args):
        out = init_fn(*args)
        if with_frozen:
            return create_train_state(out[0], tx, key, frozen=out[1])
        return create_train_state(out, tx, key)

    if mesh is None:
        return jax.jit(make)(key, *args)
    shapes = jax.eval_shape(make, key, *args)
    return jax.jit(make, out_shardings=state_shardings(mesh, shapes))(key, *args)


def shard_train_state(mesh, state: TrainState) -> TrainState:
    """Move an existing state onto `mesh` by the rule table."""
    return jax.device_put(state, state_shardings(mesh, state))


__all__ = ["TrainState", "create_train_state", "init_train_state", "state_shardings",
           "shard_train_state"]
