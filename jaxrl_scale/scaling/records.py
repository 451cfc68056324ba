"""Typed records of a sweep's design and costs: `Regime`, `CriticalTrainingBatch`,
`CriticalGenerationBatch`, `Power` and `Drift`, each built once by the function that measures
it and read by findings and the report as attributes.

summary.json keeps the names of docs/api.md, summary.json: ``to_json`` writes the keys the
measurement has (a key a case does not measure is left out, as before these types), and
``from_json`` reads them back; ``to_json(from_json(d)) == d``. Numpy only, no JAX.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def _fields(cls) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _build(cls, d: dict | None, where: str):
    """cls from a summary dict; a key the type does not know is an error naming it."""
    if d is None:
        return None
    if isinstance(d, cls):
        return d
    unknown = sorted(set(d) - set(_fields(cls)))
    if unknown:
        raise ValueError(f"{where}: unknown summary field(s) {unknown} for {cls.__name__}")
    return cls(**d)


def _emit(rec, always: tuple[str, ...], when_set: tuple[str, ...] = ()) -> dict:
    """The ``always`` fields, then those of ``when_set`` that are not None, in declaration
    order."""
    keep = set(always) | {k for k in when_set if getattr(rec, k) is not None}
    return {k: getattr(rec, k) for k in _fields(type(rec)) if k in keep}


@dataclasses.dataclass(frozen=True)
class Regime:
    """Where a step's time goes at the reference batch (`step_cost.regime`): generation and
    update shares (median over the reference's runs, with their range) and the decode line
    t_gen = d0 + d1 B_gen. ``regime``: "generation-bound", "update-bound" or "unknown"
    (``reason`` says why)."""

    batch: float | None = None
    runs: int = 0
    regime: str = "unknown"
    d0: float | None = None
    d0_ci: list | None = None
    d1: float | None = None
    d1_ci: list | None = None
    reason: str | None = None
    gen_share: float | None = None
    gen_share_range: list | None = None
    update_share: float | None = None
    update_share_range: list | None = None
    gen_s: float | None = None
    update_s: float | None = None
    step_s: float | None = None

    ALWAYS = ("batch", "runs", "regime", "d0", "d0_ci", "d1", "d1_ci")

    def to_json(self) -> dict:
        return _emit(self, self.ALWAYS, tuple(k for k in _fields(Regime)
                                              if k not in self.ALWAYS))

    @classmethod
    def from_json(cls, d: dict | None) -> "Regime | None":
        return _build(cls, d, "regime")


@dataclasses.dataclass(frozen=True)
class CriticalTrainingBatch:
    """The largest batch above B0 whose r_N upper bound stays within 1 + tolerance (every
    batch between qualifying), and the smallest where a sample cost is detected
    (`configs.critical_training_batch`); ``points``: the configs it read."""

    batch: float | None = None
    cost_detected_at: float | None = None
    tolerance: float | None = None
    lr_rule: str | None = None
    algo: str | None = None
    above_batch: float | None = None
    points: list = dataclasses.field(default_factory=list)

    def to_json(self) -> dict:
        return _emit(self, _fields(CriticalTrainingBatch))

    @classmethod
    def from_json(cls, d: dict | None) -> "CriticalTrainingBatch | None":
        return _build(cls, d, "critical_training_batch")


@dataclasses.dataclass(frozen=True)
class CriticalGenerationBatch:
    """The decode line t_gen = d0 + d1 B_gen over the sweep's runs and the batch beyond
    which a doubling adds < min_gain throughput (`step_cost.fit_runs`); ``train_fit``: the
    update line t_train = overhead + gamma B_train and the r_q cap it implies."""

    batch: float | None = None
    d0: float | None = None
    d1: float | None = None
    min_gain: float | None = None
    metric: str | None = None
    batch_kind: str | None = None
    gen_batch_ratios: list = dataclasses.field(default_factory=list)
    sync_batches: int = 0
    points: list = dataclasses.field(default_factory=list)
    d0_ci: list | None = None
    d1_ci: list | None = None
    batch_ci: list | None = None
    within_grid: bool | None = None
    rule: str | None = None
    train_fit: dict | None = None

    ALWAYS = ("batch", "d0", "d1", "min_gain", "metric", "batch_kind", "gen_batch_ratios",
              "sync_batches", "points")

    def to_json(self) -> dict:
        return _emit(self, self.ALWAYS, ("d0_ci", "d1_ci", "batch_ci", "within_grid", "rule",
                                         "train_fit"))

    @classmethod
    def from_json(cls, d: dict | None) -> "CriticalGenerationBatch | None":
        return _build(cls, d, "critical_generation_batch")


@dataclasses.dataclass(frozen=True)
class Power:
    """What one algorithm's design can detect (`familywise.design_power`): the smallest r_N
    and T/T0 called with 80% power under Holm, the power at fixed effects, r_q's error from
    the timing pass where it ran, the seeds a target effect needs, and whether N* was decided
    by evals (`analysis.evals_before_n_star`). ``reason``: why nothing could be computed."""

    min_detectable_r_N: float | None = None
    min_detectable_T_over_T0: float | None = None
    reason: str | None = None
    seeds: int | None = None
    df: int | None = None
    tests: int | None = None
    alpha: float | None = None
    power: float | None = None
    sigma_log_N: float | None = None
    sigma_log_T: float | None = None
    pass_se: float | None = None
    pass_df: int | None = None
    min_detectable_r_N_learning_only: float | None = None
    power_r_N: dict | None = None
    power_T_over_T0: dict | None = None
    min_detectable_T_over_T0_below: float | None = None
    design_for_target: dict | None = None
    evals_before_N_star: dict | None = None
    units: str | None = None      # "warm-starts" when they are the test's units (seeds: None)

    DESIGN = ("seeds", "df", "tests", "alpha", "power", "sigma_log_N", "sigma_log_T")

    def to_json(self) -> dict:
        if self.reason is not None:
            return {"min_detectable_r_N": self.min_detectable_r_N,
                    "min_detectable_T_over_T0": self.min_detectable_T_over_T0,
                    "reason": self.reason, "evals_before_N_star": self.evals_before_N_star}
        out = {k: getattr(self, k) for k in self.DESIGN}
        if self.units is not None:
            out["units"] = self.units
        if self.pass_se is not None:
            out.update(pass_se=self.pass_se, pass_df=self.pass_df,
                       min_detectable_r_N_learning_only=self.min_detectable_r_N_learning_only)
        out.update(min_detectable_r_N=self.min_detectable_r_N, power_r_N=self.power_r_N,
                   min_detectable_T_over_T0=self.min_detectable_T_over_T0,
                   power_T_over_T0=self.power_T_over_T0,
                   min_detectable_T_over_T0_below=self.min_detectable_T_over_T0_below)
        if self.design_for_target is not None:
            out["design_for_target"] = self.design_for_target
        out["evals_before_N_star"] = self.evals_before_N_star
        return out

    @classmethod
    def from_json(cls, d: dict | None) -> "Power | None":
        return _build(cls, d, "power")


PASS_KEYS = ("unit", "load", "max_disagreement")


@dataclasses.dataclass(frozen=True)
class Drift:
    """Where r_q comes from (`drift.interleaved_r_q`): ``controlled`` when an interleaved
    timing pass supplied it, the note the report prints, per config the pass's and the in-run
    r_q (``configs``: {config: row}) and the configs whose two disagree beyond their
    intervals. ``timed``: the pass's keys the record has (unit, load and max_disagreement
    when a pass was read; passes recorded before the load was kept lack "load")."""

    controlled: bool = False
    r_q_source: str = "in-run step times"
    note: str = ""
    configs: dict = dataclasses.field(default_factory=dict)
    timed: tuple = ()
    unit: str | None = None
    load: dict | None = None
    max_disagreement: float | None = None
    disagree: list | None = None

    def to_json(self) -> dict:
        out: dict[str, Any] = {"controlled": self.controlled, "r_q_source": self.r_q_source,
                               "note": self.note}
        out.update({k: getattr(self, k) for k in PASS_KEYS if k in self.timed})
        out["configs"] = self.configs
        if self.disagree is not None:
            out["disagree"] = self.disagree
        return out

    @classmethod
    def from_json(cls, d: dict | None) -> "Drift | None":
        if d is None or isinstance(d, cls):
            return d
        return _build(cls, {**d, "timed": tuple(k for k in PASS_KEYS if k in d)}, "drift")


__all__ = ["Regime", "CriticalTrainingBatch", "CriticalGenerationBatch", "Power", "Drift"]
