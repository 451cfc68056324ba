"""The typed summary of a sweep: what scaling/ computes and summary.json holds.

`Summary` (per run `RunStats`, per config `ConfigStats`, per algorithm `AlgoSummary`, the
source's findings as `findings.Finding`) with ``to_json`` / ``from_json``. Field names are
those of docs/api.md, summary.json (one table per class); each quantity is one field. The
primary algorithm's numbers are written at the top level too (docs/api.md, Summary:
"target", "eval_se", "reference_config", "best_set", ... and the short keys "reference" and
"best" of the analyze command), all derived from ``algos[primary_algo]`` by ``to_json``.

``from_json`` reads summaries recorded before this type existed (results/): the summary key
``clip_fraction`` is read as ``clipped_update_fraction``, a missing ``findings`` as none.
Numpy only, no JAX.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import numpy as np

from jaxrl_scale.scaling.findings import Finding
from jaxrl_scale.scaling.records import (CriticalGenerationBatch, CriticalTrainingBatch, Drift,
                                         Power, Regime)
from jaxrl_scale.scaling.values import FLAT_KEYS, ConfigRatios

Interval = list  # [lo, hi] as written to JSON; None for an unknown (lo) or unbounded (hi) end

_RENAMED = {"clip_fraction": "clipped_update_fraction"}   # recorded name -> field
# Recorded fields no longer produced, skipped when an old summary is read: rerun_agreement
# was the power at the estimate ("observed power"), a function of the p-value that no
# function of the estimate can make agree with a rerun at every truth
# (calibration.rerun_agreement_gap); sample_axis "generated" put refilled runs on the axis
# of responses generated, where N now counts retained responses for every run.
_DROPPED = {"rerun_agreement", "sample_axis"}


def _from(cls, d: dict, where: str):
    """cls(**d) with recorded names mapped; an unknown key is an error naming it."""
    names = {f.name for f in json_fields(cls)}
    kw = {}
    for k, v in d.items():
        k = _RENAMED.get(k, k)
        if k in _DROPPED and k not in names:
            continue
        if k not in names:
            raise ValueError(f"{where}: unknown summary field {k!r} for {cls.__name__}")
        kw[k] = v
    return cls(**kw)


def json_fields(cls) -> tuple:
    """The fields of ``cls`` that summary.json holds (not the in-memory ones, `_memory`)."""
    return tuple(f for f in dataclasses.fields(cls) if f.metadata.get("json", True))


def _json(obj) -> dict:
    """Fields in declaration order; optional fields left at None are omitted when they are
    marked ``omit_none`` (keys a run or config has only in some sweeps)."""
    out = {}
    for f in json_fields(obj):
        v = getattr(obj, f.name)
        if v is None and f.metadata.get("omit_none"):
            continue
        out[f.name] = v
    return out


def _opt(**kw):
    return dataclasses.field(default=None, metadata={"omit_none": True}, **kw)


def _memory():
    """A field the analysis keeps in memory but never writes (bootstrap arrays): None in a
    summary read back from JSON, and left out of equality (arrays have no single truth)."""
    return dataclasses.field(default=None, compare=False, repr=False,
                             metadata={"json": False})


WITH_EVALS = ("N_star_ci", "q_ci", "q_overall", "responses_total", "frac_replicates_reached",
              "updates_to_target")


@dataclasses.dataclass(frozen=True)
class RunStats:
    """One run at its algorithm's target, built once by `run_stats.run_stats` (with the
    run's identity); the ratios to its reference are set by `run_stats.with_run_ratios`. The
    bootstrap arrays at the end stay in memory: summary.json holds the fields before them."""

    batch: float | None = None
    n_evals: int = None
    eval_se_source: str = None
    eval_se: float | None = None
    curve_jitter_se: float | None = None
    se_used: float | None = None
    start_score: float | None = None
    max_score: float | None = None
    final_score: float | None = None
    N_star: float | None = None
    N_star_raw: float | None = None
    reached: bool = None
    q: float | None = None
    T: float | None = None
    smoothed_final: float | None = None
    group: str | None = None
    seed: int | None = None
    block: str | None = _opt()     # the warm-start (familywise: one block per warm-start)
    lr_rule: str | None = None
    algo: str | None = None
    batch_source: str | None = None
    batch_gen: float | None = None
    gen_batch_ratio: float | None = None
    target: float | None = None
    clipped_update_fraction: float | None = None   # updates whose grad norm was clipped
    r_N: float | None = None
    r_q: float | None = None
    T_over_T0: float | None = None
    is_reference: bool = False
    N_star_ci: Interval | None = None
    q_ci: Interval | None = None
    q_overall: float | None = None
    responses_total: float | None = None
    censored_at: float | None = _opt()   # not reached: N* is at least this (its responses)
    frac_replicates_reached: float | None = None
    updates_to_target: float | None = None
    evals_before_N_star: int | None = _opt()   # evals before the crossing
    error: str | None = _opt()      # "no eval records": the keys above are not computed
    sigmoid: dict | None = _opt()
    # In memory only (`_memory`): what the config bootstrap, the curve comparison and the
    # partial-rollout comparison resample.
    N_star_boot: np.ndarray | None = _memory()   # [n_boot] N* replicates (inf: not reached)
    q_boot: np.ndarray | None = _memory()        # [n_boot] q replicates
    fit_at_evals: np.ndarray | None = _memory()  # [n_evals] the monotone fit of the curve
    se_at_evals: np.ndarray | None = _memory()   # [n_evals] each eval's SE the fit used

    def to_json(self) -> dict:
        out = _json(self)
        if self.error:
            for k in WITH_EVALS:
                out.pop(k)
        return out

    @classmethod
    def from_json(cls, d: dict) -> "RunStats":
        return _from(cls, d, "runs")


@dataclasses.dataclass(frozen=True)
class ConfigStats:
    """One config (a run name without its seed): seed means with intervals at ci_level, the
    ratios to its algorithm's reference and the verdict."""

    algo: str | None = None
    batch: float | None = None
    batch_gen: float | None = None
    gen_batch_ratio: float | None = None
    lr_rule: str | None = None
    group_size: int | None = None
    seeds: int = None
    seeds_reached: int = None
    runs: list = None
    reached: bool = None
    N_star: float | None = None
    N_star_ci: Interval = None
    q: float | None = None
    q_ci: Interval = None
    T: float | None = None
    N_star_reached_mean: float | None = None
    N_star_std: float | None = None
    q_std: float | None = None
    reference: str | None = None
    is_reference: bool = False
    # r_N, r_q, T_over_T0 and their intervals: every estimate with its source (properties
    # below give summary.json's flat names, values.FLAT_KEYS)
    ratios: ConfigRatios = dataclasses.field(default_factory=ConfigRatios)
    verdict: str | None = None
    updates_ratio: float | None = None
    responses_min: float | None = None
    collection_s_per_step: float | None = None
    train_s_per_step: float | None = None
    gen_throughput: float | None = None
    clipped_update_fraction: float | None = None   # updates whose grad norm was clipped
    staleness_mean: float | None = None
    staleness_max: float | None = None
    off_policy_token_frac: float | None = None
    slot_occupancy: float | None = None
    actor_b_simple: float | None = None
    actor_b_simple_range: list | None = None
    critic_b_simple: float | None = None
    critic_b_simple_range: list | None = None
    sigmoid_A: float | None = _opt()
    invariance: dict | None = _opt()
    # Family-wise tests (scaling.familywise): the *_ci above are their t intervals, the
    # bootstrap ones are kept as *_ci_boot; *_sci simultaneous over the sweep's configs.
    verdict_per_config: str | None = _opt()
    p_value: float | None = _opt()
    p_holm: float | None = _opt()
    test: str | None = _opt()
    alike_T: bool | None = _opt()
    alike_r_N: bool | None = _opt()
    r_q_in_run_test: dict | None = _opt()      # {log_ratio, se, df}: the seed-paired t test
    T_over_T0_test: dict | None = _opt()       # {log_ratio, se, df} of the verdict's test
    fragile: bool | None = _opt()              # reproducibility.fragile_band holds its T
    # True: DAPO dynamic sampling; N* still counts retained responses, the refill rounds'
    # time is in q, and r_q is the runs' own (the timing pass times one round per update)
    refill: bool | None = _opt()
    # A batch schedule (experiment/schedule.py, "noise" or "steps"): batch is None (no one B),
    # batch_start the B it starts at, batch_fractions {B: share of its responses to N* at B}
    batch_schedule: str | None = _opt()
    batch_start: float | None = _opt()
    batch_fractions: dict | None = _opt()

    @functools.cached_property
    def _flat(self) -> dict:
        """`ratios.flat()`, computed once per (frozen) value: the report reads it per field."""
        return self.ratios.flat()

    def to_json(self) -> dict:
        out = _json(self)
        del out["ratios"]
        return {**out, **self._flat}

    @classmethod
    def from_json(cls, d: dict) -> "ConfigStats":
        flat = {k: d[k] for k in FLAT_KEYS if k in d}
        rest = {k: v for k, v in d.items() if k not in flat}
        rest["ratios"] = ConfigRatios.from_flat(flat, d.get("test"))
        return _from(cls, rest, "configs")


def _flat_property(key: str) -> property:
    return property(lambda self: self._flat.get(key),
                    doc=f"summary.json's {key!r} (from `ratios`)")


for _k in FLAT_KEYS:   # st.r_N, st.r_q_ci, ...: read-only views of the typed ratios
    setattr(ConfigStats, _k, _flat_property(_k))


@dataclasses.dataclass(frozen=True)
class AlgoSummary:
    """Per algorithm: its reference, target, eval noise, critical batches, grad-norm slopes
    and the set of configs not distinguishable from its fastest."""

    reference_config: str = None
    reference_runs: list = None
    target: float = None
    target_rule: dict | None = None
    eval_se: float | None = None
    eval_se_source: str | None = None
    curve_jitter_se: float | None = None
    start_score: float | None = None
    signal_to_noise: float | None = None
    reference_reached: bool = None
    reference_best_smoothed: float | None = None
    critical_training_batch: CriticalTrainingBatch = None
    grad_norm: dict = None
    best_set: list = None
    critical_generation_batch: CriticalGenerationBatch = None
    regime: Regime | None = _opt()   # where a step's time goes at B0

    # eval SE over the climb from the start to the target above which the design is
    # UNDERPOWERED: the SE must be under 1/6 of the climb (signal-to-noise >= 6)
    MIN_SNR = 6.0

    @property
    def eval_power(self) -> str:
        """"OK", "UNDERPOWERED" (the eval noise is too large against the climb from the start
        to the target, or the target is not above the start) or "unknown" (no SE or start)."""
        num = lambda x: isinstance(x, (int, float)) and math.isfinite(x)
        gap = self.target - self.start_score if num(self.target) and num(
            self.start_score) else None
        if num(gap) and gap > 0 and num(self.eval_se) and self.eval_se > 0:
            snr = self.signal_to_noise
            return "OK" if num(snr) and snr >= self.MIN_SNR else "UNDERPOWERED"
        if num(gap) and gap <= 0:
            return "UNDERPOWERED"
        return "unknown"

    def to_json(self) -> dict:
        out = _json(self)
        for k in RECORDS:
            if out.get(k) is not None:
                out[k] = out[k].to_json()
        return out

    @classmethod
    def from_json(cls, d: dict) -> "AlgoSummary":
        d = {**d, **{k: t.from_json(d[k]) for k, t in RECORDS.items() if k in d}}
        return _from(cls, d, "algos")


RECORDS = {"critical_training_batch": CriticalTrainingBatch,
           "critical_generation_batch": CriticalGenerationBatch, "regime": Regime}


def _json_of(x):
    return x.to_json() if hasattr(x, "to_json") else x


# Top-level keys written from algos[primary_algo] (docs/api.md, Summary), and the short
# aliases.
PRIMARY_KEYS = ("target", "target_rule", "eval_se", "eval_se_source", "curve_jitter_se",
                "signal_to_noise", "start_score", "reference_config", "reference_runs",
                "reference_reached", "best_set", "critical_training_batch",
                "critical_generation_batch", "grad_norm")
ALIASES = {"reference": "reference_config", "best": "best_set"}


@dataclasses.dataclass(frozen=True)
class Summary:
    """summary.json, typed. Per algorithm numbers live in ``algos`` only; ``to_json`` writes the
    primary algorithm's at the top level too."""

    ci_level: float
    primary_algo: str
    algos: dict            # {algo: AlgoSummary}
    runs: dict             # {run name: RunStats}
    configs: dict          # {config: ConfigStats}
    tolerance: float
    n_boot: int
    skipped: list
    warnings: list
    partial_rollout: list = dataclasses.field(default_factory=list)   # recorded: may lack it
    findings: tuple = ()   # (Finding, ...); summaries recorded before findings were data: ()
    sweep_dir: str | None = None
    n_unit: str = "responses"   # what N counts: "responses" or "tokens" (response_tokens)
    # Design and decision: family-wise test setup, power, drift, lr bracket.
    familywise: dict | None = None         # {families, n_tests, alpha, margin, method}
    min_detectable_r_N: float | None = None           # 80% power, primary algorithm
    min_detectable_T_over_T0: float | None = None
    power: dict | None = None              # {algo: records.Power}
    drift: Drift | None = None             # where r_q comes from
    lr_tuning: dict | None = None          # {grid, scores, chosen, bracketed, ...}
    lr_tuning_by_algo: dict | None = None
    lr_tuning_per_batch: dict | None = None   # {algo: {B: lr_tuning}} (retune_lr_per_batch)
    lora: dict | None = None                  # {config: {rank, alpha, targets}} LoRA runs
    lr_tuning_cost: dict | None = None        # {algo: {B: {runs, responses, wall_s}}}
    sequential: dict | None = None            # a sequential study's looks and decisions

    @property
    def primary(self) -> AlgoSummary:
        return self.algos[self.primary_algo]

    @property
    def targets(self) -> dict:
        return {a: x.target for a, x in self.algos.items()}

    @property
    def reference_configs(self) -> dict:
        return {a: x.reference_config for a, x in self.algos.items()}

    def to_json(self) -> dict:
        p = self.primary
        out: dict[str, Any] = {"ci_level": self.ci_level, "n_unit": self.n_unit}
        out.update(target=p.target, targets=self.targets, target_rule=p.target_rule,
                   eval_se=p.eval_se, eval_se_source=p.eval_se_source,
                   curve_jitter_se=p.curve_jitter_se, signal_to_noise=p.signal_to_noise,
                   start_score=p.start_score, reference=p.reference_config,
                   reference_config=p.reference_config,
                   reference_configs=self.reference_configs, reference_runs=p.reference_runs,
                   reference_reached=p.reference_reached, primary_algo=self.primary_algo,
                   algos={a: x.to_json() for a, x in self.algos.items()},
                   runs={n: x.to_json() for n, x in self.runs.items()},
                   configs={g: x.to_json() for g, x in self.configs.items()},
                   best_set=p.best_set, best=p.best_set,
                   critical_training_batch=_json_of(p.critical_training_batch),
                   critical_generation_batch=_json_of(p.critical_generation_batch),
                   grad_norm=p.grad_norm, partial_rollout=self.partial_rollout,
                   findings=[f.to_json() for f in self.findings], tolerance=self.tolerance,
                   n_boot=self.n_boot, skipped=self.skipped, warnings=self.warnings)
        for k in ("familywise", "min_detectable_r_N", "min_detectable_T_over_T0", "power",
                  "drift", "lr_tuning", "lr_tuning_by_algo", "lr_tuning_per_batch",
                  "lr_tuning_cost", "lora", "sequential"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        if self.power is not None:
            out["power"] = {a: _json_of(x) for a, x in self.power.items()}
        if self.drift is not None:
            out["drift"] = self.drift.to_json()
        out["sweep_dir"] = self.sweep_dir
        return out

    @classmethod
    def from_json(cls, d: dict) -> "Summary":
        """From summary.json's dict (as written by `to_json`, or recorded earlier). Keys that
        callers add beside the summary (summary_path, report_path, errors, lr_tune) and the
        top-level copies of the primary algorithm's numbers are not fields."""
        derived = set(PRIMARY_KEYS) | set(ALIASES) | {"targets", "reference_configs",
                                                      "summary_path", "report_path",
                                                      "errors", "lr_tune"}
        kw = {k: v for k, v in d.items() if k not in derived}
        kw["algos"] = {a: AlgoSummary.from_json(x) for a, x in d["algos"].items()}
        kw["runs"] = {n: RunStats.from_json(x) for n, x in d["runs"].items()}
        kw["configs"] = {g: ConfigStats.from_json(x) for g, x in d["configs"].items()}
        kw["findings"] = tuple(Finding.from_json(f) for f in d.get("findings") or ())
        if d.get("power") is not None:
            kw["power"] = {a: Power.from_json(x) for a, x in d["power"].items()}
        kw["drift"] = Drift.from_json(d.get("drift"))
        kw.setdefault("sweep_dir", None)
        return _from(cls, kw, "summary")


def as_summary(x) -> Summary:
    """A Summary from a Summary or summary.json's dict."""
    return x if isinstance(x, Summary) else Summary.from_json(x)
