"""Append-only metrics.jsonl that stays consistent across kill-and-resume."""
from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if hasattr(v, "tolist"):  # numpy / jax arrays and scalars
        return _jsonable(np.asarray(v).tolist())
    if isinstance(v, float) and not math.isfinite(v):
        return None  # JSON has no NaN/Inf; null says "not a number" honestly
    return v


class MetricsLog:
    """One JSON record per line; every write is flushed and fsynced (a kill loses nothing)."""

    def __init__(self, path: str):
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def read(self) -> list[dict]:
        if not os.path.exists(self.path):
            return []
        out = []
        with open(self.path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        out.append(json.loads(line))
                    except json.JSONDecodeError:
                        break  # a torn last line from a kill mid-write
        return out

    def truncate_after(self, step: int) -> list[dict]:
        """Keep records with step <= `step` (the resumed checkpoint); drop the rest atomically."""
        kept = [r for r in self.read() if int(r.get("step", -1)) <= step]
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            for r in kept:
                f.write(json.dumps(r) + "\n")
        os.replace(tmp, self.path)
        return kept

    def write(self, record: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(_jsonable(record)) + "\n")
            f.flush()
            os.fsync(f.fileno())
