"""From finished runs to summary.json and report.md: read the sweep once, analyse it
(`scaling.analysis.analyze` -> a typed `Summary`), write summary.json, render the report.
Needs no JAX (the analysis and the report are numpy + matplotlib)."""

from __future__ import annotations

import os
from typing import Sequence

from jaxrl_scale import report
from jaxrl_scale.scaling import analysis, readers
from jaxrl_scale.scaling import io as sio
from jaxrl_scale.scaling import units
from jaxrl_scale.scaling.io import read_csv_run


def analyze_and_report(sweep_dir: str | None, target, reference: str | None = None,
                       tolerance: float = 0.25, fit_sigmoid: bool = False, *,
                       csv: Sequence[str] = (), columns: str | None = None,
                       out: str | None = None, fmt: str = "auto",
                       overrides: dict | None = None,
                       score_range: tuple[float, float] | str | None = "auto",
                       **kwargs) -> dict:
    """summary.json + report.md (+ figures) of a sweep into ``out`` (default: the sweep dir,
    else the first CSV's directory). CSV runs (``csv`` paths read with the ``columns`` map)
    join the sweep; ``kwargs`` go to `analysis.analyze`. ``fmt`` (`readers.FORMATS`: auto,
    jaxrl, trl, verl, openrlhf, ...) selects the reader of the sweep's runs
    (`scaling.readers`), ``overrides`` supply what their logs lack (responses_per_step,
    world_size, score_key, tag_map, ...); ReaderError for a sweep mixing frameworks or tasks,
    or a run whose batch is unknown. DataError for an eval score outside ``score_range``
    (`scaling.io.check_scores`: "auto" holds jaxrl's accuracies to [0, 1]). Returns
    summary.json's dict plus "summary_path" and
    "report_path"."""
    extra = [read_csv_run(c, columns) for c in csv]
    target = analysis.parse_target(target)
    runs, skipped = _load(sweep_dir, extra, fmt, overrides or {})
    runs = units.in_n_unit(runs, kwargs.get("n_unit"))   # N in tokens: before any other work
    readers.check_one_task(runs, sweep_dir)   # --format=jaxrl and --csv runs too
    sio.check_scores(runs, score_range)
    summary = analysis.analyze(runs, target, reference, tolerance=tolerance,
                               fit_sigmoid=fit_sigmoid,
                               skipped=skipped, sweep_dir=sweep_dir, **kwargs)
    plans = analysis.sweep_dirs(sweep_dir)
    if out is None and len(analysis.sweep_dirs(sweep_dir)) > 1:
        raise analysis.AnalysisError("out: several --sweep_dir studies have no one directory "
                                     "to write to. Fix: pass --out=DIR")
    out = out or sweep_dir or os.path.dirname(os.path.abspath(csv[0]))
    summary_path = analysis.write_summary(out, summary)
    _first_block_plan(runs, summary, plans, out)
    report_path = report.render(summary, out, runs,
                                plans_dir=plans[0] if len(plans) == 1 else out)
    return dict(summary.to_json(), summary_path=summary_path, report_path=report_path)


def _first_block_plan(runs, summary, sweep_dirs, out) -> None:
    """With warm-start blocks and their timing passes: the plan the first block's reference
    runs give (`plan_compare.first_block_plan`) into OUT/plan_first_block.json, which the
    report puts beside the measured verdicts; why not, on stderr, when it cannot."""
    import json
    import sys
    from jaxrl_scale.numbers import to_jsonable
    from jaxrl_scale.scaling import plan_compare
    if len(sweep_dirs) != 1 or not any(x.block for x in summary.runs.values()) or \
            os.path.isfile(os.path.join(sweep_dirs[0], "plan_first.json")):
        return   # one warm-start, or the study's own --plan_first plan is there already
    try:
        with open(os.path.join(sweep_dirs[0], "timing.json")) as f:
            timing = json.load(f)
    except (OSError, ValueError):
        timing = None
    plan, why = plan_compare.first_block_plan(runs, summary, timing)
    path = os.path.join(out, plan_compare.FIRST_BLOCK_PLAN)
    if plan is None:
        print(f"no first-block plan: {why}", file=sys.stderr)
        return
    with open(path, "w") as f:
        json.dump(to_jsonable(plan), f, indent=1)


def _load(sweep_dir, extra, fmt, overrides):
    """Our own sweeps read as always (`analysis.load_runs`); other frameworks' through their
    readers."""
    if sweep_dir is None or fmt == "jaxrl":
        return analysis.load_runs(sweep_dir, extra)
    dirs = analysis.sweep_dirs(sweep_dir)
    if len(dirs) > 1:    # several studies: each read on its own, the runs pooled
        parts = [_load(d, [], fmt, overrides) for d in dirs]
        return ([r for p in parts for r in p[0]] + list(extra),
                [s for p in parts for s in p[1]])
    try:
        sweep = readers.read_sweep_dir(sweep_dir, fmt, **overrides)
    except FileNotFoundError as e:
        raise analysis.AnalysisError(str(e)) from None
    runs = sweep.runs + list(extra)
    if sweep.format == "jaxrl" and not runs:
        return analysis.load_runs(sweep_dir, extra)     # its "no runs" message
    if not runs:
        detail = "; ".join(f"{s['dir']}: {s['reason']}" for s in sweep.skipped) or \
            "it is empty"
        raise analysis.AnalysisError(f"no usable {sweep.format} runs in {sweep_dir!r}: {detail}")
    return runs, sweep.skipped
