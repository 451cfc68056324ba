"""What the analysis' sample count N counts, declared (docs/science.md, Time to target):
"responses" (each record's cumulative retained ``responses``, as logged; the default) or
"tokens" (its cumulative ``response_tokens``: the retained responses' tokens in the loss, an
episode's observation tokens excluded; experiment/train.py records it). `in_n_unit` moves the
tokens into ``responses`` once, where the runs are loaded, so every reader of N (N*, r_N, q,
the curves, the report) counts them. Numpy only, no JAX.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Sequence

from jaxrl_scale.numbers import is_number
from jaxrl_scale.scaling.io import METRICS_FILE, Run

N_UNITS = ("responses", "tokens")   # what N counts (docs/science.md, Time to target)
TOKENS_KEY = "response_tokens"      # the records' cumulative loss tokens (experiment/train.py)


def check_n_unit(n_unit: str | None) -> None:
    """ConfigError (one line) for an n_unit that is none of `N_UNITS` (None: the runs' own)."""
    if n_unit is not None and n_unit not in N_UNITS:
        from jaxrl_scale.experiment.errors import ConfigError
        raise ConfigError("n_unit", f"must be one of {', '.join(N_UNITS)}, got {n_unit!r}",
                          "pass --n_unit=responses (retained responses) or --n_unit=tokens "
                          "(their tokens in the loss)")


def in_n_unit(runs: Sequence[Run], n_unit: str | None) -> list[Run]:
    """The runs with N counted in ``n_unit`` (`N_UNITS`; None: as they are). "responses": the
    runs as read (the same objects). "tokens": each record's ``responses`` replaced by its
    cumulative ``response_tokens`` (train and eval records, which stay in their order), so
    every reader of N (N*, r_N, q, curves) counts tokens; the batch B stays in responses.
    ConfigError("n_unit", ...) naming the first run whose records lack it (another
    framework's log, or a run recorded before response_tokens) or hold a bad one; a run
    already in ``n_unit`` is kept. Cheap: call it before the expensive work."""
    check_n_unit(n_unit)
    if n_unit is None:
        return list(runs)
    out = []
    for run in runs:
        if run.n_unit == n_unit:
            out.append(run)
            continue
        if n_unit == "responses":   # the counts were replaced: read the run again
            raise ValueError(f"run {run.name} counts N in {run.n_unit}; read it again to "
                             "count responses")
        out.append(dataclasses.replace(run, train=_in_tokens(run, run.train),
                                       evals=_in_tokens(run, run.evals), n_unit=n_unit,
                                       warnings=list(run.warnings)))
    return out


def _in_tokens(run: Run, records: list[dict]) -> list[dict]:
    """`records` with ``responses`` := ``response_tokens``; ConfigError for a record without
    a finite one, or with one that decreases or is negative."""
    from jaxrl_scale.experiment.errors import ConfigError
    where = os.path.join(run.path, METRICS_FILE) if run.path else run.name
    out, last = [], 0.0
    for r in records:
        v = r.get(TOKENS_KEY)
        step = r.get("step", "?")
        if not is_number(v) or not math.isfinite(v):
            got = "none" if v is None else repr(v)
            raise ConfigError("n_unit", f"--n_unit=tokens reads {TOKENS_KEY} on every record, "
                              f"but {where} step {step} has {got} (another framework's log, "
                              "or a run recorded before it was logged)",
                              "pass --n_unit=responses, or rerun the runs with this version "
                              "of jaxrl-train")
        if v < 0 or v < last:
            raise ConfigError("n_unit", f"{TOKENS_KEY} in {where} step {step} is {v:g}, "
                              f"{'negative' if v < 0 else f'less than {last:g} before it'} "
                              "(a cumulative count is >= 0 and non-decreasing)",
                              "fix the log, or pass --n_unit=responses")
        last = v
        out.append({**r, "responses": v})
    return out


def runs_unit(runs: Sequence[Run]) -> str:
    """The one unit the runs count N in (`Run.n_unit`); ValueError for a mix."""
    units = sorted({r.n_unit for r in runs}) or ["responses"]
    if len(units) > 1:
        raise ValueError(f"n_unit: the runs count N in {' and '.join(units)}. Fix: read them "
                         "all with the same --n_unit.")
    return units[0]


__all__ = ["N_UNITS", "TOKENS_KEY", "check_n_unit", "in_n_unit", "runs_unit"]
