"""The project's one finite-number predicate, number formatter, interval type, JSON sanitizer
and atomic JSON writer. Pure Python + numpy (no JAX), so the analysis and the report share
them without importing the training stack.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Sequence

import numpy as np

UNBOUNDED = "∞"


def is_number(x: Any) -> bool:
    """A real, finite number: Python int/float or a numpy integer/floating scalar; never a
    bool (True is no count), None, NaN or inf."""
    if isinstance(x, (bool, np.bool_)):
        return False
    if not isinstance(x, (int, float, np.integer, np.floating)):
        return False
    return math.isfinite(x)


def or_none(x: Any) -> float | None:
    """``float(x)`` for a finite number, else None."""
    return float(x) if is_number(x) else None


def fmt(x: Any, digits: int = 3) -> str:
    """A number for a human: 3 significant digits, thousands with separators, tiny or huge
    ones in e-notation; '-' for anything that is not a finite number."""
    if not is_number(x):
        return "-"
    if x != 0 and (abs(x) >= 1e7 or abs(x) < 1e-4):
        return f"{x:.{digits - 1}e}"
    if abs(x) >= 10 ** digits:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


@dataclasses.dataclass(frozen=True)
class Interval:
    """[lo, hi]; None (JSON null) for an end that is unknown (lo) or unbounded (hi)."""

    lo: float | None = None
    hi: float | None = None

    @classmethod
    def of(cls, ci: Any) -> "Interval":
        """From [lo, hi], an Interval, or None / a short list (both ends unknown)."""
        if isinstance(ci, Interval):
            return ci
        if not ci or len(ci) < 2:
            return cls()
        return cls(or_none(ci[0]), or_none(ci[1]))

    def below(self, x: float) -> bool:
        """The whole interval is below x (an unbounded upper end never is)."""
        return is_number(self.hi) and self.hi < x

    def above(self, x: float) -> bool:
        """The whole interval is above x."""
        return is_number(self.lo) and self.lo > x

    def contains(self, x: float) -> bool:
        """x lies in the interval (a finite lower end is needed; an unbounded upper end
        contains everything above it)."""
        return is_number(self.lo) and self.lo <= x and (not is_number(self.hi) or self.hi >= x)

    def inside(self, lo: float, hi: float) -> bool:
        """The whole interval lies within [lo, hi] (the equivalence test of "alike")."""
        return is_number(self.lo) and is_number(self.hi) and lo <= self.lo and self.hi <= hi

    def excludes(self, x: float) -> bool:
        """The interval lies wholly on one side of x (a difference from x is shown)."""
        return self.below(x) or self.above(x)

    def overlaps(self, other: "Interval") -> bool:
        """The two intervals share a point (unbounded upper ends reach +inf)."""
        ahi = self.hi if is_number(self.hi) else math.inf
        bhi = other.hi if is_number(other.hi) else math.inf
        return bool(is_number(self.lo) and is_number(other.lo) and self.lo <= bhi
                    and other.lo <= ahi)

    def to_json(self) -> list:
        return [self.lo, self.hi]


def fmt_ci(x: Any, ci: Any, digits: int = 3) -> str:
    """'x [lo, hi]'; an unbounded upper end (with a finite lower one) is '∞'; no interval:
    just x."""
    iv = Interval.of(ci)
    base = fmt(x, digits)
    if not is_number(iv.lo) and not is_number(iv.hi):
        return base
    return f"{base} [{fmt(iv.lo, digits)}, {fmt(iv.hi, digits) if is_number(iv.hi) else UNBOUNDED}]"


def to_jsonable(x: Any) -> Any:
    """Plain JSON: numpy / JAX scalars and arrays to Python, NaN/inf to None, tuples to
    lists, dict keys to str; objects with ``to_json`` are asked for it."""
    if isinstance(x, dict):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v) for v in x]
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.ndarray):
        return to_jsonable(x.tolist())
    if hasattr(x, "to_json"):
        return to_jsonable(x.to_json())
    if hasattr(x, "tolist"):  # JAX arrays and other array-likes
        return to_jsonable(np.asarray(x).tolist())
    return x


def write_json(path: str, obj: Any, **dump_kw) -> None:
    """json.dump to ``path`` through a temp file renamed over it: readers see the old file or
    the new one, never a torn write. The temp name is per process, because several processes
    (job-array tasks, Ray workers, runs finishing the same step-0 eval) may write one path."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, **dump_kw)
    os.replace(tmp, path)


def numbers(xs: Sequence[Any]) -> list[float]:
    """The finite numbers of ``xs`` as floats."""
    return [float(x) for x in xs if is_number(x)]
