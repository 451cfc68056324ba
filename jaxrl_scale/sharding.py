"""Device mesh, the parameter partition table, and shardings for params, optimizer state, batches.

Mesh axes: `data` (pure data parallel: params replicated), `fsdp` (data parallel whose params and
optimizer state are sharded on D), `tensor` (Megatron-style: heads and the MLP hidden F split),
and, only when make_mesh is given expert > 1, `expert` (expert parallel for mixture-of-experts
models: the E axis of the expert weights is split over it). For activations `expert` is one
more data axis: the batch rows are split over data x fsdp (x expert), so every device holds a
slice of the batch; under sparse MoE dispatch each device runs the rows routed to its own
experts (shard_map in models/moe.py), under dense dispatch XLA inserts the collectives of the
dense expert product; the non-expert params are replicated over it. A
dense model on an expert mesh is data parallel over that axis. The same code runs on 1 CPU
and on a pod: a mesh axis of size 1 is a no-op and a rule whose dimension does not divide its
axis is dropped (that dimension is replicated), so a tiny model works on any mesh.

Shape letters follow jaxrl_scale.models: L layers, D hidden, V vocab, N query heads, K kv heads,
H head dim, F mlp hidden, E experts.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")
EXPERT_AXIS = "expert"   # in a mesh only when make_mesh(expert > 1); then a batch axis too

# The one rule table: parameter kind (its key in the params pytree) -> mesh axis per dimension.
# Layer-stacked kinds keep the leading L axis unsharded. Optimizer moments reuse these rules
# because they carry the same key path and shape as their parameter.
PARAM_RULES: dict[str, tuple[Optional[str], ...]] = {
    "embed": ("tensor", "fsdp"),                 # [V, D]
    "lm_head": ("fsdp", "tensor"),               # [D, V]
    "wq": (None, "fsdp", "tensor", None),        # [L, D, N, H]
    "wk": (None, "fsdp", "tensor", None),        # [L, D, K, H]
    "wv": (None, "fsdp", "tensor", None),        # [L, D, K, H]
    "wo": (None, "tensor", None, "fsdp"),        # [L, N, H, D]
    "bq": (None, "tensor", None),                # [L, N, H]
    "bo": (None, None),                          # [L, D]
    "bk": (None, "tensor", None),                # [L, K, H]
    "bv": (None, "tensor", None),                # [L, K, H]
    "w_gate": (None, "fsdp", "tensor"),          # [L, D, F]
    "w_up": (None, "fsdp", "tensor"),            # [L, D, F]
    "w_down": (None, "tensor", "fsdp"),          # [L, F, D]
    "router": (None, "fsdp", None),              # [L, D, E]
    "expert_gate": (None, "expert", "fsdp", "tensor"),   # [L, E, D, F]
    "expert_up": (None, "expert", "fsdp", "tensor"),     # [L, E, D, F]
    "expert_down": (None, "expert", "tensor", "fsdp"),   # [L, E, F, D]
    "attn_norm": (None, None),                   # [L, D]
    "mlp_norm": (None, None),                    # [L, D]
    "q_norm": (None, None),                      # [L, H]
    "k_norm": (None, None),                      # [L, H]
    "final_norm": (None,),                       # [D]
    "value_w": ("fsdp",),                        # [D]   critic value head (rl/value.py)
    "value_b": (),                               # []
}


# ----------------------------------------------------------------------------- mesh


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1,
              devices: Optional[Sequence[Any]] = None, *, expert: int = 1) -> Mesh:
    """A ('data', 'fsdp', 'tensor') mesh over `devices` (default: all); with expert > 1 a
    ('data', 'fsdp', 'expert', 'tensor') one. One size may be -1: it absorbs the devices the
    others leave (expert must be given explicitly)."""
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    if int(expert) < 1:
        raise ValueError(f"mesh axis expert={expert} must be >= 1")
    sizes = [int(data), int(fsdp), int(tensor)]
    if sum(s == -1 for s in sizes) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got data={data}, fsdp={fsdp}, "
                         f"tensor={tensor}")
    if any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"mesh axis sizes must be positive or -1, got data={data}, "
                         f"fsdp={fsdp}, tensor={tensor}")
    if -1 in sizes:
        known = int(np.prod([s for s in sizes if s != -1])) * int(expert)
        if n % known:
            raise ValueError(f"cannot size the -1 mesh axis: the other axes multiply to {known}, "
                             f"which does not divide the {n} devices (data={data}, fsdp={fsdp}, "
                             f"tensor={tensor})")
        sizes[sizes.index(-1)] = n // known
    ex = f" x expert={expert}" if expert > 1 else ""
    if int(np.prod(sizes)) * int(expert) != n:
        raise ValueError(f"mesh data={sizes[0]} x fsdp={sizes[1]} x tensor={sizes[2]}{ex} = "
                         f"{int(np.prod(sizes)) * int(expert)} devices, but {n} devices were given")
    if expert > 1:
        sizes.insert(2, int(expert))
        return Mesh(np.asarray(devices, dtype=object).reshape(sizes),
                    AXES[:2] + (EXPERT_AXIS,) + AXES[2:])
    return Mesh(np.asarray(devices, dtype=object).reshape(sizes), AXES)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


# ----------------------------------------------------------------------------- params


def _shape_of(leaf) -> tuple[int, ...]:
    if isinstance(leaf, tuple):
        return leaf
    return tuple(leaf.shape) if hasattr(leaf, "shape") else tuple(np.shape(leaf))


def _is_shape_tuple(x) -> bool:
    return isinstance(x, tuple) and all(isinstance(d, (int, np.integer)) for d in x)


def _kind(path) -> Optional[str]:
    """The innermost dict key on a pytree path: the parameter kind."""
    for entry in reversed(path):
        if isinstance(entry, jax.tree_util.DictKey):
            return str(entry.key)
    return None


def spec_for(mesh: Mesh, kind: Optional[str], shape: Sequence[int]) -> P:
    """PartitionSpec for a parameter (or optimizer moment) of this kind and shape.

    Unknown kinds, mismatched ranks and scalars are replicated; a dimension that does not
    divide its mesh axis is replicated (e.g. 2 kv heads on tensor=4).
    """
    rule = PARAM_RULES.get(kind) if kind is not None else None
    if rule is None or len(rule) != len(shape):
        return P()
    axes = []
    for dim, axis in zip(shape, rule):
        size = mesh.shape.get(axis, 1) if axis is not None else 1
        axes.append(axis if axis is not None and size > 1 and dim % size == 0 else None)
    return P(*axes)


def tree_shardings(mesh: Mesh, tree: Any) -> Any:
    """NamedShardings for any pytree holding parameters: params, an optax state, a TrainState.

    Leaves are matched to the rule table by the innermost dict key on their path and their shape,
    so Adam's mu/nu (same path suffix and shape as the parameter) follow the parameter's
    sharding while counters, scalars and rng keys are replicated. Leaves may be arrays,
    ShapeDtypeStructs or shape tuples (as in `models.param_shapes`).
    """
    def one(path, leaf):
        return NamedSharding(mesh, spec_for(mesh, _kind(path), _shape_of(leaf)))

    return jax.tree_util.tree_map_with_path(one, tree, is_leaf=_is_shape_tuple)


# ----------------------------------------------------------------------------- batch


def batch_axes(mesh: Mesh) -> tuple[str, ...]:
    """The mesh axes the batch rows split over: data, fsdp and, when present, expert."""
    return BATCH_AXES + ((EXPERT_AXIS,) if EXPERT_AXIS in mesh.axis_names else ())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Rows (leading axis) split over data x fsdp (x expert); other axes replicated."""
    return NamedSharding(mesh, P(batch_axes(mesh)))


def data_parallel_size(mesh: Mesh) -> int:
    return int(np.prod([mesh.shape[a] for a in batch_axes(mesh)]))


def check_batch_divisible(mesh: Mesh, batch: Any, micro_batches: int = 1) -> None:
    """Clear error when the batch rows (per micro-batch) do not divide over data x fsdp."""
    n = data_parallel_size(mesh)
    for path, leaf in jax.tree_util.tree_leaves_with_path(batch):
        shape = _shape_of(leaf)
        if not shape:
            raise ValueError(f"batch leaf {jax.tree_util.keystr(path)} is a scalar; every batch "
                             f"field needs a leading row axis to shard over data x fsdp")
        rows = shape[0]
        if rows % (n * micro_batches):
            where = f" in each of {micro_batches} micro-batches" if micro_batches > 1 else ""
            axes = batch_axes(mesh)
            raise ValueError(
                f"batch of {rows} rows (field {jax.tree_util.keystr(path)}){where} does not "
                f"divide over the {' x '.join(axes)} = "
                f"{' x '.join(str(mesh.shape[a]) for a in axes)} = "
                f"{n} data-parallel devices; use a multiple of {n * micro_batches} rows")


__all__ = [
    "AXES", "BATCH_AXES", "EXPERT_AXIS", "PARAM_RULES", "make_mesh", "replicated", "spec_for",
    "tree_shardings", "batch_axes", "batch_sharding", "data_parallel_size", "check_batch_divisible",
]
