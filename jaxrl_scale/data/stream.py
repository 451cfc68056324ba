"""A deterministic, resumable stream of prompt batches over an indexable source.

Example k of the stream (k = 0, 1, 2, ...) is source[perm_e[k % n]] with e = k // n and perm_e
a permutation drawn from (seed, e): each epoch visits every example once in a fresh order.
The whole state is one integer, `position` (examples consumed so far), so a checkpoint stores
it and `restore(position)` continues exactly where the run stopped.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["PromptStream"]


class PromptStream:
    def __init__(self, source: Sequence[dict[str, Any]], batch_size: int, seed: int, *,
                 position: int = 0) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if len(source) == 0:
            raise ValueError("PromptStream needs a non-empty source")
        self.source = source
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self._epoch = -1
        self._perm: np.ndarray | None = None
        self._position = 0
        self.restore(position)

    @property
    def position(self) -> int:
        """Examples consumed so far (a plain int; store it in checkpoints)."""
        return self._position

    @property
    def epoch(self) -> int:
        return self._position // len(self.source)

    def restore(self, position: int) -> "PromptStream":
        position = int(position)
        if position < 0:
            raise ValueError(f"position must be >= 0, got {position}")
        self._position = position
        return self

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            rng = np.random.Generator(np.random.PCG64([self.seed, epoch]))
            self._perm = rng.permutation(len(self.source))
            self._epoch = epoch
        return self._perm

    def next_indices(self, size: int | None = None) -> list[int]:
        """Source indices of the next batch of `size` (default batch_size) examples (advances
        the position)."""
        n, size = len(self.source), self.batch_size if size is None else int(size)
        out = []
        for k in range(self._position, self._position + size):
            out.append(int(self._permutation(k // n)[k % n]))
        self._position += size
        return out

    def next_batch(self, size: int | None = None) -> list[dict[str, Any]]:
        """The next `size` (default batch_size) examples (crossing epoch boundaries as
        needed)."""
        idx = self.next_indices(size)
        get_many = getattr(self.source, "get_many", None)
        if get_many is not None:
            return get_many(idx)
        return [self.source[i] for i in idx]

    def __repr__(self) -> str:
        return (
            f"PromptStream(n={len(self.source)}, batch_size={self.batch_size}, seed={self.seed}, "
            f"position={self._position})"
        )
