"""An interval of bootstrap replicates and the verdict it gives (docs/science.md, Intervals):
the one place both are defined for the analysis, the step-cost fits and the rollout
comparison."""

from __future__ import annotations

from jaxrl_scale.numbers import Interval, or_none
from jaxrl_scale.scaling import stats

VERDICTS = ("faster", "slower", "indistinguishable", "not reached")


def interval(x, level: float) -> list:
    """[lo, hi] of replicates ``x`` at ``level`` (None for an end that is not finite)."""
    lo, hi = stats.quantile_ci(x, level)
    return [or_none(lo), or_none(hi)]


def verdict(reached: bool, ci) -> str:
    """faster / slower when the whole ratio interval is below / above 1; indistinguishable
    when it reaches 1; not reached without a ratio."""
    if not reached:
        return "not reached"
    iv = Interval.of(ci)
    if iv.below(1):
        return "faster"
    if iv.above(1):
        return "slower"
    return "indistinguishable"
