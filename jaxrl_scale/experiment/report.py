"""The sweep report: report.md (answer first, then tables) and figures (PNG, Agg canvas).

report.md opens with "## Answer": the statistical power of the sweep, the verdict of every
config against its algorithm's reference (faster / slower / indistinguishable / not reached,
each T/T0 with its interval), the fastest set, both critical batches and the source's
findings, each marked reproduced / not reproduced / undetermined; then, when the sweep ran
configs with asynchronous partial rollout (gen_batch_ratio k > 1), "## Partial rollout vs
synchronous": q, N* and T ratios against the synchronous twin. Every number comes from
the summary of `jaxrl_scale.scaling.analysis.analyze_sweep`, with its interval at the
summary's ``ci_level`` where it has one.

Figures (SCIENCE.md sections 1-4), intervals drawn wherever a number has one:
  learning_curves.png   seed-mean J vs responses per config, band min..max over seeds
                        (one seed: +-eval SE); solid sqrt lr, dashed fixed lr; target line
  time_to_target.png    T/T0 vs batch per lr rule, error bars = interval; fastest set marked
  critical_batches.png  generation throughput with the fitted B / (d0 + d1 B) | r_N vs batch
  grad_norm.png         actor (and critic) grad norm vs batch, log-log, with a -1/2 guide
  collection_time.png   responses per step and collection seconds per step, both / smallest
                        batch (the source's Figure 7)

Uses ``matplotlib.figure.Figure`` directly (no pyplot global state).
"""

from __future__ import annotations

import math
import os
from typing import Sequence

import numpy as np
from matplotlib.figure import Figure

from jaxrl_scale.scaling.design_report import design_lines
from jaxrl_scale.scaling.analysis import analyze_sweep, write_summary
from jaxrl_scale.scaling.io import Run, read_csv_run, read_sweep

REPORT_FILE = "report.md"
FIGURES = ("learning_curves.png", "grad_norm.png", "collection_time.png", "time_to_target.png",
           "critical_batches.png")
RULE_STYLES = {"sqrt": "-", "fixed": "--", "linear": ":", "malladi": "-."}
OTHER_STYLE = (0, (3, 1, 1, 1, 1, 1))
ALGO_MARKERS = ("o", "s", "^", "D", "v")
MIN_SNR = 6.0  # signal-to-noise (target - start) / eval SE below which verdicts may be noise
UNBOUNDED = "∞"


def _ok(x) -> bool:
    return (x is not None and isinstance(x, (int, float, np.floating)) and not isinstance(x, bool)
            and math.isfinite(x))


def fmt(x, digits: int = 3) -> str:
    if not _ok(x):
        return "-"
    if x != 0 and (abs(x) >= 1e7 or abs(x) < 1e-4):
        return f"{x:.{digits - 1}e}"
    if abs(x) >= 10 ** digits:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def _ci(ci) -> tuple:
    """(lo, hi) of an interval that may be None or hold None ends."""
    if not ci or len(ci) < 2:
        return None, None
    return ci[0], ci[1]


def fmt_ci(x, ci, digits: int = 3) -> str:
    """'x [lo, hi]'; hi None (with a finite lo) is unbounded; no interval: just x."""
    lo, hi = _ci(ci)
    base = fmt(x, digits)
    if not _ok(lo) and not _ok(hi):
        return base
    return f"{base} [{fmt(lo, digits)}, {fmt(hi, digits) if _ok(hi) else UNBOUNDED}]"


def _below(ci, v) -> bool:
    """The whole interval is below v (an unbounded upper end never is)."""
    _, hi = _ci(ci)
    return _ok(hi) and hi < v


def _above(ci, v) -> bool:
    lo, _ = _ci(ci)
    return _ok(lo) and lo > v


def _contains(ci, v) -> bool:
    lo, hi = _ci(ci)
    return _ok(lo) and lo <= v and (not _ok(hi) or hi >= v)


def _overlap(a, b) -> bool | None:
    """Do two intervals overlap? None when either has no finite lower end."""
    alo, ahi = _ci(a)
    blo, bhi = _ci(b)
    if not (_ok(alo) and _ok(blo)):
        return None
    ahi = ahi if _ok(ahi) else math.inf
    bhi = bhi if _ok(bhi) else math.inf
    return alo <= bhi and blo <= ahi


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


def _level(summary: dict) -> str:
    return f"{summary.get('ci_level', 0.9):.0%}"


def _configs(summary: dict) -> dict:
    return summary.get("configs") or {}


def _algos(summary: dict) -> list[str]:
    """Algorithms, the primary first."""
    algos = list((summary.get("algos") or {}).keys())
    p = summary.get("primary_algo")
    return sorted(algos, key=lambda a: (a != p, a))


def _algo_of(st: dict) -> str:
    return st.get("algo") or "?"


def _algo_info(summary: dict, algo: str) -> dict:
    return (summary.get("algos") or {}).get(algo) or {}


def _multi(summary: dict) -> bool:
    return len(summary.get("algos") or {}) > 1


def _sorted_configs(summary: dict, algo: str | None = None) -> list[tuple[str, dict]]:
    items = [(g, st) for g, st in _configs(summary).items()
             if algo is None or _algo_of(st) == algo]
    return sorted(items, key=lambda kv: (_algo_of(kv[1]), kv[1].get("batch") or math.inf,
                                         kv[1].get("lr_rule") or "", kv[0]))


def _is_ref(summary: dict, g: str, st: dict) -> bool:
    return bool(st.get("is_reference")) or g in (summary.get("reference_configs") or {}).values()


def _ratio(st: dict):
    return st.get("gen_batch_ratio", 1) or 1


def _desc(st: dict) -> str:
    bits = [f"B={fmt(st.get('batch'))}"]
    if _ratio(st) != 1:
        bits.append(f"partial rollout k={fmt(_ratio(st))}, B_gen={fmt(st.get('batch_gen'))}")
    if st.get("lr_rule"):
        bits.append(f"lr {st['lr_rule']}")
    if st.get("group_size") is not None:
        bits.append(f"G={st['group_size']}")
    return ", ".join(bits)


# ----------------------------------------------------------------------------------- figures


def _mean_band(rs: Sequence[Run], summary: dict):
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
    se = (summary.get("runs") or {}).get(rs[0].name, {}).get("eval_se")
    se = se if _ok(se) else 0.0
    return grid, mean, mean - se, mean + se, "±eval SE"


def plot_learning_curves(runs: Sequence[Run], summary: dict, path: str) -> str | None:
    groups: dict[str, list[Run]] = {}
    for r in runs:
        groups.setdefault(r.group or r.name, []).append(r)
    if not any(r.evals for r in runs):
        return None
    configs = _configs(summary)
    algos = sorted({(r.algo or "?") for r in runs}, key=lambda a: (a != summary.get(
        "primary_algo"), a))
    fig = Figure(figsize=(7 * len(algos), 4.8), layout="constrained")
    axes = fig.subplots(1, len(algos), squeeze=False)[0]
    colors = _batch_colors([r.batch for r in runs])
    kinds = set()
    for ax, algo in zip(axes, algos):
        items = sorted(((g, rs) for g, rs in groups.items() if (rs[0].algo or "?") == algo),
                       key=lambda kv: (kv[1][0].batch or math.inf, kv[0]))
        for g, rs in items:
            got = _mean_band(rs, summary)
            if got is None:
                continue
            grid, mean, lo, hi, kind = got
            kinds.add(kind)
            st = configs.get(g) or {}
            color = colors.get(rs[0].batch, "gray")
            ref = " (ref)" if _is_ref(summary, g, st) else ""
            verdict = _table_verdict(summary, g, st) if st and not ref else "-"
            label = (f"{g}{ref}: B={fmt(rs[0].batch)}, {len(rs)} seed(s)"
                     + (f", {verdict}" if verdict != "-" and not verdict.startswith("n/a")
                        else ""))
            partial = rs[0].gen_batch_ratio != 1
            ax.plot(grid, mean, linestyle=_style(rs[0].lr_rule), color=color, lw=1.5,
                    label=label, marker="^" if partial else None, markevery=0.1, ms=4)
            ax.fill_between(grid, lo, hi, color=color, alpha=0.18, lw=0)
        t = (summary.get("targets") or {}).get(algo, summary.get("target"))
        if _ok(t):
            ax.axhline(t, color="red", lw=0.9, ls=":", label=f"target J* = {fmt(t)}")
        ax.set_xlabel("cumulative retained responses N")
        ax.set_ylabel("validation score J")
        ax.set_title(f"{algo}: seed-mean learning curves", fontsize=10)
        ax.legend(fontsize=7, loc="lower right")
        ax.grid(alpha=0.3)
    fig.suptitle("Band: " + " / ".join(sorted(kinds)) + "; solid sqrt lr, dashed fixed lr"
                 + ("; triangles: partial rollout (k > 1)" if any(
                     r.gen_batch_ratio != 1 for r in runs) else ""), fontsize=9)
    return _save(fig, path)


def plot_grad_norm(summary: dict, path: str) -> str | None:
    entries = []
    for algo in _algos(summary) or [summary.get("primary_algo")]:
        grad = _algo_info(summary, algo).get("grad_norm") or (
            summary.get("grad_norm") if algo == summary.get("primary_algo") else None) or {}
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


def _per_batch(summary: dict, key: str) -> tuple[list[float], list[float]]:
    """Config means of ``key`` per batch, synchronous rollout only (a partial-rollout update
    collects B_train responses from k * B_train in flight: another cost curve)."""
    by_b: dict[float, list[float]] = {}
    for st in _configs(summary).values():
        if _ok(st.get("batch")) and _ok(st.get(key)) and st[key] > 0 and _ratio(st) == 1:
            by_b.setdefault(st["batch"], []).append(st[key])
    bs = sorted(by_b)
    return bs, [float(np.mean(by_b[b])) for b in bs]


def plot_collection_time(summary: dict, path: str) -> str | None:
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
    metric = (summary.get("critical_generation_batch") or {}).get("metric") or "?"
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


def plot_time_to_target(summary: dict, path: str) -> str:
    """T/T0 vs batch with interval bars; when no config has a T/T0 (the reference missed the
    target) the absolute time to target T of the configs that reached it instead."""
    fig = Figure(figsize=(7, 4.6), layout="constrained")
    ax = fig.add_subplot()
    configs = _configs(summary)
    multi = _multi(summary)
    algos = _algos(summary) or sorted({_algo_of(st) for st in configs.values()})
    ratio = any(_ok(st.get("T_over_T0")) for st in configs.values())
    key, ci_key = ("T_over_T0", "T_over_T0_ci") if ratio else ("T", None)
    vals = [st[key] for st in configs.values() if _ok(st.get(key))]
    his = [_ci(st.get(ci_key))[1] for st in configs.values()] if ci_key else []
    top = max(vals + [h for h in his if _ok(h)] + [1.0 if ratio else 0.0]) * 1.15 or 1.0
    best = set()
    for algo in algos:
        best |= set(_algo_info(summary, algo).get("best_set") or [])
    best |= set(summary.get("best_set") or [])
    # one series per (algo, lr rule, group size, rollout ratio): a line never joins different
    # group sizes or rollouts
    series: dict[tuple, list] = {}
    for g, st in configs.items():
        if _ok(st.get("batch")):
            k = (algos.index(_algo_of(st)) if _algo_of(st) in algos else len(algos),
                 st.get("lr_rule") or "?", str(st.get("group_size")), _ratio(st))
            series.setdefault(k, []).append((g, st))
    n_gs = len({k[2] for k in series if k[2] != "None"})
    for si, k in enumerate(sorted(series)):
        ai, rule, gs, ratio_k = k
        algo = algos[ai] if ai < len(algos) else "?"
        color, marker = f"C{si % 10}", ALGO_MARKERS[ai % len(ALGO_MARKERS)]
        pts = [(st["batch"] * 1.03 ** si, g, st) for g, st in
               sorted(series[k], key=lambda kv: (kv[1]["batch"], kv[0]))]
        ok = [(x, g, st) for x, g, st in pts if _ok(st.get(key))]
        name = ((f"{algo} " if multi else "") + f"lr {rule}"
                + (f" G={gs}" if n_gs > 1 and gs != "None" else "")
                + (f" k={fmt(ratio_k)}" if ratio_k != 1 else ""))
        if ok:
            ys = [st[key] for _, _, st in ok]
            err = _yerr(ys, [st.get(ci_key) for _, _, st in ok], top) if ci_key else None
            ax.errorbar([x for x, _, _ in ok], ys, yerr=err, ls=_style(rule), marker=marker,
                        color=color, capsize=3,
                        label=name + (f" ({_level(summary)} interval)" if ci_key else ""))
            for x, g, st in ok:
                if g in best:
                    ax.scatter([x], [st[key]], marker="*", s=260, color="gold",
                               edgecolor="k", zorder=5)
        miss = [x for x, _, st in pts if not st.get("reached")]
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
    refs = summary.get("reference_configs") or {}
    ax.set_title(f"Time to target J*={fmt(summary.get('target'))} vs reference "
                 + ", ".join(refs.values() or [str(summary.get("reference"))]), fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_critical_batches(summary: dict, path: str) -> str:
    fig = Figure(figsize=(12, 4.6), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    cgb = summary.get("critical_generation_batch") or {}
    pts = cgb.get("points") or []
    if pts:
        b = np.array([p["batch"] for p in pts], float)
        tp = np.array([p["throughput"] for p in pts], float)
        rng = [p.get("throughput_range") or [t, t] for p, t in zip(pts, tp)]
        err = np.array([[max(t - lo, 0.0), max(hi - t, 0.0)] for t, (lo, hi) in zip(tp, rng)]).T
        ax1.errorbar(b, tp, yerr=err, fmt="o", color="C0", capsize=3,
                     label="measured (median, bars min..max over runs)")
        d0, d1 = cgb.get("d0"), cgb.get("d1")
        if _ok(d0) and _ok(d1):
            hi_b = max(b.max(), (cgb.get("batch") or 0) * 1.5)
            bb = np.geomspace(b.min(), hi_b, 100)
            with np.errstate(divide="ignore", invalid="ignore"):
                fit = bb / (d0 + d1 * bb)
            ax1.plot(bb, np.where(fit > 0, fit, np.nan), color="C0", ls="--", lw=1,
                     label=f"fit B/(d0+d1 B): d0={fmt_ci(d0, cgb.get('d0_ci'))} s, "
                           f"d1={fmt_ci(d1, cgb.get('d1_ci'))} s")
    if _ok(cgb.get("batch")):
        lo, hi = _ci(cgb.get("batch_ci"))
        ax1.axvline(cgb["batch"], color="C3", ls="--",
                    label=f"critical generation batch {fmt_ci(cgb['batch'], cgb.get('batch_ci'))}"
                          + ("" if cgb.get("within_grid") else " (outside the grid)"))
        if _ok(lo):
            # A lower end of 0 (no fixed cost) must not stretch the log axis to 2^-30.
            floor = min([p["batch"] for p in pts] + [cgb["batch"]]) / 2
            ax1.axvspan(max(lo, floor), hi if _ok(hi) else ax1.get_xlim()[1], color="C3",
                        alpha=0.08)
    else:
        ax1.plot([], [], " ", label="no critical generation batch estimated")
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel(cgb.get("batch_kind") or "batch")
    ax1.set_ylabel("responses / collection second" if cgb.get("metric") == "gen_s"
                   else "responses / step second (no gen_s logged)")
    ax1.set_title("System: generation throughput", fontsize=10)
    ax1.legend(fontsize=7)
    ax1.grid(alpha=0.3)

    tol = summary.get("tolerance")
    algos = _algos(summary) or [summary.get("primary_algo")]
    ctbs = [_algo_info(summary, algo).get("critical_training_batch") or (
        summary.get("critical_training_batch") if ai == 0 else None) or {}
        for ai, algo in enumerate(algos)]
    ymax = 1.0 + (tol or 0.0)
    for ctb in ctbs:
        for p in ctb.get("points") or []:
            ymax = max([ymax] + [v for v in (p.get("r_N"), _ci(p.get("r_N_ci"))[1]) if _ok(v)])
    for ai, (algo, ctb) in enumerate(zip(algos, ctbs)):
        tol = ctb.get("tolerance", tol)
        pts2 = ctb.get("points") or []
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
                         capsize=3, label=f"{name}r_N (lr {ctb.get('lr_rule')}, "
                                          f"{_level(summary)} interval)")
        miss = [x for x, p in zip(xs, pts2) if not p.get("reached")]
        if miss:
            ax2.scatter(miss, [ymax * 1.1] * len(miss), marker="x", color=color, s=60,
                        label=f"{name}not reached")
        if _ok(ctb.get("batch")):
            ax2.axvline(ctb["batch"], color=color, ls="--", lw=1, alpha=0.6,
                        label=f"{name}critical training batch {fmt(ctb['batch'])}")
        if _ok(ctb.get("cost_detected_at")):
            ax2.axvline(ctb["cost_detected_at"], color=color, ls=":", lw=1, alpha=0.6,
                        label=f"{name}sample cost detected at B={fmt(ctb['cost_detected_at'])}")
    if _ok(tol):
        ax2.axhline(1 + tol, color="gray", ls=":", lw=0.9,
                    label=f"r_N = 1 + tolerance = {1 + tol:g}")
    ax2.axhline(1.0, color="gray", lw=0.5)
    if not summary.get("reference_reached"):
        ax2.text(0.5, 0.5, "no r_N: the reference did not reach the target",
                 transform=ax2.transAxes, ha="center", va="center", color="C3")
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("batch (retained responses per update)")
    ax2.set_ylabel("r_N = N* / N0*")
    ax2.set_title("Samples: sample cost vs batch", fontsize=10)
    ax2.legend(fontsize=7)
    ax2.grid(alpha=0.3)
    return _save(fig, path)


# ----------------------------------------------------------------------------------- answer


def _power_line(summary: dict, algo: str, prefix: str) -> str:
    a = _algo_info(summary, algo)
    se = a.get("eval_se", summary.get("eval_se"))
    src = a.get("eval_se_source", summary.get("eval_se_source"))
    t = a.get("target", summary.get("target"))
    rule = a.get("target_rule") if summary.get("algos") else summary.get("target_rule")
    start = a.get("start_score", summary.get("start_score"))
    snr = a.get("signal_to_noise", summary.get("signal_to_noise"))
    tgt = f"J* = {fmt(t)}"
    if rule:
        tgt += (f" (auto: {rule.get('rule')}; start {fmt(rule.get('start'))}, reach "
                f"{fmt(rule.get('reach'))})")
    ref = a.get("reference_config", summary.get("reference"))
    jit = a.get("curve_jitter_se", summary.get("curve_jitter_se"))
    s = f"{prefix}Power (reference {ref}): eval SE = {fmt(se)} ({src or 'unknown source'}); " \
        + (f"the curves jitter by {fmt(jit)} between evals (policy noise included; the "
           f"bootstrap never uses less); " if _ok(jit) else "") + \
        f"target {tgt}; reference start score {fmt(start)}; "
    gap = t - start if _ok(t) and _ok(start) else None
    if _ok(gap) and gap > 0 and _ok(se) and se > 0:
        ratio = se / gap
        s += (f"SE / (J* - start) = {fmt(ratio)} vs 1/{MIN_SNR:g} = {fmt(1 / MIN_SNR)} "
              f"(signal-to-noise {fmt(snr)}): ")
        s += "OK." if _ok(snr) and snr >= MIN_SNR else "UNDERPOWERED: verdicts below may be noise."
    elif _ok(gap) and gap <= 0:
        s += (f"the target is not above the start (J* - start = {fmt(gap)}): "
              "UNDERPOWERED: verdicts below may be noise.")
    else:
        s += "signal-to-noise unknown."
    return s


def _ref_miss_line(summary: dict, algo: str, prefix: str) -> str:
    a = _algo_info(summary, algo)
    ref = a.get("reference_config", summary.get("reference"))
    t = a.get("target", summary.get("target"))
    best = a.get("reference_best_smoothed")
    se = a.get("eval_se", summary.get("eval_se"))
    s = f"{prefix}The reference {ref} did NOT reach the target J* = {fmt(t)}"
    if _ok(best) and _ok(t):
        s += f": its best smoothed score is {fmt(best)}, {fmt(t - best)} below the target"
        if _ok(se) and se > 0:
            s += f" ({fmt((t - best) / se, 2)} eval SEs of {fmt(se)})"
    return s + (". No time-to-target verdict is possible (no r_N, r_q, T/T0); the learning "
                "curves, throughput and grad norms below still stand.")


def _verdict_lines(summary: dict, algo: str, prefix: str) -> list[str]:
    a = _algo_info(summary, algo)
    ref = a.get("reference_config", summary.get("reference"))
    items = [(g, st) for g, st in _sorted_configs(summary, algo) if not _is_ref(summary, g, st)]
    out = []
    lvl = _level(summary)
    by = {v: [(g, st) for g, st in items if st.get("verdict") == v]
          for v in ("faster", "slower", "indistinguishable", "not reached")}
    def tt(g, st):
        return f"{g} ({_desc(st)}): T/T0 = {fmt_ci(st.get('T_over_T0'), st.get('T_over_T0_ci'))}"

    out.append(f"{prefix}Faster than the reference {ref} (T/T0 below 1, Holm-adjusted over all configs at {lvl}): "
               + ("; ".join(tt(g, st) for g, st in sorted(
                   by["faster"], key=lambda kv: kv[1]["T_over_T0"])) or "none") + ".")
    out.append(f"{prefix}Slower (T/T0 above 1, family-wise): "
               + ("; ".join(tt(g, st) for g, st in sorted(
                   by["slower"], key=lambda kv: kv[1]["T_over_T0"])) or "none") + ".")
    out.append(f"{prefix}Indistinguishable from the reference (no family-wise difference): "
               + ("; ".join(tt(g, st) for g, st in by["indistinguishable"]) or "none") + ".")
    if by["not reached"]:
        out.append(f"{prefix}Not reached: " + "; ".join(
            f"{g} ({_desc(st)}): {st.get('seeds_reached', 0)}/{st.get('seeds', '?')} seeds "
            f"reached J*" for g, st in by["not reached"]) + ".")
    return out


def _best_line(summary: dict, algo: str, prefix: str) -> str:
    a = _algo_info(summary, algo)
    best = a.get("best_set") if summary.get("algos") else summary.get("best_set")
    best = list(best or [])
    configs = _configs(summary)
    ref_ok = a.get("reference_reached", summary.get("reference_reached"))

    def one(g):
        st = configs.get(g) or {}
        s = f"{g} ({_desc(st)}, T = {fmt(st.get('T'))} s"
        if ref_ok and _ok(st.get("T_over_T0")):
            s += f", T/T0 = {fmt_ci(st.get('T_over_T0'), st.get('T_over_T0_ci'))}"
        return s + ")"

    if not best:
        return f"{prefix}No config reached J*: there is no fastest set."
    if not ref_ok:
        prefix += "Among the configs that reached J* on their own (no T/T0): "
    n_reached = sum(bool(st.get("reached")) for _, st in _sorted_configs(summary, algo))
    if len(best) == 1 and n_reached <= 1:
        return f"{prefix}Fastest: {one(best[0])}, the only config that reached J*."
    if len(best) == 1:
        return f"{prefix}Fastest: {one(best[0])}, distinguishable from all others."
    return (f"{prefix}Fastest set ({len(best)} configs not distinguishable from the fastest, "
            f"{best[0]}; no single best): " + "; ".join(one(g) for g in best) + ".")


def _ctb_line(summary: dict, algo: str, prefix: str) -> str:
    a = _algo_info(summary, algo)
    ctb = a.get("critical_training_batch") or (
        summary.get("critical_training_batch") if algo == summary.get("primary_algo") else {})
    ctb = ctb or {}
    tol = ctb.get("tolerance", summary.get("tolerance"))
    lim = 1 + tol if _ok(tol) else None
    pts = {p["batch"]: p for p in ctb.get("points") or []}
    rule = ctb.get("lr_rule") or "-"
    ref_ok = a.get("reference_reached", summary.get("reference_reached"))
    if not ref_ok:
        return (f"{prefix}Critical training batch: undetermined (the reference did not reach "
                "J*, so no r_N).")
    head = f"{prefix}Critical training batch (lr rule {rule}, largest B whose r_N " \
           f"{_level(summary)} " \
           f"upper bound is <= {fmt(lim)}): "
    b = ctb.get("batch")
    if _ok(b):
        p = pts.get(b) or {}
        s = head + f"B = {fmt(b)} (r_N = {fmt_ci(p.get('r_N'), p.get('r_N_ci'))})"
    else:
        s = head + "none of the measured batches qualifies"
    c = ctb.get("cost_detected_at")
    if _ok(c):
        p = pts.get(c) or {}
        s += (f"; a sample cost is detected at B = {fmt(c)} ("
              + (f"r_N = {fmt_ci(p.get('r_N'), p.get('r_N_ci'))}" if p.get("reached")
                 else "not reached within the budget") + ")")
    else:
        s += "; no sample cost detected (no lower bound above " + fmt(lim) + ")"
    return s + "."


def _cgb_line(summary: dict) -> str:
    cgb = summary.get("critical_generation_batch") or {}
    pts = cgb.get("points") or []
    kind = cgb.get("batch_kind") or "batch"
    what = "collection (gen_s)" if cgb.get("metric") == "gen_s" else \
        "step time (no gen_s logged)"
    if not (_ok(cgb.get("d0")) and _ok(cgb.get("d1"))):
        return (f"Critical generation batch: not estimated ({what} measured at "
                f"{len(pts)} distinct batch(es); the fit t_gen = d0 + d1*B needs 2).")
    fit = (f"t_gen = d0 + d1*B from {what}: d0 = {fmt_ci(cgb['d0'], cgb.get('d0_ci'))} s, "
           f"d1 = {fmt_ci(cgb['d1'], cgb.get('d1_ci'))} s per response")
    gain = cgb.get("min_gain")
    rule = (f"a doubling adds < {gain:.0%} throughput" if _ok(gain) else "throughput plateaus")
    if not _ok(cgb.get("batch")):
        return (f"Critical generation batch: none (d1 <= 0, the per-response cost is not "
                f"positive); {fit}.")
    lo_b = min((p["batch"] for p in pts), default=None)
    grid = max((p["batch"] for p in pts), default=None)
    if cgb.get("within_grid"):
        where = "within the measured grid"
    elif _ok(lo_b) and cgb["batch"] < lo_b:
        where = (f"below the measured grid (smallest measured {kind} = {fmt(lo_b)}: "
                 "generation throughput is already near its plateau there)")
    else:
        where = f"beyond the measured grid (largest measured {kind} = {fmt(grid)})"
    return (f"Critical generation batch ({kind} beyond which {rule}): "
            f"{fmt_ci(cgb['batch'], cgb.get('batch_ci'))}, {where}; {fit}{_mixed_note(cgb)}.")


def _mixed_note(cgb: dict) -> str:
    if cgb.get("sync_batches", 2) >= 2:
        return ""
    return ("; CAUTION: B_gen varies only through gen_batch_ratio, so the fit sets partial-"
            "rollout (slot engine) rounds against synchronous ones rather than sampling one "
            "decode curve")


# --- source findings: (status, text). Status: reproduced / not reproduced / undetermined.

def _finding_sqrt(summary: dict, algo: str) -> tuple[str, str]:
    a = _algo_info(summary, algo)
    tol = summary.get("tolerance")
    lim = 1 + tol
    ref = _configs(summary).get(a.get("reference_config")) or {}
    if not a.get("reference_reached", summary.get("reference_reached")):
        return "undetermined", "the reference did not reach J*, so no r_N"
    rb = ref.get("batch") or 0
    sq = [(g, st) for g, st in _sorted_configs(summary, algo)
          if st.get("lr_rule") == "sqrt" and not _is_ref(summary, g, st)
          and (st.get("batch") or 0) > rb and _ratio(st) == _ratio(ref)]
    if not sq:
        return "undetermined", "no sqrt-lr config at a batch above the reference's"
    aligned, cost, open_ = [], [], []
    for g, st in sq:
        ci = st.get("r_N_ci")
        d = f"B={fmt(st.get('batch'))} r_N {fmt_ci(st.get('r_N'), ci)}"
        if st.get("reached") and _ok(_ci(ci)[1]) and _ci(ci)[1] <= lim:
            aligned.append((st["batch"], d + (" (reaches 1)" if _contains(ci, 1.0) else "")))
        elif st.get("reached") and _above(ci, lim):
            cost.append((st["batch"], d))
        elif not st.get("reached"):
            cost.append((st["batch"], f"B={fmt(st.get('batch'))} not reached"))
        else:
            open_.append((st["batch"], d + (" (reaches 1)" if _contains(ci, 1.0) else "")))
    parts = []
    if aligned:
        parts.append(f"r_N interval under {fmt(lim)}: " + ", ".join(d for _, d in aligned))
    if open_:
        parts.append(f"interval straddles {fmt(lim)}: " + ", ".join(d for _, d in open_))
    if cost:
        parts.append("sample cost: " + ", ".join(d for _, d in cost))
    detail = "; ".join(parts)
    if aligned:
        top = max(b for b, _ in aligned)
        return "reproduced", (f"sqrt lr keeps r_N within 1 + {tol:g} from B={fmt(rb)} up to "
                              f"B={fmt(top)} ({detail})")
    if open_:
        return "undetermined", f"the intervals do not decide ({detail})"
    return "not reproduced", f"every larger sqrt-lr batch costs samples ({detail})"


def _finding_fixed(summary: dict, algo: str) -> tuple[str, str]:
    if not _algo_info(summary, algo).get("reference_reached", summary.get("reference_reached")):
        return "undetermined", "the reference did not reach J*, so no r_N"
    ref = _configs(summary).get(_algo_info(summary, algo).get("reference_config")) or {}
    items = _sorted_configs(summary, algo)
    pairs = []
    for g, st in items:
        if st.get("lr_rule") != "fixed" or st.get("batch") == ref.get("batch"):
            continue
        for h, sq in items:
            if (sq.get("lr_rule") == "sqrt" and sq.get("batch") == st.get("batch")
                    and sq.get("group_size") == st.get("group_size")
                    and _ratio(sq) == _ratio(st)):
                pairs.append((g, st, h, sq))
    if not pairs:
        return "undetermined", ("no batch (other than the reference's, where both rules give "
                                "the same lr) has both a fixed-lr and a sqrt-lr config")
    lag, no, und, det = 0, 0, 0, []
    for g, st, h, sq in pairs:
        f_ci, s_ci = st.get("r_N_ci"), sq.get("r_N_ci")
        f_txt = fmt_ci(st.get("r_N"), f_ci) if st.get("reached") else "not reached"
        s_txt = fmt_ci(sq.get("r_N"), s_ci) if sq.get("reached") else "not reached"
        d = f"B={fmt(st['batch'])}: fixed r_N {f_txt} vs sqrt {s_txt}"
        if not st.get("reached") and sq.get("reached"):
            lag += 1
            det.append(d + " (lags)")
        elif st.get("reached") and sq.get("reached"):
            flo, fhi = _ci(f_ci)
            slo, shi = _ci(s_ci)
            if _ok(flo) and _ok(shi) and flo > shi:
                lag += 1
                det.append(d + " (lags)")
            elif _ok(fhi) and _ok(slo) and fhi < slo:
                no += 1
                det.append(d + " (fixed needs fewer samples)")
            else:
                und += 1
                det.append(d + " (intervals overlap)")
        elif st.get("reached") and not sq.get("reached"):
            no += 1
            det.append(d + " (fixed reaches, sqrt does not)")
        else:
            und += 1
            det.append(d + " (neither reaches)")
    return _outcome(lag, no, det)


def _outcome(yes: int, no: int, details: list[str], all_decided: bool = True
             ) -> tuple[str, str]:
    """A finding's mark from how many comparisons support (yes) or contradict (no) it."""
    text = "; ".join(details)
    if yes and not no and all_decided:
        return "reproduced", text
    if no and not yes:
        return "not reproduced", text
    return "undetermined", text + (" (mixed)" if yes and no else "")


def _finding_grad(summary: dict, algo: str) -> tuple[str, str]:
    grad = _algo_info(summary, algo).get("grad_norm") or (
        summary.get("grad_norm") if algo == summary.get("primary_algo") else None) or {}
    g = grad.get("actor_grad_norm")
    if not g:
        return "undetermined", ("actor_grad_norm is not logged at 2+ batches of the "
                                "reference's lr rule")
    ci = g.get("slope_ci")
    span = f"B={fmt(g['batches'][0])}..{fmt(g['batches'][-1])}, lr rule {g.get('lr_rule')}"
    flat = g.get("flattens_after")
    fl = (f"flattens after B={fmt(flat)} (local slope > {g.get('flat_threshold'):g})" if flat
          else f"no flattening within the grid (local slope stays <= {g.get('flat_threshold'):g})")
    s = f"log-log slope {fmt_ci(g.get('slope'), ci, 2)} over {span}; {fl}"
    if _contains(ci, -0.5):
        return "reproduced", s + "; the interval contains -1/2"
    if not _ok(_ci(ci)[0]):
        return "undetermined", s + "; no interval"
    if flat and _below(ci, 0.0):
        return "undetermined", (s + "; the interval excludes -1/2, but the fit mixes the falling "
                                "and the flat regime")
    return "not reproduced", s + "; the interval excludes -1/2"


def _finding_collection(summary: dict) -> tuple[str, str]:
    cgb = summary.get("critical_generation_batch") or {}
    d0, ci = cgb.get("d0"), cgb.get("d0_ci")
    if not _ok(d0):
        return "undetermined", "no fit t_gen = d0 + d1*B (collection times at < 2 batches)"
    if cgb.get("sync_batches", 2) < 2:
        return "undetermined", (f"synchronous collection times at < 2 batches (d0 = "
                                f"{fmt_ci(d0, ci)} s comes from B_gen varied only through "
                                "gen_batch_ratio, not from synchronous decode rounds)")
    bs, coll = _per_batch(summary, "collection_s_per_step")
    growth = (f"; from B={fmt(bs[0])} to B={fmt(bs[-1])} ({bs[-1] / bs[0]:.3g}x responses) "
              f"collection time per step grows {coll[-1] / coll[0]:.3g}x" if len(bs) >= 2 else "")
    s = f"d0 = {fmt_ci(d0, ci)} s per step{growth}"
    if _above(ci, 0.0):
        return "reproduced", s + (" (d0 interval above 0: per-step collection time grows "
                                  "slower than B)")
    if _below(ci, 0.0) or (_ok(_ci(ci)[1]) and _ci(ci)[1] <= 0):
        return "not reproduced", s + " (no fixed per-step cost)"
    return "undetermined", s + " (the d0 interval reaches 0)"


def _finding_pg(summary: dict, algo: str) -> tuple[str, str]:
    by: dict[tuple, list] = {}
    for g, st in _sorted_configs(summary, algo):
        if st.get("group_size") is not None and _ok(st.get("batch")):
            by.setdefault((st.get("lr_rule"), st["batch"], _ratio(st)), []).append((g, st))
    pairs = []
    for (rule, b, _), xs in sorted(by.items(), key=lambda kv: (str(kv[0][0]), kv[0][1:])):
        for i in range(len(xs)):
            for j in range(i + 1, len(xs)):
                if xs[i][1].get("group_size") != xs[j][1].get("group_size"):
                    pairs.append((xs[i], xs[j]))
    if not pairs:
        return "undetermined", ("no two configs share algo, lr rule and P*G with different "
                                "group sizes")
    if not _algo_info(summary, algo).get("reference_reached", summary.get("reference_reached")):
        return "undetermined", "the reference did not reach J*, so no r_N"
    alike, differ, und, det = 0, 0, 0, []
    for (g, a), (h, b) in pairs:
        d = (f"B={fmt(a['batch'])} lr {a.get('lr_rule')}: G={a.get('group_size')} r_N "
             f"{fmt_ci(a.get('r_N'), a.get('r_N_ci'))} vs G={b.get('group_size')} r_N "
             f"{fmt_ci(b.get('r_N'), b.get('r_N_ci'))}")
        if not (a.get("reached") and b.get("reached")):
            und += 1
            det.append(d + " (not both reached)")
            continue
        ov = _overlap(a.get("r_N_ci"), b.get("r_N_ci"))
        if ov is None:
            und += 1
            det.append(d + " (no interval)")
        elif ov:
            alike += 1
            det.append(d + " (overlap: alike)")
        else:
            differ += 1
            det.append(d + " (disjoint: differ)")
    return _outcome(alike, differ, det, all_decided=not und)


def _finding_faster(summary: dict, algo: str) -> tuple[str, str]:
    a = _algo_info(summary, algo)
    if not a.get("reference_reached", summary.get("reference_reached")):
        return "undetermined", "the reference did not reach J*, so no T/T0"
    items = [(g, st) for g, st in _sorted_configs(summary, algo) if not _is_ref(summary, g, st)]
    fast = [(g, st) for g, st in items if st.get("verdict") == "faster"]
    cap = _cap_text(summary, algo)
    if fast:
        return "reproduced", "faster: " + ", ".join(
            f"{g} T/T0 {fmt_ci(st.get('T_over_T0'), st.get('T_over_T0_ci'))}"
            for g, st in fast) + cap
    maybe = [(g, st) for g, st in items if st.get("verdict") == "indistinguishable"
             and not _above(st.get("T_over_T0_ci"), 1.0) and _ok(_ci(st.get("T_over_T0_ci"))[0])
             and _ci(st.get("T_over_T0_ci"))[0] < 1]
    if maybe:
        return "undetermined", ("no config is faster, but the interval of T/T0 reaches below "
                                "1 for " + ", ".join(
                                    f"{g} {fmt_ci(st.get('T_over_T0'), st.get('T_over_T0_ci'))}"
                                    for g, st in maybe) + cap)
    if not items:
        return "undetermined", "no config besides the reference" + cap
    return "not reproduced", "no config has T/T0 < 1 (all slower, not reached or at 1)" + cap


def _cap_text(summary: dict, algo: str) -> str:
    cgb = _algo_info(summary, algo).get("critical_generation_batch") or (
        summary.get("critical_generation_batch") if algo == summary.get("primary_algo") else {})
    tf = (cgb or {}).get("train_fit") or {}
    cap = tf.get("r_q_cap")
    if not _ok(cap):
        return ("; no r_q cap measured (train_s and gen_s per step are both needed for the "
                "step-time fit)")
    share = tf.get("update_share_at_reference")
    s = (f"; the step-time fits cap r_q at {fmt_ci(cap, tf.get('r_q_cap_ci'))} over the "
         f"reference batch, so a larger batch is faster only where r_N is below that cap")
    if _ok(share):
        s += (f" (the update takes {share:.0%} of a step at the reference batch"
              + (": on this hardware the update, not generation, dominates each step"
                 if share > 0.5 else "") + ")")
    return s


FINDINGS = (
    ("sqrt-lr scaling keeps r_N near 1 over a range of batches", _finding_sqrt, True),
    ("fixed lr lags sqrt lr at the same batch", _finding_fixed, True),
    ("actor grad norm falls as B^-1/2, then flattens", _finding_grad, True),
    ("collection time per step grows sublinearly in B (d0 > 0)", _finding_collection, False),
    ("equal P*G with different group sizes behave alike", _finding_pg, True),
    ("a larger batch reaches the target sooner (T/T0 < 1 somewhere)", _finding_faster, True),
)


def source_findings(summary: dict) -> list[tuple[int, str, str, str]]:
    """[(number, claim, status, reason with numbers)] for the source's findings."""
    algos = _algos(summary) or [summary.get("primary_algo") or "?"]
    multi = len(algos) > 1
    out = []
    for k, (claim, fn, per_algo) in enumerate(FINDINGS, 1):
        if not per_algo:
            status, why = fn(summary)
            out.append((k, claim, status, why))
            continue
        for algo in algos:
            status, why = fn(summary, algo)
            out.append((k, claim + (f" [{algo}]" if multi else ""), status, why))
    return out


def _answer(summary: dict) -> tuple[list[str], list[str]]:
    main = design_lines(summary)   # lr bracket, power, drift first (issue 27)
    algos = _algos(summary) or [summary.get("primary_algo") or "?"]
    multi = len(algos) > 1
    for algo in algos:
        a = _algo_info(summary, algo)
        prefix = f"[{algo}] " if multi else ""
        if not a.get("reference_reached", summary.get("reference_reached")):
            main.append(_ref_miss_line(summary, algo, prefix))
            main.append(_power_line(summary, algo, prefix))
            main.append(f"{prefix}Seeds that reached J* per config: " + "; ".join(
                f"{g} {st.get('seeds_reached', 0)}/{st.get('seeds', '?')}"
                for g, st in _sorted_configs(summary, algo)) + ".")
        else:
            main.append(_power_line(summary, algo, prefix))
            main += _verdict_lines(summary, algo, prefix)
        main.append(_best_line(summary, algo, prefix))
        main.append(_ctb_line(summary, algo, prefix))
    main.append(_cgb_line(summary))
    finds = [f"Source finding ({k}) {claim}: {status.upper()}: {why}."
             for k, claim, status, why in source_findings(summary)]
    return main, finds


PARTIAL_VERDICTS = {"faster": "FASTER (the T ratio interval is below 1)",
                    "slower": "SLOWER (the T ratio interval is above 1)",
                    "indistinguishable": "indistinguishable (the T ratio interval contains 1)"}
ROLLOUT_TEXT = (("staleness_mean", "mean staleness {} versions"), ("staleness_max", "max {}"),
                ("off_policy_token_frac", "off-policy tokens {}"),
                ("slot_occupancy", "slot occupancy {}"))


def _partial_line(x: dict) -> str:
    s = (f"{x['config']} vs {x['sync_config']} (B_train={fmt(x.get('batch'))}, "
         f"B_gen={fmt(x.get('batch_gen'))}, k={fmt(x.get('gen_batch_ratio'))}): q ratio "
         f"{fmt_ci(x.get('q_ratio'), x.get('q_ratio_ci'))}")
    if x.get("reached"):
        s += (f", r_N {fmt_ci(x.get('r_N'), x.get('r_N_ci'))}, T ratio "
              f"{fmt_ci(x.get('T_ratio'), x.get('T_ratio_ci'))}: "
              f"{PARTIAL_VERDICTS.get(x.get('verdict'), x.get('verdict') or '-')}")
    else:
        s += "; not reached (one of the two missed J* in some seed): no r_N or T ratio"
    inv = x.get("curves") or {}
    if inv.get("within") is not None:
        s += (f"; learning curves {'within' if inv['within'] else 'OUTSIDE'} the eval-noise "
              f"band of each other (mean |dJ| {fmt(inv.get('mean_abs_dev'))} vs "
              f"{fmt(inv.get('band'))})")
    roll = [t.format(fmt(x[k])) for k, t in ROLLOUT_TEXT if _ok(x.get(k))]
    return s + ("; " + ", ".join(roll) if roll else "") + "."


def partial_rollout_lines(summary: dict) -> list[str]:
    """One line per config run with partial rollout (k > 1) against its synchronous twin:
    q ratio, r_N, T ratio with intervals and the verdict; empty without such configs."""
    return [_partial_line(x) for x in summary.get("partial_rollout") or []]


def facts(summary: dict) -> list[str]:
    """The Answer lines of report.md: power, verdicts, fastest set, critical batches, the
    source findings and partial rollout vs synchronous, each number with its interval."""
    main, finds = _answer(summary)
    return main + finds + partial_rollout_lines(summary)


# ----------------------------------------------------------------------------------- tables


def _table_verdict(summary: dict, g: str, st: dict) -> str:
    if _is_ref(summary, g, st):
        return "reference"
    if not _algo_info(summary, _algo_of(st)).get("reference_reached",
                                                 summary.get("reference_reached")):
        return "n/a (reference missed J*)"
    return st.get("verdict") or "-"


def format_table(summary: dict, per_run: bool = False) -> str:
    """Markdown table per config (seeds reached/total, B, lr rule, N*, q, r_N, r_q, T/T0 with
    intervals, verdict, clip fraction, actor B_simple), or per run."""
    multi = _multi(summary)
    a_col = "algo | " if multi else ""
    lines = []
    if per_run:
        lines.append(f"| run | {a_col}seed | B | lr rule | reached | N* | q (resp/s) | r_N | r_q "
                     "| T/T0 | max score | clip fraction |")
        lines.append("|" + "---|" * (12 + multi))
        items = sorted((summary.get("runs") or {}).items(),
                       key=lambda kv: (kv[1].get("algo") or "", kv[1].get("batch") or math.inf,
                                       kv[0]))
        for name, x in items:
            a = f"{x.get('algo') or '-'} | " if multi else ""
            lines.append(
                f"| {name}{' (ref)' if x.get('is_reference') else ''} | {a}"
                f"{x.get('seed') if x.get('seed') is not None else '-'} | {fmt(x.get('batch'))} | "
                f"{x.get('lr_rule') or '-'} | {'yes' if x.get('reached') else 'no'} | "
                f"{fmt_ci(x.get('N_star'), x.get('N_star_ci'))} | "
                f"{fmt_ci(x.get('q'), x.get('q_ci'))} | {fmt(x.get('r_N'))} | "
                f"{fmt(x.get('r_q'))} | {fmt(x.get('T_over_T0'))} | {fmt(x.get('max_score'))} | "
                f"{fmt(x.get('clip_fraction'))} |")
        return "\n".join(lines)
    lines.append(f"| config | {a_col}seeds reached | B | lr rule | N* | q (resp/s) | r_N | r_q | "
                 "T/T0 | verdict | clip fraction | B_simple (actor) |")
    lines.append("|" + "---|" * (12 + multi))
    for g, st in _sorted_configs(summary):
        a = f"{_algo_of(st)} | " if multi else ""
        bs = st.get("actor_b_simple")
        rng = st.get("actor_b_simple_range")
        bs_txt = fmt(bs)
        if _ok(bs) and rng and st.get("seeds", 1) > 1 and rng[0] != rng[1]:
            bs_txt += f" ({fmt(rng[0])}..{fmt(rng[1])})"
        ref = " (ref)" if _is_ref(summary, g, st) else ""
        n_txt = (fmt_ci(st.get("N_star"), st.get("N_star_ci")) if st.get("reached")
                 else "not reached")
        lines.append(
            f"| {g}{ref} | {a}{st.get('seeds_reached', 0)}/{st.get('seeds', '?')} | "
            f"{fmt(st.get('batch'))} | {st.get('lr_rule') or '-'} | "
            f"{n_txt} | "
            f"{fmt_ci(st.get('q'), st.get('q_ci'))} | {fmt_ci(st.get('r_N'), st.get('r_N_ci'))} | "
            f"{fmt_ci(st.get('r_q'), st.get('r_q_ci'))} | "
            f"{fmt_ci(st.get('T_over_T0'), st.get('T_over_T0_ci'))} | "
            f"{_table_verdict(summary, g, st)} | {fmt(st.get('clip_fraction'))} | "
            f"{bs_txt} |")
    return "\n".join(lines)


def _details(summary: dict) -> list[str]:
    """Further measured numbers (not part of the answer)."""
    out = []
    configs = _configs(summary)
    for algo in _algos(summary):
        ref = configs.get(_algo_info(summary, algo).get("reference_config")) or {}
        if ref.get("reached"):
            out.append(f"{algo} reference {_algo_info(summary, algo).get('reference_config')} "
                       f"({_desc(ref)}): N0* = {fmt_ci(ref.get('N_star'), ref.get('N_star_ci'))} "
                       f"responses, q0 = {fmt_ci(ref.get('q'), ref.get('q_ci'))} responses/s, "
                       f"T0 = {fmt(ref.get('T'))} s.")
    for algo in _algos(summary):
        for key, g in sorted((_algo_info(summary, algo).get("grad_norm") or {}).items()):
            flat = g.get("flattens_after")
            out.append(f"{algo} {key.split('_')[0]} grad norm vs batch (lr rule {g.get('lr_rule')}, "
                       f"B={fmt(g['batches'][0])}..{fmt(g['batches'][-1])}): log-log slope "
                       f"{fmt_ci(g.get('slope'), g.get('slope_ci'), 2)}; "
                       + (f"flattens after B={fmt(flat)}." if flat else "no flattening."))
    crit = [(g, st) for g, st in _sorted_configs(summary) if _ok(st.get("critic_b_simple"))]
    if crit:
        out.append("Critic noise scale B_simple (seed mean, range): " + "; ".join(
            f"{g} {fmt(st['critic_b_simple'])}"
            + (f" ({fmt(st['critic_b_simple_range'][0])}..{fmt(st['critic_b_simple_range'][1])})"
               if st.get("critic_b_simple_range") else "") for g, st in crit) + ".")
    ur = {}
    for g, st in configs.items():
        if _ok(st.get("updates_ratio")) and not _is_ref(summary, g, st):
            ur.setdefault((_algo_of(st), st.get("lr_rule") or "-"), []).append(st["updates_ratio"])
    for (algo, rule), v in sorted(ur.items()):
        span = fmt(min(v), 2) if fmt(min(v), 2) == fmt(max(v), 2) else (
            f"{fmt(min(v), 2)}-{fmt(max(v), 2)}")
        out.append(f"Updates to target relative to the reference ({algo}, lr rule {rule}): "
                   f"{span}x.")
    inv = [(g, st["invariance"]) for g, st in _sorted_configs(summary)
           if (st.get("invariance") or {}).get("within") is not None]
    if inv:
        out.append("Learning curve vs its reference's (mean |dJ| vs the band of eval noise alone, "
                   f"{_level(summary)}): " + "; ".join(
                       f"{g} {fmt(x.get('mean_abs_dev'))} vs {fmt(x.get('band'))} "
                       f"({'within' if x['within'] else 'outside'})" for g, x in inv) + ".")
    bs, coll = _per_batch(summary, "collection_s_per_step")
    if len(bs) >= 2:
        out.append(f"From B={fmt(bs[0])} to B={fmt(bs[-1])} ({bs[-1] / bs[0]:.3g}x responses "
                   f"per step) collection time per step grows {coll[-1] / coll[0]:.3g}x "
                   f"({fmt(coll[0])} s -> {fmt(coll[-1])} s).")
    tf = (summary.get("critical_generation_batch") or {}).get("train_fit") or {}
    if _ok(tf.get("gamma")):
        out.append("Update time per step t_train = c + gamma*B: c = "
                   f"{fmt_ci(tf.get('c'), tf.get('c_ci'))}"
                   f" s, gamma = {fmt_ci(tf.get('gamma'), tf.get('gamma_ci'))} s per response; "
                   "r_q cap over the reference batch "
                   f"{fmt_ci(tf.get('r_q_cap'), tf.get('r_q_cap_ci'))}.")
    sig = [(g, st["sigmoid_A"]) for g, st in _sorted_configs(summary) if _ok(st.get("sigmoid_A"))]
    if sig:
        out.append("Sigmoid fit asymptote A (seed mean): " + ", ".join(
            f"{g} {fmt(a)}" for g, a in sig) + ".")
    return out


# ----------------------------------------------------------------------------------- report


def planner_lines(root: str, summary: dict, path, drawn: list) -> list[str]:
    """A section per planner output in `root` (plan*.json, experiments/plan.py --json_out):
    its predictions of r_N, r_q and T/T0 beside the measured ones (scaling.planner.compare),
    and a figure of both, appended to `drawn`."""
    import glob
    import json
    from jaxrl_scale.scaling import planner
    md = []
    for plan_path in sorted(glob.glob(os.path.join(root, "plan*.json"))):
        with open(plan_path) as f:
            plan = json.load(f)
        rows = planner.compare(plan, summary)
        if not rows:
            continue
        counts = planner.compare_counts(rows)
        rec = plan["recommended"]
        md += [f"## Planner predictions vs measured ({os.path.basename(plan_path)})", "",
               f"Probe at B0 = {fmt(plan['reference_batch'])}: {plan.get('noise_of', 'actor')} "
               f"B_simple = {fmt_ci(plan['B_simple'], plan['B_simple_ci'])}; recommended "
               f"B = {fmt(rec['batch'])} (range {fmt(rec['range'][0])}..{fmt(rec['range'][1])}). "
               "✓ measured point inside the predicted interval, ~ intervals overlap, x disjoint.",
               "", planner.format_compare(rows), "",
               "- " + "; ".join(f"{m}: {c['inside']}/{c['n']} inside, {c['overlap']}/{c['n']} "
                                f"overlap" for m, c in counts.items()), ""]
        stem = os.path.splitext(os.path.basename(plan_path))[0]
        drawn.append(planner.plot_plan(plan, path(stem + "_vs_measured.png"), rows))
    return md


def write_report(sweep_dir: str | None, summary: dict, *, runs: Sequence[Run] | None = None,
                 out_dir: str | None = None) -> str:
    """Write report.md and the figures into ``out_dir`` (default ``sweep_dir``).

    ``runs`` (for the learning curves) default to re-reading ``sweep_dir``. Returns the path
    of report.md. Figures that have no data (e.g. no grad norms logged) are listed as not
    drawn, with the reason.
    """
    out_dir = out_dir or sweep_dir
    if out_dir is None:
        raise ValueError("write_report needs sweep_dir or out_dir")
    os.makedirs(out_dir, exist_ok=True)
    if runs is None:
        runs = read_sweep(sweep_dir).runs if sweep_dir else []
    names = set(summary.get("runs") or {})
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
             "no run gives a batch and a time per step")):
        got = fn(summary, p(fname))
        (drawn.append(got) if got else missing.append(f"{fname}: {why}"))

    main, finds = _answer(summary)
    lvl = _level(summary)
    any_seeds = any((st.get("seeds") or 0) > 1 for st in _configs(summary).values())
    t = summary.get("target")
    md = [f"# Sweep report: time to target J* = {fmt(t, 4)}", "", "## Answer", ""]
    md += [f"- {s}" for s in main]
    md += ["", "Source findings:", ""]
    md += [f"- ({k}) {claim}: **{status}**: {why}." for k, claim, status, why in
           source_findings(summary)]
    md += ["", f"Intervals are {lvl} bootstrap intervals [lo, hi] ({UNBOUNDED}: unbounded, some "
           "replicates never reach the target). T/T0 = r_N / r_q; a config is faster / slower "
           "when the whole T/T0 interval is below / above 1. q is end-to-end throughput "
           "(retained responses per second) over [0, N*].", ""]
    partial = partial_rollout_lines(summary)
    if partial:
        md += ["## Partial rollout vs synchronous", "",
               "Each config run with asynchronous partial rollout (B_gen = k x B_train "
               "sequences in flight) against the synchronous config that differs only in k: "
               "q ratio = q_k / q_sync (end-to-end responses per second), r_N = N*_k / "
               "N*_sync, T ratio = T_k / T_sync = r_N / q ratio, with "
               f"{lvl} intervals from the same seed bootstrap as T/T0; faster / slower when "
               "the whole T ratio interval is below / above 1.", ""]
        md += [f"- {x}" for x in partial] + [""]
    if summary.get("sweep_dir"):
        md += [f"Sweep: `{summary['sweep_dir']}`. References: " + ", ".join(
            f"{a}: `{g}`" for a, g in (summary.get("reference_configs") or {}).items()) + ".", ""]
    md += ["## Configs", "", format_table(summary), ""]
    if any_seeds:
        md += ["### Per run", "", format_table(summary, per_run=True), ""]
    det = _details(summary)
    if det:
        md += ["## Details", ""] + [f"- {s}" for s in det] + [""]
    md += planner_lines(sweep_dir or out_dir, summary, p, drawn)
    md += ["## Figures", ""]
    for f in drawn:
        b = os.path.basename(f)
        md += [f"![{b}]({b})", ""]
    if missing:
        md += ["Not drawn:", ""] + [f"- {m}" for m in missing] + [""]
    md += ["## Skipped directories", ""]
    md += ([f"- `{s['dir']}`: {s['reason']}" for s in summary.get("skipped", [])]
           or ["- none"]) + [""]
    if summary.get("warnings"):
        md += ["## Warnings", ""] + [f"- {w}" for w in summary["warnings"]] + [""]
    path = os.path.join(out_dir, REPORT_FILE)
    with open(path, "w") as f:
        f.write("\n".join(md))
    return path


def analyze_and_report(sweep_dir: str | None, target, reference: str | None = None,
                       tolerance: float = 0.25, fit_sigmoid: bool = False, *,
                       csv: Sequence[str] = (), columns: str | None = None,
                       out: str | None = None, **kwargs) -> dict:
    """analyze_sweep + summary.json + report, into ``out`` (default: the sweep dir, else the
    first CSV's directory). CSV runs (``csv`` paths read with the ``columns`` map) join the
    sweep; ``kwargs`` go to analyze_sweep. Returns the summary."""
    extra = [read_csv_run(c, columns) for c in csv]
    summary = analyze_sweep(sweep_dir, target, reference, tolerance, fit_sigmoid,
                            extra_runs=extra, **kwargs)
    out = out or sweep_dir or os.path.dirname(os.path.abspath(csv[0]))
    runs = (read_sweep(sweep_dir).runs if sweep_dir else []) + extra
    summary["summary_path"] = write_summary(out, summary)
    summary["report_path"] = write_report(sweep_dir, summary, runs=runs, out_dir=out)
    return summary
