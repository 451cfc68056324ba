"""Multi-process runs: one JAX process per host, one global mesh over all their devices.

JAX's multi-controller model (what MaxText and Tunix run on pods): every process runs the same
program. After `initialize`, jax.devices() lists every process's devices, a mesh over them is
global, and a jitted function of global arrays runs on all of them, each process feeding and
reading the shards its own devices hold, with XLA's collectives between processes (gloo on CPU,
NCCL on GPUs, ICI/DCN on TPUs). So the model, the decode loop and the update need nothing new;
what a run needs on top is host-side, and it is all here:

- `initialize`: jax.distributed.initialize, from explicit settings or the cluster's environment;
- `host_rows` / `allgather_rows`: host work on a batch's rows (reward scoring) split over the
  processes, then the results on every process;
- `to_host`: an array's value on every process, whichever devices hold it;
- `is_primary`, `primary_first`, `barrier`, `broadcast`: files are written by process 0 and
  the others wait for it where they read them.

Every function is the plain single-process operation when jax.process_count() == 1.
"""
from __future__ import annotations

import contextlib
from typing import Any

import jax
import numpy as np

# Waits for another process's host work (process 0 building data or the SFT warm-start).
BARRIER_TIMEOUT_S = 3600


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, auto: bool = False) -> None:
    """Join the processes of one run; before anything touches a device.

    auto: jax.distributed.initialize() reads the cluster's environment (Cloud TPU pods, SLURM,
    Open MPI); the settings given (not None) override what it detects. Otherwise
    num_processes > 1 starts (process 0) or joins the coordinator at coordinator_address
    ("host:port") as process_id, and no num_processes (or 1) is a plain single-process run.
    """
    if auto:
        jax.distributed.initialize(coordinator_address or None, num_processes, process_id)
    elif (num_processes or 1) > 1:
        jax.distributed.initialize(coordinator_address, num_processes, process_id)


def is_primary() -> bool:
    """Process 0: the one that writes a run's files (metrics, config, DONE, caches)."""
    return jax.process_index() == 0


def _row_bounds(n: int) -> np.ndarray:
    """[k + 1] boundaries splitting n rows over k processes, earlier processes first
    (sizes differ by at most one)."""
    k = jax.process_count()
    sizes = np.full(k, n // k) + (np.arange(k) < n % k)
    return np.concatenate([[0], np.cumsum(sizes)])


def host_rows(n: int) -> slice:
    """This process's share of n rows. With the mesh over jax.devices() (process-major) and a
    batch that fills its bucket, these are the rows this process's devices decoded."""
    b = _row_bounds(n)
    p = jax.process_index()
    return slice(int(b[p]), int(b[p + 1]))


def allgather_rows(local: np.ndarray, n: int) -> np.ndarray:
    """The [n, ...] array whose `host_rows(n)` on each process is that process's `local`,
    on every process."""
    local = np.asarray(local)
    if jax.process_count() == 1:
        return local
    from jax.experimental import multihost_utils
    b = _row_bounds(n)
    sizes = np.diff(b)
    padded = np.zeros((int(sizes.max()),) + local.shape[1:], local.dtype)
    padded[:len(local)] = local
    gathered = np.asarray(multihost_utils.process_allgather(padded))   # [processes, max, ...]
    return np.concatenate([gathered[p, :s] for p, s in enumerate(sizes)])


def to_host(x: Any) -> np.ndarray:
    """A (possibly multi-process) array's whole value as numpy, on every process."""
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
        return np.asarray(x)
    if x.is_fully_replicated:
        return np.asarray(x.addressable_data(0))
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def barrier(name: str, timeout_s: int = BARRIER_TIMEOUT_S) -> None:
    """Wait until every process reaches `name` (the coordinator's barrier: no device work)."""
    if jax.process_count() > 1:
        import orbax.checkpoint as ocp
        ocp.multihost.sync_global_processes(name, timeout=timeout_s)


def broadcast(value):
    """Process 0's `value` (a scalar or array), on every process."""
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils
    return multihost_utils.broadcast_one_to_all(value)


@contextlib.contextmanager
def primary_first(name: str):
    """Run the block on process 0, then on the others: for host work that creates files
    every process then reads (a TFDS build, a cache entry), so no two processes write them."""
    if not is_primary():
        barrier(name)
    yield
    if is_primary():
        barrier(name)


__all__ = ["BARRIER_TIMEOUT_S", "initialize", "is_primary", "host_rows", "allgather_rows",
           "to_host", "barrier", "broadcast", "primary_first"]
