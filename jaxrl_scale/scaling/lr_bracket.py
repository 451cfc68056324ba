"""A tuned learning rate that brackets its optimum (issue 27, item 1). Pure functions.

The tuning stage scores a log-spaced grid of base lrs at the reference batch; a best value at
an edge of the grid says only that the optimum lies beyond it. `extension` names the lrs to
add (the edge times or divided by ``factor``) until the best value is interior, with a worse
value on each side, up to a cap of extensions; `tune` runs that loop on a score function, and
`lr_tuning` is the summary.json record {grid, scores, chosen, bracketed, bracket, extensions}.
A missing score (a run that failed or diverged) counts as worse than any score.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence


def _clean(scores: Mapping[float, float | None]) -> dict[float, float]:
    return {float(lr): (float(s) if s is not None and math.isfinite(s) else -math.inf)
            for lr, s in scores.items()}


def chosen(scores: Mapping[float, float | None]) -> float | None:
    """The best lr (ties: the smaller lr); None when no lr has a score."""
    sc = _clean(scores)
    ok = {lr: s for lr, s in sc.items() if s > -math.inf}
    return max(ok, key=lambda lr: (ok[lr], -lr)) if ok else None


def is_bracketed(scores: Mapping[float, float | None]) -> bool:
    """The best lr has a strictly worse lr below and above it."""
    best = chosen(scores)
    if best is None:
        return False
    sc = _clean(scores)
    return (any(lr < best and s < sc[best] for lr, s in sc.items())
            and any(lr > best and s < sc[best] for lr, s in sc.items()))


def extension(scores: Mapping[float, float | None], factor: float = 2.0) -> list[float]:
    """The lrs to try next: [] when bracketed (or nothing scored); else min / factor when the
    best has no worse value below it, max * factor when none above."""
    best = chosen(scores)
    if best is None or is_bracketed(scores):
        return []
    sc = _clean(scores)
    out = []
    if not any(lr < best and s < sc[best] for lr, s in sc.items()):
        out.append(min(sc) / factor)
    if not any(lr > best and s < sc[best] for lr, s in sc.items()):
        out.append(max(sc) * factor)
    return [float(f"{x:.6g}") for x in out]


def lr_tuning(scores: Mapping[float, float | None], extensions: int = 0) -> dict:
    """summary.json "lr_tuning": the whole curve, the chosen lr and whether it is bracketed
    (bracket: the nearest worse lr on each side)."""
    grid = sorted(float(lr) for lr in scores)
    best = chosen(scores)
    sc = _clean(scores)
    lo = [lr for lr in grid if best is not None and lr < best and sc[lr] < sc[best]]
    hi = [lr for lr in grid if best is not None and lr > best and sc[lr] < sc[best]]
    return {"grid": grid, "scores": [scores[lr] if lr in scores else scores.get(str(lr))
                                     for lr in grid],
            "chosen": best, "bracketed": is_bracketed(scores),
            "bracket": [lo[-1] if lo else None, hi[0] if hi else None],
            "extensions": extensions}


def tune(score: Callable[[float], float | None], grid: Sequence[float], factor: float = 2.0,
         max_extensions: int = 4) -> dict:
    """Score `grid`, then extend it by `extension` until bracketed or `max_extensions` rounds
    were added; returns `lr_tuning` of the whole curve."""
    scores = {float(lr): score(float(lr)) for lr in grid}
    n = 0
    while n < max_extensions:
        new = [lr for lr in extension(scores, factor) if lr not in scores]
        if not new:
            break
        scores.update({lr: score(lr) for lr in new})
        n += 1
    return lr_tuning(scores, n)


def from_lr_tune_file(data: dict) -> dict:
    """{algo: lr_tuning} from a sweep's lr_tune.json ("tuned": {algo: {"scores": {lr: s}}})."""
    out = {}
    for algo, t in (data.get("tuned") or {}).items():
        if t.get("lr_tuning"):
            out[algo] = t["lr_tuning"]
        elif t.get("scores"):
            out[algo] = lr_tuning({float(k): v for k, v in t["scores"].items()},
                                  t.get("extensions", 0))
    return out


def read_lr_tuning(sweep_dir: str | None, name: str = "lr_tune.json") -> dict:
    """{algo: lr_tuning} of SWEEP_DIR/lr_tune.json; {} when there is none."""
    import json
    import os
    path = os.path.join(sweep_dir, name) if sweep_dir else None
    if not path or not os.path.isfile(path):
        return {}
    with open(path) as f:
        return from_lr_tune_file(json.load(f))


def read_tuning_extras(sweep_dir: str | None, name: str = "lr_tune.json") -> dict:
    """{"per_batch": {algo: {B: lr_tuning}}, "cost": {algo: {B: {runs, responses, wall_s}}}}
    of SWEEP_DIR/lr_tune.json (batches as ints; {} parts when absent)."""
    import json
    import os
    path = os.path.join(sweep_dir, name) if sweep_dir else None
    if not path or not os.path.isfile(path):
        return {}
    with open(path) as f:
        data = json.load(f)
    ints = lambda d: {a: {int(B): v for B, v in per.items()} for a, per in (d or {}).items()}
    return {"per_batch": ints(data.get("tuned_per_batch")), "cost": ints(data.get("tuning_cost"))}
