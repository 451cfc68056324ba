"""The run's train states: where its params come from, the optimizer at a batch size, the
state born sharded on the mesh, and the part of it a checkpoint holds. Run (experiment/train.py)
builds its initial states from these, and a batch schedule (experiment/schedule.py) asks
`optimizer_for` again at each batch it reaches: the Adam state's tree does not depend on the
hyper-parameters (the lr is a constant of the transformation), so the moments and the update
count carry over to the new one."""
from __future__ import annotations

import functools
import os

import jax

from jaxrl_scale import optim
from jaxrl_scale import sharding as shd
from jaxrl_scale.checkpoint import load_pytree
from jaxrl_scale.experiment.checks import hf_checkpoint_errors
from jaxrl_scale.models import init_params, load_hf
from jaxrl_scale.models import lora
from jaxrl_scale.rl.state import init_train_state


def optimizer_for(cfg, base_lr: float, batch: int | None = None, rule: str = ""):
    """(tx, lr_fn): Adam whose hyper-parameters follow `rule` (default optim.lr_rule) at
    `batch` responses per update (default P*G) relative to base_batch, and the lr it uses at a
    given update count."""
    o = cfg.optim
    base = optim.AdamHParams(lr=base_lr, b1=o.b1, b2=o.b2, eps=o.eps)
    hp = optim.scaled_adam_hparams(base, batch or cfg.batch_train, o.base_batch,
                                   rule or o.lr_rule)
    tx = optim.make_optimizer(hp, warmup_steps=o.warmup_steps,
                              max_grad_norm=o.max_grad_norm or None)
    return tx, functools.partial(optim.current_lr, hp, warmup_steps=o.warmup_steps)


def start_params(cfg, model_cfg, mesh):
    """The params to start from, or None: a random init from cfg.seed, which the caller runs
    born sharded (`init_train_state`); an init_checkpoint is restored sharded on `mesh` (each
    process reads its shards)."""
    params = None
    if cfg.hf_checkpoint:
        with hf_checkpoint_errors(cfg.hf_checkpoint):
            _, params = load_hf(os.path.expanduser(cfg.hf_checkpoint))
    if cfg.init_checkpoint:
        shapes = jax.eval_shape(lambda: init_params(model_cfg, 0))
        like = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                            shapes, shd.tree_shardings(mesh, shapes))
        params, _ = load_pytree(os.path.expanduser(cfg.init_checkpoint), like)
    return params


_LORA_KEY = 0x10A   # folded into the seed for the adapters' init


def born_state(mesh, model_cfg, params, tx, seed: int, lcfg: "lora.LoraConfig | None" = None):
    """TrainState born sharded on `mesh`: params loaded (then moved) or initialised there.
    lcfg (LoRA): the state trains fresh adapters, the params are its frozen base."""
    if params is None:
        base_fn, args = (lambda: init_params(model_cfg, seed)), ()
    else:
        # moved first: a multi-process jit takes only arrays already on its mesh
        params = jax.device_put(params, shd.tree_shardings(mesh, params))
        base_fn, args = (lambda p: p), (params,)
    if lcfg is None:
        return init_train_state(base_fn, tx, *args, mesh=mesh, seed_or_key=seed)
    key = jax.random.fold_in(jax.random.PRNGKey(seed), _LORA_KEY)
    return init_train_state(lambda *a: (lora.init_adapters(model_cfg, lcfg, key), base_fn(*a)),
                            tx, *args, mesh=mesh, seed_or_key=seed, with_frozen=True)


def trained_part(states) -> tuple:
    """The train states without LoRA's frozen base: what a checkpoint holds (the base is
    rebuilt from the run's config, which names it: hf_checkpoint / init_checkpoint / model)."""
    return tuple(s.replace(frozen=None) for s in states)


__all__ = ["optimizer_for", "start_params", "born_state", "trained_part"]
