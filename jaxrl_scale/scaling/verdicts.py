"""The verdict an interval of bootstrap replicates gives (docs/science.md, Intervals): the one
place it is defined for the analysis, the step-cost fits and the rollout comparison. The
interval itself is `stats.interval`, a shared helper (imported here for this module's
importers)."""

from __future__ import annotations

from jaxrl_scale.numbers import Interval
from jaxrl_scale.scaling.stats import interval  # noqa: F401

VERDICTS = ("faster", "slower", "indistinguishable", "not reached")


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
