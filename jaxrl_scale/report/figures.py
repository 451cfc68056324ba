"""The report's figures (PNG, Agg canvas; ``matplotlib.figure.Figure`` directly, no pyplot
global state), intervals drawn wherever a number has one:

  learning_curves.png   seed-mean J vs responses per config, band min..max over seeds
                        (one seed: +-eval SE); solid sqrt lr, dashed fixed lr; target line
  time_to_target.png    T/T0 vs batch per lr rule, error bars = interval; fastest set marked
  critical_batches.png  generation throughput with the fitted B / (d0 + d1 B) | r_N vs batch
  grad_norm.png         actor (and critic) grad norm vs batch, log-log, with a -1/2 guide
  collection_time.png   responses per step and collection seconds per step, both / smallest
                        batch (the source's Figure 7)
  batch_trajectory.png  batch_train vs cumulative responses of each scheduled run (a batch
                        schedule), the fixed configs' batches beside it, N* marked; only
                        when the study has a scheduled config
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from matplotlib.figure import Figure

from jaxrl_scale.numbers import fmt, fmt_ci
from jaxrl_scale.report.base import (ALGO_MARKERS, N_AXIS, OTHER_STYLE, RULE_STYLES,
                                     _algo_info, _algo_of, _algos, _ci, _configs, _is_ref,
                                     _level, _multi, _ok, _per_batch, _ratio, n_unit)
from jaxrl_scale.report.tables import _table_verdict
from jaxrl_scale.scaling.io import Run
from jaxrl_scale.scaling.summary import Summary


def _style(rule):
    return RULE_STYLES.get(rule, OTHER_STYLE)


def _batch_colors(batches):
    import matplotlib
    bs = sorted({b for b in batches if _ok(b) and b > 0})
    cmap = matplotlib.colormaps["viridis"]
    if not bs:
        return {}
    lo, hi = math.log2(bs[0]), math.log2(bs[-1])
    return {b: cmap(0.85 * ((math.log2(b) - lo) / (hi - lo) if hi > lo else 0.0)) for b in bs}


def _save(fig: Figure, path: str) -> str:
    fig.savefig(path, dpi=110)
    return path


def _mean_band(rs: Sequence[Run], summary: Summary):
    """(N grid, seed-mean J, band lo, band hi, band kind) of one config's runs."""
    curves = [r.eval_curve() for r in rs if r.eval_curve()[0].size]
    if not curves:
        return None
    lo_n = max(n[0] for n, _ in curves)
    hi_n = min(n[-1] for n, _ in curves)
    grid = np.unique(np.concatenate([n[(n >= lo_n) & (n <= hi_n)] for n, _ in curves]))
    if grid.size == 0:
        grid = curves[0][0]
    ys = np.array([np.interp(grid, n, s) for n, s in curves])
    mean = ys.mean(axis=0)
    if len(curves) > 1:
        return grid, mean, ys.min(axis=0), ys.max(axis=0), "min..max over seeds"
    x = summary.runs.get(rs[0].name)
    se = x.eval_se if x is not None else None
    se = se if _ok(se) else 0.0
    return grid, mean, mean - se, mean + se, "±eval SE"


def plot_learning_curves(runs: Sequence[Run], summary: Summary, path: str) -> str | None:
    groups: dict[str, list[Run]] = {}
    for r in runs:
        groups.setdefault(r.group or r.name, []).append(r)
    if not any(r.evals for r in runs):
        return None
    configs = _configs(summary)
    algos = sorted({(r.algo or "?") for r in runs},
                   key=lambda a: (a != summary.primary_algo, a))
    fig = Figure(figsize=(7 * len(algos), 4.8), layout="constrained")
    axes = fig.subplots(1, len(algos), squeeze=False)[0]
    colors = _batch_colors([r.batch for r in runs])
    # configs sharing a batch (e.g. the same B with and without refill) get a colour each
    by_group = len({r.batch for r in runs}) < len(groups)
    kinds = set()
    for ax, algo in zip(axes, algos):
        items = sorted(((g, rs) for g, rs in groups.items() if (rs[0].algo or "?") == algo),
                       key=lambda kv: (kv[1][0].batch or math.inf, kv[0]))
        for i, (g, rs) in enumerate(items):
            got = _mean_band(rs, summary)
            if got is None:
                continue
            grid, mean, lo, hi, kind = got
            kinds.add(kind)
            st = configs.get(g)
            color = f"C{i % 10}" if by_group else colors.get(rs[0].batch, "gray")
            ref = " (ref)" if st is not None and _is_ref(summary, g, st) else ""
            refill = st is not None and bool(st.refill)
            verdict = _table_verdict(summary, g, st) if st and not ref else "-"
            label = (f"{g}{ref}: B={fmt(rs[0].batch)}, {len(rs)} seed(s)"
                     + (f", {verdict}" if verdict != "-" and not verdict.startswith("n/a")
                        else "") + (", refill" if refill else ""))
            partial = rs[0].gen_batch_ratio != 1
            ax.plot(grid, mean, linestyle=_style(rs[0].lr_rule), color=color, lw=1.5,
                    label=label, marker="^" if partial else None, markevery=0.1, ms=4)
            ax.fill_between(grid, lo, hi, color=color, alpha=0.18, lw=0)
        t = summary.targets.get(algo, summary.primary.target)
        if _ok(t):
            ax.axhline(t, color="red", lw=0.9, ls=":", label=f"target J* = {fmt(t)}")
        ax.set_xlabel(N_AXIS[n_unit(summary)])
        ax.set_ylabel("validation score J")
        ax.set_title(f"{algo}: seed-mean learning curves", fontsize=10)
        ax.legend(fontsize=7, loc="lower right")
        ax.grid(alpha=0.3)
    fig.suptitle("Band: " + " / ".join(sorted(kinds)) + "; solid sqrt lr, dashed fixed lr"
                 + ("; triangles: partial rollout (k > 1)" if any(
                     r.gen_batch_ratio != 1 for r in runs) else ""), fontsize=9)
    return _save(fig, path)


def plot_grad_norm(summary: Summary, path: str) -> str | None:
    entries = []
    for algo in _algos(summary):
        grad = _algo_info(summary, algo).grad_norm
        for key, g in grad.items():
            if g and len(g.get("batches") or []) >= 2:
                entries.append((algo, key, g))
    if not entries:
        return None
    fig = Figure(figsize=(6.5, 4.4), layout="constrained")
    ax = fig.add_subplot()
    multi = _multi(summary)
    for i, (algo, key, g) in enumerate(entries):
        color = f"C{i}"
        b, v = np.array(g["batches"], float), np.array(g["norms"], float)
        rng = g.get("norm_ranges") or [[x, x] for x in v]
        err = np.array([[max(x - lo, 0.0), max(hi - x, 0.0)] for x, (lo, hi) in zip(v, rng)]).T
        who = key.split("_")[0]
        name = f"{algo} {who}" if multi else who
        ax.errorbar(b, v, yerr=err, marker="o" if who == "actor" else "s", color=color,
                    capsize=3,
                    label=f"{name}: slope {fmt_ci(g.get('slope'), g.get('slope_ci'), 2)}")
        if g.get("flattens_after"):
            ax.axvline(g["flattens_after"], color=color, ls=":", lw=0.9,
                       label=f"{name} flattens after B={fmt(g['flattens_after'])}")
        bb = np.array([b[0], b[-1]])
        ax.plot(bb, v[0] * (bb / b[0]) ** -0.5, color=color, ls="--", lw=0.8, alpha=0.6,
                label="B^(-1/2) guide" if i == 0 else None)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch (retained responses per update)")
    ax.set_ylabel("median grad norm (bars: min..max over runs)")
    ax.set_title(f"Grad norm vs batch (lr rule {entries[0][2].get('lr_rule')}); "
                 f"slope with {_level(summary)} interval", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)


def plot_collection_time(summary: Summary, path: str) -> str | None:
    bs, coll = _per_batch(summary, "collection_s_per_step")
    if not bs:
        return None
    fig = Figure(figsize=(6.5, 4.2), layout="constrained")
    ax = fig.add_subplot()
    x = np.arange(len(bs))
    resp = np.array(bs) / bs[0]
    tcol = np.array(coll) / coll[0]
    w = 0.38
    ax.bar(x - w / 2, resp, w, label="responses per step", color="C0")
    ax.bar(x + w / 2, tcol, w, label="collection seconds per step", color="C3")
    for xi, a, b in zip(x, resp, tcol):
        ax.text(xi - w / 2, a, f"{a:.2g}x", ha="center", va="bottom", fontsize=7)
        ax.text(xi + w / 2, b, f"{b:.2g}x", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, [fmt(b) for b in bs])
    ax.set_xlabel("batch (retained responses per update)")
    ax.set_ylabel(f"relative to B={fmt(bs[0])}")
    metric = summary.primary.critical_generation_batch.metric or "?"
    ax.set_title(f"Per-step growth vs the smallest batch (source Fig. 7); collection = {metric}",
                 fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, path)


def _yerr(vals, cis, top):
    """Asymmetric error bars; an unbounded upper end is drawn up to ``top``."""
    lo_e, hi_e = [], []
    for v, ci in zip(vals, cis):
        lo, hi = _ci(ci)
        lo_e.append(max(v - lo, 0.0) if _ok(lo) else 0.0)
        hi_e.append(max((hi if _ok(hi) else top) - v, 0.0) if (_ok(hi) or _ok(lo)) else 0.0)
    return np.array([lo_e, hi_e])


def plot_time_to_target(summary: Summary, path: str) -> str:
    """T/T0 vs batch with interval bars; when no config has a T/T0 (the reference missed the
    target) the absolute time to target T of the configs that reached it instead."""
    fig = Figure(figsize=(7, 4.6), layout="constrained")
    ax = fig.add_subplot()
    configs = _configs(summary)
    multi = _multi(summary)
    algos = _algos(summary) or sorted({_algo_of(st) for st in configs.values()})
    ratio = any(_ok(st.T_over_T0) for st in configs.values())
    key, ci_key = ("T_over_T0", "T_over_T0_ci") if ratio else ("T", None)
    vals = [getattr(st, key) for st in configs.values() if _ok(getattr(st, key))]
    his = [_ci(getattr(st, ci_key))[1] for st in configs.values()] if ci_key else []
    top = max(vals + [h for h in his if _ok(h)] + [1.0 if ratio else 0.0]) * 1.15 or 1.0
    best = set()
    for algo in algos:
        best |= set(_algo_info(summary, algo).best_set)
    # one series per (algo, lr rule, group size, rollout ratio): a line never joins different
    # group sizes or rollouts
    series: dict[tuple, list] = {}
    for g, st in configs.items():
        if _ok(st.batch):
            k = (algos.index(_algo_of(st)) if _algo_of(st) in algos else len(algos),
                 st.lr_rule or "?", str(st.group_size), _ratio(st))
            series.setdefault(k, []).append((g, st))
    n_gs = len({k[2] for k in series if k[2] != "None"})
    for si, k in enumerate(sorted(series)):
        ai, rule, gs, ratio_k = k
        algo = algos[ai] if ai < len(algos) else "?"
        color, marker = f"C{si % 10}", ALGO_MARKERS[ai % len(ALGO_MARKERS)]
        pts = [(st.batch * 1.03 ** si, g, st) for g, st in
               sorted(series[k], key=lambda kv: (kv[1].batch, kv[0]))]
        ok = [(x, g, st) for x, g, st in pts if _ok(getattr(st, key))]
        name = ((f"{algo} " if multi else "") + f"lr {rule}"
                + (f" G={gs}" if n_gs > 1 and gs != "None" else "")
                + (f" k={fmt(ratio_k)}" if ratio_k != 1 else ""))
        if ok:
            ys = [getattr(st, key) for _, _, st in ok]
            err = _yerr(ys, [getattr(st, ci_key) for _, _, st in ok], top) if ci_key else None
            ax.errorbar([x for x, _, _ in ok], ys, yerr=err, ls=_style(rule), marker=marker,
                        color=color, capsize=3,
                        label=name + (f" ({_level(summary)} interval)" if ci_key else ""))
            for x, g, st in ok:
                if g in best:
                    ax.scatter([x], [getattr(st, key)], marker="*", s=260, color="gold",
                               edgecolor="k", zorder=5)
        miss = [x for x, _, st in pts if not st.reached]
        if miss:
            ax.scatter(miss, [top] * len(miss), marker="x", color=color, s=60,
                       label=f"{name}: not reached")
    if best:
        ax.scatter([], [], marker="*", s=150, color="gold", edgecolor="k",
                   label=(f"fastest set ({len(best)} configs, see report)" if len(best) > 3
                          else "fastest set: " + ", ".join(sorted(best))))
    if not ratio:
        ax.text(0.5, 0.5, "no T/T0: the reference did not reach the target\n"
                "(absolute time to target T of the configs that did)",
                transform=ax.transAxes, ha="center", va="center", fontsize=9, color="C3")
    if ratio:
        ax.axhline(1.0, color="gray", lw=0.8, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch (retained responses per update)")
    ax.set_ylabel(("T / T0 = r_N / r_q" if ratio else "T (s) to J*") + "   (x: not reached)")
    ax.set_title(f"Time to target J*={fmt(summary.primary.target)} vs reference "
                 + ", ".join(summary.reference_configs.values()), fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_critical_batches(summary: Summary, path: str) -> str:
    fig = Figure(figsize=(12, 4.6), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    cgb = summary.primary.critical_generation_batch
    pts = cgb.points or []
    if pts:
        b = np.array([p["batch"] for p in pts], float)
        tp = np.array([p["throughput"] for p in pts], float)
        rng = [p.get("throughput_range") or [t, t] for p, t in zip(pts, tp)]
        err = np.array([[max(t - lo, 0.0), max(hi - t, 0.0)] for t, (lo, hi) in zip(tp, rng)]).T
        ax1.errorbar(b, tp, yerr=err, fmt="o", color="C0", capsize=3,
                     label="measured (median, bars min..max over runs)")
        d0, d1 = cgb.d0, cgb.d1
        if _ok(d0) and _ok(d1):
            hi_b = max(b.max(), (cgb.batch or 0) * 1.5)
            bb = np.geomspace(b.min(), hi_b, 100)
            with np.errstate(divide="ignore", invalid="ignore"):
                fit = bb / (d0 + d1 * bb)
            ax1.plot(bb, np.where(fit > 0, fit, np.nan), color="C0", ls="--", lw=1,
                     label=f"fit B/(d0+d1 B): d0={fmt_ci(d0, cgb.d0_ci)} s, "
                           f"d1={fmt_ci(d1, cgb.d1_ci)} s")
    if _ok(cgb.batch):
        lo, hi = _ci(cgb.batch_ci)
        ax1.axvline(cgb.batch, color="C3", ls="--",
                    label=f"critical generation batch {fmt_ci(cgb.batch, cgb.batch_ci)}"
                          + ("" if cgb.within_grid else " (outside the grid)"))
        if _ok(lo):
            # A lower end of 0 (no fixed cost) must not stretch the log axis to 2^-30.
            floor = min([p["batch"] for p in pts] + [cgb.batch]) / 2
            ax1.axvspan(max(lo, floor), hi if _ok(hi) else ax1.get_xlim()[1], color="C3",
                        alpha=0.08)
    else:
        ax1.plot([], [], " ", label="no critical generation batch estimated")
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel(cgb.batch_kind or "batch")
    ax1.set_ylabel("responses / collection second" if cgb.metric == "gen_s"
                   else "responses / step second (no gen_s logged)")
    ax1.set_title("System: generation throughput", fontsize=10)
    ax1.legend(fontsize=7)
    ax1.grid(alpha=0.3)

    tol = summary.tolerance
    algos = _algos(summary)
    ctbs = [_algo_info(summary, algo).critical_training_batch for algo in algos]
    ymax = 1.0 + (tol or 0.0)
    for ctb in ctbs:
        for p in ctb.points or []:
            ymax = max([ymax] + [v for v in (p.get("r_N"), _ci(p.get("r_N_ci"))[1]) if _ok(v)])
    for ai, (algo, ctb) in enumerate(zip(algos, ctbs)):
        tol = ctb.tolerance if ctb.tolerance is not None else tol
        pts2 = ctb.points or []
        color = f"C{2 + ai}"
        name = f"{algo} " if _multi(summary) else ""
        # several configs at one batch (e.g. group sizes): spread them a little in x
        seen: dict[float, int] = {}
        xs = []
        for p in pts2:
            k = seen.get(p["batch"], 0)
            seen[p["batch"]] = k + 1
            xs.append(p["batch"] * 1.03 ** (k + 2 * ai))
        ok = [(x, p) for x, p in zip(xs, pts2) if p.get("reached") and _ok(p.get("r_N"))]
        if ok:
            ys = [p["r_N"] for _, p in ok]
            err = _yerr(ys, [p.get("r_N_ci") for _, p in ok], ymax * 1.1)
            ax2.errorbar([x for x, _ in ok], ys, yerr=err, fmt=ALGO_MARKERS[ai % 5], color=color,
                         capsize=3, label=f"{name}r_N (lr {ctb.lr_rule}, "
                                          f"{_level(summary)} interval)")
        miss = [x for x, p in zip(xs, pts2) if not p.get("reached")]
        if miss:
            ax2.scatter(miss, [ymax * 1.1] * len(miss), marker="x", color=color, s=60,
                        label=f"{name}not reached")
        if _ok(ctb.batch):
            ax2.axvline(ctb.batch, color=color, ls="--", lw=1, alpha=0.6,
                        label=f"{name}critical training batch {fmt(ctb.batch)}")
        if _ok(ctb.cost_detected_at):
            ax2.axvline(ctb.cost_detected_at, color=color, ls=":", lw=1, alpha=0.6,
                        label=f"{name}sample cost detected at B={fmt(ctb.cost_detected_at)}")
    if _ok(tol):
        ax2.axhline(1 + tol, color="gray", ls=":", lw=0.9,
                    label=f"r_N = 1 + tolerance = {1 + tol:g}")
    ax2.axhline(1.0, color="gray", lw=0.5)
    if not summary.primary.reference_reached:
        ax2.text(0.5, 0.5, "no r_N: the reference did not reach the target",
                 transform=ax2.transAxes, ha="center", va="center", color="C3")
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("batch (retained responses per update)")
    ax2.set_ylabel("r_N = N* / N0*")
    ax2.set_title("Samples: sample cost vs batch", fontsize=10)
    ax2.legend(fontsize=7)
    ax2.grid(alpha=0.3)
    return _save(fig, path)


def plot_batch_trajectory(runs: Sequence[Run], summary: Summary, path: str) -> str | None:
    """Each scheduled run's batch per update against cumulative responses (the steps it
    recorded, seeds of a config in one colour), with its N* marked and its config's T/T0 in the
    legend; the fixed configs of its algorithm as horizontal lines at their batch, so the
    trajectory reads against the batches it is compared with. None without a scheduled run."""
    from jaxrl_scale.scaling.schedule_plan import segments_from_records
    configs = _configs(summary)
    sched = {g: st for g, st in configs.items() if st.batch_schedule}
    by_group: dict[str, list[Run]] = {}
    for r in runs:
        if (r.group or r.name) in sched:
            by_group.setdefault(r.group or r.name, []).append(r)
    if not by_group:
        return None
    algos = sorted({_algo_of(sched[g]) for g in by_group},
                   key=lambda a: (a != summary.primary_algo, a))
    fig = Figure(figsize=(7 * len(algos), 4.6), layout="constrained")
    axes = fig.subplots(1, len(algos), squeeze=False)[0]
    for ax, algo in zip(axes, algos):
        fixed = sorted({st.batch for st in configs.values() if _algo_of(st) == algo
                        and _ok(st.batch) and _ratio(st) == 1})
        for b in fixed:
            ax.axhline(b, color="gray", lw=0.7, ls=":")
            ax.annotate(f"B={fmt(b)}", (0, b), fontsize=7, color="gray",
                        xytext=(2, 2), textcoords="offset points")
        for i, g in enumerate(sorted(g for g in by_group if _algo_of(sched[g]) == algo)):
            st, color = sched[g], f"C{i % 10}"
            tt = fmt_ci(st.T_over_T0, st.T_over_T0_ci) if _ok(st.T_over_T0) else "not reached"
            for j, r in enumerate(sorted(by_group[g], key=lambda r: r.name)):
                segs, end = segments_from_records(r.train)
                if not segs:
                    continue
                x = [n for n, _ in segs] + [end]
                y = [b for _, b in segs] + [segs[-1][1]]
                ax.step(x, y, where="post", color=color, lw=1.3, alpha=0.8,
                        label=f"{g} ({st.batch_schedule}): T/T0 = {tt}" if j == 0 else None)
                n_star = summary.runs[r.name].N_star if r.name in summary.runs else None
                if _ok(n_star):
                    b_at = [b for n, b in segs if n <= n_star][-1]
                    ax.plot([n_star], [b_at], marker="o", color=color, ms=5)
        ax.set_yscale("log", base=2)
        lo, hi = ax.get_ylim()
        ax.set_ylim(lo / 1.3, hi * 1.3)   # the lines at the smallest and largest B stay inside
        ax.set_xlabel(N_AXIS[n_unit(summary)])
        ax.set_ylabel("batch per update B (batch_train)")
        ax.set_title(f"{algo}: batch schedules (dots: each run's N*; dotted: fixed batches)",
                     fontsize=10)
        ax.legend(fontsize=7, loc="lower right")
        ax.grid(alpha=0.3)
    return _save(fig, path)

