"""The sweep report: report.md (answer first, then tables) and figures (PNG, Agg canvas).

report.md opens with "## Answer": the statistical power of the sweep, the verdict of every
config against its algorithm's reference (faster / slower / indistinguishable / not reached,
each T/T0 with its interval), the fastest set, both critical batches and the source's
findings, each marked reproduced / not reproduced / undetermined; then, when the sweep ran
configs with asynchronous partial rollout (gen_batch_ratio k > 1), "## Partial rollout vs
synchronous": q, N* and T ratios against the synchronous twin. Every number comes from
the typed summary of `jaxrl_scale.scaling.analysis.analyze`, with its interval at the
summary's ``ci_level`` where it has one.

Figures (docs/science.md, Time to target, Step-cost model and Critical batches): `FIGURES`,
each described in `figures`.

Split by what it is: `figures` (PNG), `tables` (markdown tables), `text` (sentences), `base`
(shared views of the summary). Renders only: every number and decision comes from the
`scaling.summary.Summary` (findings included); nothing here imports JAX.
"""

from __future__ import annotations

import os
from typing import Sequence

from jaxrl_scale.numbers import UNBOUNDED, fmt, fmt_ci
from jaxrl_scale.report.base import (FIGURES, N_WORDS, REPORT_FILE, _configs, _level,
                                     n_unit, n_unit_sentence)
from jaxrl_scale.report.figures import (plot_batch_trajectory, plot_collection_time,
                                        plot_critical_batches, plot_grad_norm,
                                        plot_learning_curves, plot_time_to_target)
from jaxrl_scale.report.tables import format_table
from jaxrl_scale.report.text import (_answer, _details, facts, partial_rollout_lines,
                                     planner_lines, source_findings)
from jaxrl_scale.scaling.io import Run
from jaxrl_scale.scaling.summary import as_summary

__all__ = ["render", "facts", "format_table", "source_findings", "FIGURES", "REPORT_FILE",
           "fmt", "fmt_ci"]


def render(summary, out_dir: str, runs: Sequence[Run] = (), plans_dir: str | None = None
           ) -> str:
    """Write report.md and the figures into ``out_dir`` from a `Summary` (or summary.json's
    dict) and, for the learning curves, the runs already read; planner outputs (plan*.json)
    in ``plans_dir`` (default ``out_dir``) get a predictions-vs-measured section. Returns the
    path of report.md. Figures that have no data (e.g. no grad norms logged) are listed as
    not drawn, with the reason."""
    summary = as_summary(summary)
    os.makedirs(out_dir, exist_ok=True)
    names = set(summary.runs)
    runs = [r for r in runs if r.name in names]

    drawn, missing = [], []
    p = lambda f: os.path.join(out_dir, f)
    for fname, fn, why in (
            ("learning_curves.png", lambda s, f: plot_learning_curves(runs, s, f),
             "no run with eval records was passed to the report"),
            ("time_to_target.png", plot_time_to_target, ""),
            ("critical_batches.png", plot_critical_batches, ""),
            ("grad_norm.png", plot_grad_norm,
             "fewer than 2 batches (same lr rule as the reference) log actor_grad_norm"),
            ("collection_time.png", plot_collection_time,
             "no run gives a batch and a time per step"),
            *([("batch_trajectory.png", lambda s, f: plot_batch_trajectory(runs, s, f),
                "no scheduled run was passed to the report")]
              if any(st.batch_schedule for st in summary.configs.values()) else [])):
        got = fn(summary, p(fname))
        (drawn.append(got) if got else missing.append(f"{fname}: {why}"))

    main, finds = _answer(summary)
    lvl = _level(summary)
    any_seeds = any((st.seeds or 0) > 1 for st in _configs(summary).values())
    t = summary.primary.target
    md = [f"# Sweep report: time to target J* = {fmt(t, 4)}", "", "## Answer", ""]
    md += [f"- {s}" for s in main]
    md += ["", "Source findings:", ""]
    md += [f"- ({k}) {claim}: **{status}**: {why}." for k, claim, status, why in
           source_findings(summary)]
    if summary.familywise:   # t intervals on log ratios, Holm over the sweep
        rq_of = ("r_q, both r_q and T/T0 from the interleaved timing pass (the in-run r_q "
                 "stays in summary.json as r_q_in_run, the cross-check)"
                 if summary.drift is not None and summary.drift.controlled else "r_q")
        how = (f"N* and q intervals are {lvl} bootstrap intervals [lo, hi] ({UNBOUNDED}: "
               "unbounded, some replicates never reach the target); r_N, r_q and T/T0 intervals "
               f"are {lvl} t intervals on log ratios (seed-paired where the configs share seeds, "
               "variance pooled over the configs; bootstrap for a single seed), and r_N, r_q "
               "and T/T0 are their centres: geometric means of the seed-paired ratios, so r_N "
               "is not the ratio of the N* column's seed means. T/T0 = r_N / "
               f"{rq_of}; faster / slower is a Holm-adjusted test over all configs of the sweep at "
               f"family-wise error {fmt(1 - summary.ci_level, 2)}.")
    else:                    # summaries recorded before family-wise verdicts
        how = (f"Intervals are {lvl} bootstrap intervals [lo, hi] ({UNBOUNDED}: unbounded, some "
               "replicates never reach the target). T/T0 = r_N / r_q; a config is faster / "
               "slower when the whole T/T0 interval is below / above 1.")
    unit = "retained " + N_WORDS[n_unit(summary)]
    md += ["", how + f" q is end-to-end throughput ({unit} per second) over [0, N*]. " +
           n_unit_sentence(summary), ""]
    partial = partial_rollout_lines(summary)
    if partial:
        md += ["## Partial rollout vs synchronous", "",
               "Each config run with asynchronous partial rollout (B_gen = k x B_train "
               "sequences in flight) against the synchronous config that differs only in k: "
               f"q ratio = q_k / q_sync (end-to-end {N_WORDS[n_unit(summary)]} per second), "
               "r_N = N*_k / N*_sync, T ratio = T_k / T_sync = r_N / q ratio, with "
               f"{lvl} intervals from the same seed bootstrap as T/T0; faster / slower when "
               "the T ratio's bootstrap p-value, Holm-adjusted over all these comparisons, is "
               f"below {fmt(1 - summary.ci_level, 2)} (a sweep where partial rollout changes "
               "nothing calls a difference at most that often).", ""]
        md += [f"- {x}" for x in partial] + [""]
    if summary.sweep_dir:
        md += [f"Sweep: `{summary.sweep_dir}`. References: " + ", ".join(
            f"{a}: `{g}`" for a, g in summary.reference_configs.items()) + ".", ""]
    md += ["## Configs", "", format_table(summary), ""]
    if any_seeds:
        md += ["### Per run", "", format_table(summary, per_run=True), ""]
    det = _details(summary)
    if det:
        md += ["## Details", ""] + [f"- {s}" for s in det] + [""]
    for d in dict.fromkeys([plans_dir or out_dir, out_dir]):   # the sweep's plans, then ours
        md += planner_lines(d, summary, p, drawn)
    md += ["## Figures", ""]
    for f in drawn:
        b = os.path.basename(f)
        md += [f"![{b}]({b})", ""]
    if missing:
        md += ["Not drawn:", ""] + [f"- {m}" for m in missing] + [""]
    md += ["## Skipped directories", ""]
    md += ([f"- `{s['dir']}`: {s['reason']}" for s in summary.skipped]
           or ["- none"]) + [""]
    if summary.warnings:
        md += ["## Warnings", ""] + [f"- {w}" for w in summary.warnings] + [""]
    path = os.path.join(out_dir, REPORT_FILE)
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(md))
    os.replace(path + ".tmp", path)
    return path
