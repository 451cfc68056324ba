"""Which config each algorithm's configs are compared with: the reference (the config at the
sweep's base batch, preferring sqrt lr, synchronous rollout and the common group size), or the
one the user names. Numpy only."""

from __future__ import annotations

import collections
import math
from typing import Sequence

import numpy as np

from jaxrl_scale.numbers import is_number
from jaxrl_scale.scaling import io as sio
from jaxrl_scale.scaling.io import Run


class AnalysisError(ValueError):
    """A problem with the inputs that the user must fix; the message names it."""


def _base_batch(run: Run) -> float | None:
    b = sio.config_get(run.config, "base_batch")
    return float(b) if is_number(b) and b > 0 else None


def _group_size(run: Run):
    return sio.config_get(run.config, "group_size")


def default_references(groups: dict[str, list[Run]]) -> dict[str, str]:
    """{algo: config}: per algorithm, the config whose batch equals the sweep's base batch
    (``base_batch`` in config.json), preferring lr rule sqrt, synchronous rollout and the most
    common group size; without a base batch, the smallest batch with lr rule sqrt, else the
    smallest batch."""
    by_algo: dict[str, list[str]] = collections.defaultdict(list)
    for g, rs in groups.items():
        if any(r.evals for r in rs):
            by_algo[rs[0].algo or "?"].append(g)
    out = {}
    for algo, names in by_algo.items():
        first = {g: groups[g][0] for g in names}
        bases = [b for b in (_base_batch(r) for r in first.values()) if b]
        common_g = collections.Counter(_group_size(r) for r in first.values()).most_common(1)
        common_g = common_g[0][0] if common_g else None
        pool = [g for g in names if bases and first[g].batch == max(set(bases),
                                                                   key=bases.count)]
        if not pool:
            sqrt = [g for g in names if first[g].lr_rule == "sqrt"]
            pool = sqrt or names
            lo = min(first[g].batch or math.inf for g in pool)
            pool = [g for g in pool if (first[g].batch or math.inf) == lo]
        out[algo] = min(pool, key=lambda g: (first[g].lr_rule != "sqrt",
                                             first[g].gen_batch_ratio != 1,
                                             _group_size(first[g]) != common_g, g))
    return out


def default_reference(runs: Sequence[Run]) -> Run:
    """The first run of the primary algorithm's default reference config."""
    groups = sio.group_runs(list(runs))
    refs = default_references(groups)
    if not refs:
        raise AnalysisError("no run has eval records (records with a 'score' field)")
    return groups[refs[_primary(refs)]][0]


def _primary(refs: dict) -> str:
    return "grpo" if "grpo" in refs else sorted(refs)[0]


def resolve_references(runs: Sequence[Run], reference: str | None
                       ) -> dict[str, tuple[str, list[Run]]]:
    """{algo: (reference name, its runs)}. ``reference`` (a run or a config name) overrides
    the default of its own algorithm; a run name selects that run alone."""
    groups = sio.group_runs(list(runs))
    out = {a: (g, groups[g]) for a, g in default_references(groups).items()}
    if reference is None:
        return out
    by_name = {r.name: r for r in runs}
    if reference in groups:
        chosen = (reference, groups[reference])
    elif reference in by_name:
        chosen = (reference, [by_name[reference]])
    else:
        raise AnalysisError(
            f"reference {reference!r} not found; available runs: {sorted(by_name)}; "
            f"config groups: {sorted(groups)}")
    out[chosen[1][0].algo or "?"] = chosen
    return out


def resolve_reference(runs: Sequence[Run], reference: str | None) -> tuple[str, list[Run]]:
    """(name, runs) of the primary algorithm's reference (see `resolve_references`)."""
    refs = resolve_references(runs, reference)
    if reference is not None:
        for name, rs in refs.values():
            if name == reference:
                return name, rs
    return refs[_primary(refs)]


def check_runs(runs: list[Run], target: float | str, ci_level: float) -> list[str]:
    """AnalysisError for inputs no analysis can use; else the warnings about the rest (runs
    without evals or a known batch: kept, and reported)."""
    if not runs:
        raise AnalysisError("no runs to analyse")
    names = [r.name for r in runs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise AnalysisError(f"duplicate run names {dup}: rename the run directories or CSVs")
    if not 0 < ci_level < 1:
        raise AnalysisError(f"ci_level: must be in (0, 1), got {ci_level}. Fix: set "
                            "--ci_level in (0, 1), e.g. 0.9.")
    warnings = [f"{r.name}: {w}" for r in runs for w in r.warnings]
    if not any(r.evals for r in runs):
        raise AnalysisError(f"no run has eval records (records with a 'score' field): {names}")
    if isinstance(target, float):
        lowest = min(float(np.min(r.eval_curve()[1])) for r in runs if r.evals)
        if target < lowest:
            raise AnalysisError(f"target: {target:g} is below every eval score (lowest "
                                f"{lowest:g}), so N* would be 0 for every run. Fix: set "
                                f"--target above {lowest:g}, or --target=auto.")
    for r in runs:
        if not r.evals:
            warnings.append(f"{r.name}: no eval records (no 'score' field); reported as not "
                            "reached")
        if not r.batch and r.batch_source != "schedule":   # a schedule has no one B
            warnings.append(f"{r.name}: batch per update unknown (no config.json batch keys "
                            "and no responses increments)")
    return warnings


def check_references(refs: dict[str, tuple[str, list[Run]]]) -> None:
    """AnalysisError for a reference with runs that have no evals: no target, no ratios."""
    for algo, (name, rs) in refs.items():
        missing = [r.name for r in rs if not r.evals]
        if missing:
            raise AnalysisError(f"reference {name!r} has runs without eval records: {missing}")
