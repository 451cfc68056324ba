"""Orbax checkpoints: a pytree of arrays plus a JSON dict of host-side state (data position...).

Orbax writes each step into a temporary directory and renames it when complete, so a crash
mid-save never corrupts or loses the previous, finished checkpoint.
"""
from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp


class Checkpointer:
    """Thin wrapper over `ocp.CheckpointManager` with synchronous saves (deterministic resume)."""

    def __init__(self, directory: str, max_to_keep: int = 2):
        self.directory = os.path.abspath(directory)
        self._mngr = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep,
                                                 enable_async_checkpointing=False))

    def latest_step(self) -> int | None:
        return self._mngr.latest_step()

    def save(self, step: int, state: Any, meta: dict | None = None) -> None:
        self._mngr.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta or {})))
        self._mngr.wait_until_finished()

    def restore(self, step: int | None, like: Any) -> tuple[Any, dict]:
        """Restore into the structure, shapes, dtypes and shardings of `like`."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"No checkpoint in {self.directory}.")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        out = self._mngr.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
        return out["state"], dict(out["meta"] or {})

    def close(self) -> None:
        self._mngr.close()


def save_pytree(directory: str, tree: Any, meta: dict | None = None) -> None:
    """One-off save (e.g. an SFT warm-start) as step 0 of a fresh manager."""
    ck = Checkpointer(directory, max_to_keep=1)
    ck.save(0, tree, meta)
    ck.close()


def load_pytree(directory: str, like: Any) -> tuple[Any, dict]:
    ck = Checkpointer(directory, max_to_keep=1)
    try:
        return ck.restore(None, like)
    finally:
        ck.close()
