"""Typed values of the analysis: each statistic is built once, by the stage that measures it.

`Ratio`: one estimate of a ratio to the reference (r_N, r_q or T/T0) with its interval and its
source. `ConfigRatios`: every estimate of one config's three ratios, each from the stage that
made it (the seed bootstrap, the family-wise t tests, the interleaved timing pass); which one
the report prints is a rule here (`headline`), not an overwrite. `FamilyTest`: one config's
family-wise verdict (`scaling.familywise`). summary.json keeps the flat names of
docs/api.md, ConfigStats: `ConfigRatios.flat` writes them, `ConfigRatios.from_flat` reads them.
Numpy only, no JAX.
"""

from __future__ import annotations

import dataclasses
from typing import Any

NAMES = ("r_N", "r_q", "T_over_T0")

BOOTSTRAP = "bootstrap"        # hierarchical bootstrap over seeds; value: ratio of seed means
TIMING_PASS = "timing pass"    # the interleaved timing pass (`scaling.drift`), r_q only


@dataclasses.dataclass(frozen=True)
class Ratio:
    """One estimate of a ratio to the reference: ``value`` (the centre of ``ci`` for a t test),
    ``ci`` at the summary's ci_level ([lo, hi], an end None when unknown) and ``source``
    (BOOTSTRAP, TIMING_PASS, or the family-wise test's method: "paired t", "pooled t",
    "paired t + interleaved r_q"). ``sci``: the interval simultaneous over the family (t tests
    only); ``log_ratio``, ``se``, ``df``: the test on the log scale, where there is one."""

    value: float | None
    ci: list | None
    source: str
    sci: list | None = None
    log_ratio: float | None = None
    se: float | None = None
    df: float | None = None

    @property
    def is_t(self) -> bool:
        return self.source not in (BOOTSTRAP, TIMING_PASS)


@dataclasses.dataclass(frozen=True)
class ConfigRatios:
    """A config's r_N, r_q and T/T0, every estimate kept with its source.

    boot: the seed bootstrap (`configs.config_stats`); t: the family-wise t tests
    (`familywise.sweep_tests`, configs tested against their reference); r_q_pass: the
    interleaved timing pass (`drift.interleaved_r_q`). The headline of each ratio: t where
    tested, else the bootstrap; for r_q the pass first (T/T0's test then used it too)."""

    boot: dict = dataclasses.field(default_factory=dict)     # {name: Ratio}
    t: dict = dataclasses.field(default_factory=dict)        # {name: Ratio}
    r_q_pass: Ratio | None = None

    def in_run(self, name: str) -> Ratio | None:
        """The estimate from the runs' own step times and N* (t where tested)."""
        return self.t.get(name) or self.boot.get(name)

    def headline(self, name: str) -> Ratio | None:
        """The estimate the report prints, and T/T0's verdict rests on."""
        if name == "r_q" and self.r_q_pass is not None:
            return self.r_q_pass
        return self.in_run(name)

    def flat(self) -> dict[str, Any]:
        """summary.json's per-config ratio keys (docs/api.md, ConfigStats): r_N, r_N_ci, ...
        always; the *_ci_boot, *_sci, *_geo, *_ratio_of_means of tested ratios, and
        r_q_in_run(_ci), T_over_T0_in_run where the timing pass supplied r_q."""
        out: dict[str, Any] = {}
        for name in NAMES:
            h = self.headline(name)
            out[name] = h.value if h else None
        for name in NAMES:
            h = self.headline(name)
            out[name + "_ci"] = h.ci if h else None
        opt: dict[str, Any] = {}
        for name in NAMES:
            t, b = self.t.get(name), self.boot.get(name)
            if t is not None:
                opt[name + "_ci_boot"] = b.ci if b else None
                opt[name + "_sci"] = t.sci
                opt[name + "_geo"] = t.value
                opt[name + "_ratio_of_means"] = b.value if b else None
        tt = self.t.get("T_over_T0")
        if tt is not None and "interleaved" in tt.source:
            b = self.boot.get("T_over_T0")
            opt["T_over_T0_in_run"] = b.value if b else None
        if self.r_q_pass is not None:
            r = self.in_run("r_q")
            opt["r_q_in_run"], opt["r_q_in_run_ci"] = (r.value, r.ci) if r else (None, None)
        return {**out, **{k: v for k, v in opt.items() if v is not None}}

    @classmethod
    def from_flat(cls, d: dict, test: str | None = None) -> "ConfigRatios":
        """The inverse of `flat` on summary.json's keys (``test``: the config's T/T0 test
        method, which names the t estimates' source)."""
        method = test or "paired t"
        passed = "r_q_in_run" in d
        boot, t = {}, {}
        for name in NAMES:
            value, ci = d.get(name), d.get(name + "_ci")
            if passed and name == "r_q":
                value, ci = d.get("r_q_in_run"), d.get("r_q_in_run_ci")
            if name + "_geo" in d:
                src = method if name == "T_over_T0" else method.split(" + ")[0]
                t[name] = Ratio(d[name + "_geo"], ci, src, sci=d.get(name + "_sci"))
                boot[name] = Ratio(d.get(name + "_ratio_of_means"), d.get(name + "_ci_boot"),
                                   BOOTSTRAP)
            elif value is not None or ci is not None:
                boot[name] = Ratio(value, ci, BOOTSTRAP)
        p = Ratio(d.get("r_q"), d.get("r_q_ci"), TIMING_PASS) if passed else None
        return cls(boot=boot, t=t, r_q_pass=p)


FLAT_KEYS = tuple(f"{n}{s}" for n in NAMES for s in ("", "_ci", "_ci_boot", "_sci", "_geo",
                                                      "_ratio_of_means")) + (
    "T_over_T0_in_run", "r_q_in_run", "r_q_in_run_ci")


@dataclasses.dataclass(frozen=True)
class FamilyTest:
    """One config's family-wise verdict against its reference (`familywise.sweep_tests`):
    Holm over the family's T/T0 tests; ``ratios`` its t estimates ({name: Ratio}, those with
    an interval); r_q_in_run_test, T_over_T0_test: {log_ratio, se, df} of the in-run r_q test
    and of the verdict's test; fragile: the verdict's statistic lies in
    `reproducibility.fragile_band` (a rerun repeats such verdicts about half the time)."""

    verdict: str
    p_value: float | None
    p_holm: float
    test: str | None
    alike_T: bool | None
    alike_r_N: bool | None
    r_q_in_run_test: dict
    T_over_T0_test: dict
    ratios: dict = dataclasses.field(default_factory=dict)
    fragile: bool | None = None

    def fields(self) -> dict:
        """The config's summary.json verdict keys (docs/api.md, FamilyTest)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "ratios"}


__all__ = ["BOOTSTRAP", "TIMING_PASS", "NAMES", "FLAT_KEYS", "Ratio", "ConfigRatios",
           "FamilyTest"]
