"""W&B history exports: a run's history as CSV or parquet, one row per ``wandb.log`` call.

Layout followed: wandb's public API ``Run.history(samples=..., pandas=True)`` /
``Run.scan_history()`` (``wandb/apis/public/runs.py``): one row per history step with the
logged keys as columns plus wandb's own ``_step`` (the index of the ``wandb.log`` call, or
the ``step=`` the run passed), ``_runtime`` (seconds since the run started) and
``_timestamp``; written with ``DataFrame.to_csv`` / ``to_parquet`` (the UI's "Export CSV"
gives the same columns). A row lacks (CSV: empty cell; parquet: null) what that call did not
log. Each export file is one run: ``--sweep_dir`` holds the files (a run's name is the file
name without extension) or one subdirectory per run holding its export.

What the columns mean is detected or declared: an export of an OpenRLHF run
(``train/timing/step_total``, ...; see `openrlhf`) or of a verl run (``timing_s/step``,
``val-core/...``; see `verl`; its ``_step`` is verl's step) is read with that framework's
names; any other needs ``--tag_map`` (the fields of `mapped.FIELDS`), with ``elapsed=_runtime``
as the default wall time (it includes eval and logging time, said in the report).
"""

from __future__ import annotations

import csv
import glob
import os

from jaxrl_scale.scaling import io as sio
from jaxrl_scale.scaling.readers import mapped, openrlhf
from jaxrl_scale.scaling.readers.common import ReaderError, SkipRun

STEP, RUNTIME, TIMESTAMP = "_step", "_runtime", "_timestamp"
EXTS = (".csv", ".parquet")
VERL_MAP = {"time": "timing_s/step", "eval_time": "timing_s/testing", "gen": "timing_s/gen",
            "train": "timing_s/update_actor"}
VERL_SCORE_RE = r"^val-core/.+/mean@\d+$"


def columns(path: str) -> list[str] | None:
    """The file's column names; None when it cannot be read as CSV/parquet at all."""
    try:
        if path.endswith(".parquet"):
            import pyarrow.parquet as pq
            return list(pq.read_schema(path).names)
        with open(path, newline="", encoding="utf-8") as f:
            return next(csv.reader(f), [])
    except Exception:      # detection never raises: the reader names the problem
        return None


def is_export(path: str, unreadable: bool = False) -> bool:
    """A CSV/parquet with W&B's ``_step`` and ``_runtime`` (or ``_timestamp``) columns;
    ``unreadable``: also one that cannot be read at all (a cut parquet), so that the reader
    names it rather than it vanishing."""
    if not (path.endswith(EXTS) and os.path.isfile(path)):
        return False
    cols = columns(path)
    if cols is None:
        return unreadable
    return STEP in cols and (RUNTIME in cols or TIMESTAMP in cols)


def tables(run_dir: str) -> list[str]:
    """The CSV/parquet files directly in ``run_dir``."""
    return [p for ext in EXTS for p in sorted(glob.glob(os.path.join(run_dir, "*" + ext)))]


def exports(run_dir: str, unreadable: bool = True) -> list[str]:
    """The W&B export files directly in ``run_dir`` (``unreadable``: and the tables that
    cannot be read at all, for the reader to name)."""
    return [p for p in tables(run_dir) if is_export(p, unreadable)]


def read_rows(path: str) -> list[tuple[float, dict]]:
    """[(_step, {column: number})] in ``_step`` order; ValueError naming the file when it
    cannot be read."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq
        try:
            table = pq.read_table(path).to_pylist()
        except Exception as e:
            raise ValueError(f"{path}: unreadable parquet ({type(e).__name__}: {e})") from None
        raw = table
    else:
        with open(path, newline="", encoding="utf-8") as f:
            raw = list(csv.DictReader(f))
    rows = []
    for r in raw:
        vals = {}
        for k, v in r.items():
            if k is None:
                continue
            x = sio._num(v) if isinstance(v, str) else (float(v) if isinstance(
                v, (int, float)) and not isinstance(v, bool) else None)
            if x is not None:
                vals[k] = x
        if STEP in vals:
            rows.append((vals[STEP], vals))
    rows.sort(key=lambda x: x[0])
    return rows


def _preset(cols: set[str]) -> tuple[str, dict, dict, list[str]]:
    """(framework, tag map, run_from_rows options, warnings) detected from the columns."""
    if openrlhf.is_tags(cols):
        tmap, warnings = openrlhf.preset(cols, wandb=True)
        return "openrlhf", tmap, dict(step_is_update=True, score_pattern=openrlhf.SCORE_RE,
                                      score_desc=openrlhf.SCORE_DESC), warnings
    if "timing_s/step" in cols or any(c.startswith("val-core/") for c in cols):
        return "verl", dict(VERL_MAP), dict(step_is_update=True, score_pattern=VERL_SCORE_RE,
                                            score_desc="val-core/<source>/<var>/mean@N"), []
    return "", {}, dict(step_is_update=False), []


def read_run(path: str, name: str | None = None, **overrides) -> sio.Run:
    """One export (a file, or a directory holding one) as the analysis's run record."""
    if os.path.isdir(path):
        files = exports(path)
        if len(files) != 1:
            raise SkipRun(f"{len(files)} W&B exports in {path}: put one per run directory")
        run_dir, file = path, files[0]
    else:
        run_dir, file = os.path.dirname(path), path
    name = name or os.path.splitext(os.path.basename(os.path.normpath(path)))[0]
    rows = read_rows(file)
    if not rows:
        raise SkipRun(f"{file}: no rows with {STEP} (empty or truncated export)")
    cols = {k for _, r in rows for k in r}
    framework, tmap, opts, warnings = _preset(cols)
    tmap = mapped.present_only(tmap, cols)
    user = mapped.parse_tag_map(overrides.get("tag_map"))
    if framework:
        warnings.insert(0, f"{file}: the columns {framework} logs, read with its names")
    elif not user:
        raise ReaderError("tag_map", f"run {name}: {file} is a W&B export whose columns are "
                          "not a known framework's, and no tag map says which is the eval "
                          "score and the responses", "pass --tag_map=score=<column>,"
                          "samples=<column>[,time=<column>] (elapsed=_runtime by default)")
    tmap.update(user)
    if user.get("step"):
        opts["step_is_update"] = True
    if not (tmap.get("time") or tmap.get("elapsed")) and RUNTIME in cols:
        tmap["elapsed"] = RUNTIME
    return mapped.run_from_rows(name, run_dir, "wandb", rows, tmap, source=file,
                                overrides=overrides, warnings=warnings, **opts)
