"""The sweep report: report.md with a table, measured facts and figures (PNG, Agg canvas).

Figures (SCIENCE.md sections 1-4):
  learning_curves.png   J vs cumulative responses, one line per config; solid sqrt, dashed fixed
  grad_norm.png         actor (and critic) grad norm vs batch, log-log, with a -1/2 guide
  collection_time.png   responses per step and collection seconds per step, both / smallest batch
                        (the source's Figure 7)
  time_to_target.png    T/T0 vs batch, best marked
  critical_batches.png  generation throughput vs batch | r_N vs batch, both critical batches marked

Every sentence in the report is computed from the summary; nothing is claimed that was not
measured. Uses ``matplotlib.figure.Figure`` directly (no pyplot global state).
"""

from __future__ import annotations

import math
import os
from typing import Sequence

import numpy as np
from matplotlib.figure import Figure

from jaxrl_scale.scaling.analysis import analyze_sweep, write_summary
from jaxrl_scale.scaling.io import Run, read_csv_run, read_sweep

REPORT_FILE = "report.md"
FIGURES = ("learning_curves.png", "grad_norm.png", "collection_time.png", "time_to_target.png",
           "critical_batches.png")
RULE_STYLES = {"sqrt": "-", "fixed": "--", "linear": ":", "malladi": "-."}
OTHER_STYLE = (0, (3, 1, 1, 1, 1, 1))


def _ok(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def fmt(x, digits: int = 3) -> str:
    if not _ok(x):
        return "-"
    if x != 0 and (abs(x) >= 1e7 or abs(x) < 1e-3):
        return f"{x:.{digits - 1}e}"
    if abs(x) >= 10 ** digits:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def fmt_pm(mean, std, n: int, digits: int = 3) -> str:
    if not _ok(mean):
        return "-"
    return f"{fmt(mean, digits)} ± {fmt(std, 2)}" if n > 1 and _ok(std) else fmt(mean, digits)


def _style(rule):
    return RULE_STYLES.get(rule, OTHER_STYLE)


def _batch_colors(batches):
    import matplotlib
    bs = sorted({b for b in batches if _ok(b)})
    cmap = matplotlib.colormaps["viridis"]
    if not bs:
        return {}
    lo, hi = math.log2(bs[0]), math.log2(bs[-1])
    return {b: cmap(0.85 * ((math.log2(b) - lo) / (hi - lo) if hi > lo else 0.0)) for b in bs}


def _save(fig: Figure, path: str) -> str:
    fig.savefig(path, dpi=110)
    return path


# ----------------------------------------------------------------------------------- figures


def plot_learning_curves(runs: Sequence[Run], summary: dict, path: str) -> str:
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.add_subplot()
    colors = _batch_colors([r.batch for r in runs])
    labelled = set()
    for r in sorted(runs, key=lambda r: (r.batch or math.inf, r.group, r.name)):
        n, s = r.eval_curve()
        if not n.size:
            continue
        label = None
        if r.group not in labelled:
            labelled.add(r.group)
            label = f"{r.group} (B={fmt(r.batch)})" if r.batch else r.group
        ax.plot(n, s, linestyle=_style(r.lr_rule), color=colors.get(r.batch, "gray"),
                marker=".", ms=3, lw=1.4, label=label)
    ax.axhline(summary["target"], color="red", lw=0.8, ls=":", label=f"target {summary['target']}")
    ax.set_xlabel("cumulative retained responses N")
    ax.set_ylabel("validation score J")
    ax.set_title("Learning curves vs responses (solid sqrt lr, dashed fixed lr)")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_grad_norm(summary: dict, path: str) -> str | None:
    grad = summary.get("grad_norm") or {}
    if not grad:
        return None
    fig = Figure(figsize=(6, 4.2), layout="constrained")
    ax = fig.add_subplot()
    for key, marker, color in (("actor_grad_norm", "o", "C0"), ("critic_grad_norm", "s", "C1")):
        g = grad.get(key)
        if not g:
            continue
        b, v = np.array(g["batches"]), np.array(g["norms"])
        ax.loglog(b, v, marker=marker, color=color,
                  label=f"{key.split('_')[0]} (slope {fmt(g['slope'], 2)})")
        if g.get("flattens_after"):
            ax.axvline(g["flattens_after"], color=color, ls=":", lw=0.8,
                       label=f"{key.split('_')[0]} flattens after B={fmt(g['flattens_after'])}")
    first = grad.get("actor_grad_norm") or next(iter(grad.values()))
    b0, v0 = first["batches"][0], first["norms"][0]
    bb = np.array([first["batches"][0], first["batches"][-1]], dtype=float)
    ax.loglog(bb, v0 * (bb / b0) ** -0.5, color="gray", ls="--", lw=1, label="B^(-1/2) guide")
    ax.set_xlabel("batch (retained responses per update)")
    ax.set_ylabel("median grad norm")
    ax.set_title(f"Grad norm vs batch (lr rule {first.get('lr_rule')})")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)


def _per_batch(summary: dict, key: str) -> tuple[list[float], list[float]]:
    by_b: dict[float, list[float]] = {}
    for st in summary["groups"].values():
        if _ok(st.get("batch")) and _ok(st.get(key)):
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
    src = {st.get("collection_source") for st in summary["runs"].values()} - {None}
    ax.set_title(f"Per-step growth vs the smallest batch (source Fig. 7); collection = "
                 f"{'/'.join(sorted(src)) or '?'}", fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_time_to_target(summary: dict, path: str) -> str:
    fig = Figure(figsize=(6.5, 4.2), layout="constrained")
    ax = fig.add_subplot()
    groups = summary["groups"]
    rules = sorted({st.get("lr_rule") or "?" for st in groups.values()})
    top = max([st["T_over_T0"] for st in groups.values() if _ok(st.get("T_over_T0"))] + [1.0])
    for i, rule in enumerate(rules):
        pts = sorted((st["batch"], st["T_over_T0"], st.get("T_over_T0_std"), st["n_seeds"])
                     for st in groups.values() if (st.get("lr_rule") or "?") == rule
                     and _ok(st.get("batch")) and _ok(st.get("T_over_T0")))
        if pts:
            b, t, sd, n = zip(*pts)
            err = [s if (_ok(s) and k > 1) else 0.0 for s, k in zip(sd, n)]
            ax.errorbar(b, t, yerr=err, ls=_style(rule), marker="o", color=f"C{i}",
                        label=f"lr rule {rule}", capsize=3)
        miss = [st["batch"] for st in groups.values() if (st.get("lr_rule") or "?") == rule
                and _ok(st.get("batch")) and not st["reached"]]
        if miss:
            ax.scatter(miss, [top * 1.1] * len(miss), marker="x", color=f"C{i}", s=60,
                       label=f"{rule}: not reached")
    best = summary.get("best_group")
    if best and _ok(groups[best].get("batch")):
        ax.scatter([groups[best]["batch"]], [groups[best]["T_over_T0"]], marker="*", s=250,
                   color="gold", edgecolor="k", zorder=5, label=f"best: {best}")
    ax.axhline(1.0, color="gray", lw=0.8, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch (retained responses per update)")
    ax.set_ylabel("T / T0 = r_N / r_q")
    ax.set_title(f"Time to target J*={summary['target']} vs reference {summary['reference']}",
                 fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_critical_batches(summary: dict, path: str) -> str:
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    cgb = summary["critical_generation_batch"]
    pts = cgb["points"]
    if pts:
        ax1.plot([p["batch"] for p in pts], [p["throughput"] for p in pts], "o-", color="C0")
    if cgb.get("batch"):
        ax1.axvline(cgb["batch"], color="C3", ls="--",
                    label=f"critical generation batch {fmt(cgb['batch'])}")
    else:
        ax1.plot([], [], " ", label=f"no plateau (<{cgb['min_gain']:.0%}/doubling) in grid")
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel(cgb.get("batch_kind", "batch"))
    ax1.set_ylabel("generated responses / gen second" if cgb["metric"] == "gen_throughput"
                   else "retained responses / second (end-to-end)")
    ax1.set_title("System: generation throughput")
    ax1.legend(fontsize=7)
    ax1.grid(alpha=0.3)

    ctb = summary["critical_training_batch"]
    reached = [p for p in ctb["points"] if p["reached"] and _ok(p["r_N"])]
    if reached:
        ax2.plot([p["batch"] for p in reached], [p["r_N"] for p in reached], "o-", color="C2",
                 label=f"measured r_N (lr {ctb['lr_rule']})")
    miss = [p["batch"] for p in ctb["points"] if not p["reached"]]
    if miss:
        ytop = max([p["r_N"] for p in reached] + [1 + ctb["tolerance"]]) * 1.1
        ax2.scatter(miss, [ytop] * len(miss), marker="x", color="C2", s=60, label="not reached")
    ax2.axhline(1 + ctb["tolerance"], color="gray", ls=":", lw=0.8,
                label=f"r_N = {1 + ctb['tolerance']:g}")
    noise = summary.get("noise")
    if noise and noise.get("predicted_r_N"):
        groups = summary["groups"]
        pr = sorted((groups[g]["batch"], v) for g, v in noise["predicted_r_N"].items())
        ax2.plot(*zip(*pr), ls="--", color="C4",
                 label=f"predicted, B_simple={fmt(noise['reference_b_simple'])}")
    if ctb.get("batch"):
        ax2.axvline(ctb["batch"], color="C3", ls="--",
                    label=f"critical training batch {fmt(ctb['batch'])}")
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("batch (retained responses per update)")
    ax2.set_ylabel("r_N = N* / N0*")
    ax2.set_title("Samples: sample cost")
    ax2.legend(fontsize=7)
    ax2.grid(alpha=0.3)
    return _save(fig, path)


# ----------------------------------------------------------------------------------- text


def format_table(summary: dict, per_run: bool = False) -> str:
    """Markdown table of N*, q, r_N, r_q, T/T0 per config (mean ± std over seeds), or per run."""
    head = ("| {} | seeds | B | lr rule | N* | q (resp/s) | r_N | r_q | T/T0 | updates ratio |\n"
            "|---|---|---|---|---|---|---|---|---|---|")
    lines = []
    if per_run:
        lines.append(head.format("run").replace("| seeds ", "| seed "))
        items = sorted(summary["runs"].items(),
                       key=lambda kv: (kv[1].get("batch") or math.inf, kv[0]))
        for name, x in items:
            cells = ([fmt(x[k]) for k in ("N_star", "q", "r_N", "r_q", "T_over_T0",
                                          "updates_ratio")] if x["reached"]
                     else ["not reached"] + ["-"] * 5)
            lines.append(f"| {name} | {x.get('seed', '-')} | {fmt(x.get('batch'))} | "
                         f"{x.get('lr_rule') or '-'} | " + " | ".join(cells) + " |")
        return "\n".join(lines)
    lines.append(head.format("config"))
    items = sorted(summary["groups"].items(), key=lambda kv: (kv[1].get("batch") or math.inf,
                                                              kv[0]))
    for g, st in items:
        n = st["n_reached"]
        if n == 0:
            cells = ["not reached"] + ["-"] * 5
        else:
            cells = [fmt_pm(st[k], st.get(k + "_std"), n) for k in
                     ("N_star", "q", "r_N", "r_q", "T_over_T0", "updates_ratio")]
            if n < st["n_seeds"]:
                cells[0] += f" ({n}/{st['n_seeds']} reached)"
        mark = " (ref)" if g == summary["reference"] or set(st["runs"]) == set(
            summary.get("reference_runs", [])) else ""
        lines.append(f"| {g}{mark} | {st['n_seeds']} | {fmt(st.get('batch'))} | "
                     f"{st.get('lr_rule') or '-'} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def facts(summary: dict) -> list[str]:
    """Short sentences, each stating a number computed in the summary."""
    out = []
    runs, groups, target = summary["runs"], summary["groups"], summary["target"]
    refs = [runs[n] for n in summary.get("reference_runs", [summary["reference"]]) if n in runs]
    if refs:
        r0 = refs[0]
        n0 = np.mean([r["N_star"] for r in refs if _ok(r["N_star"])])
        qs = [r["q"] for r in refs if _ok(r["q"])]
        q0 = np.mean(qs) if qs else None
        out.append(f"Reference {summary['reference']} (B={fmt(r0.get('batch'))}, lr rule "
                   f"{r0.get('lr_rule') or '-'}) reaches J*={target:g} after N0*={fmt(n0)} "
                   f"responses at q0={fmt(q0)} responses/s"
                   + (f" (T0={fmt(n0 / q0)} s)." if _ok(q0) else "."))
    faster = [(g, st) for g, st in groups.items() if st["reached"] and _ok(st["T_over_T0"])
              and st["T_over_T0"] < 1]
    slower = [(g, st) for g, st in groups.items() if st["reached"] and _ok(st["T_over_T0"])
              and st["T_over_T0"] > 1]
    if faster:
        out.append("Faster than the reference (r_q > r_N): " + ", ".join(
            f"{g} (r_N={fmt(st['r_N'])}, r_q={fmt(st['r_q'])}, T/T0={fmt(st['T_over_T0'])})"
            for g, st in sorted(faster, key=lambda kv: kv[1]["T_over_T0"])) + ".")
    if slower:
        out.append("Slower than the reference (r_q < r_N): " + ", ".join(
            f"{g} (r_N={fmt(st['r_N'])}, r_q={fmt(st['r_q'])}, T/T0={fmt(st['T_over_T0'])})"
            for g, st in sorted(slower, key=lambda kv: kv[1]["T_over_T0"])) + ".")
    best = summary.get("best_group")
    if best:
        st = groups[best]
        out.append(f"Best config (max q/r_N among reached): {best} (B={fmt(st.get('batch'))}), "
                   f"T/T0={fmt(st['T_over_T0'])}.")
    missed = [(g, st) for g, st in groups.items() if st["n_reached"] < st["n_seeds"]]
    for g, st in missed:
        ms = [runs[n]["max_score"] for n in st["runs"] if _ok(runs[n].get("max_score"))]
        out.append(f"{g}: {st['n_seeds'] - st['n_reached']}/{st['n_seeds']} seed(s) did not "
                   f"reach J*={target:g}" + (f" (best eval score {fmt(max(ms))})." if ms else
                                             " (no eval records)."))
    ur = {}
    for g, st in groups.items():
        if _ok(st.get("updates_ratio")) and not set(st["runs"]) <= set(
                summary.get("reference_runs", [])):
            ur.setdefault(st.get("lr_rule") or "-", []).append(st["updates_ratio"])
    for rule, v in sorted(ur.items()):
        span = fmt(min(v), 2) if fmt(min(v), 2) == fmt(max(v), 2) else (
            f"{fmt(min(v), 2)}-{fmt(max(v), 2)}")
        out.append(f"Updates to target relative to the reference, lr rule {rule}: {span}x.")
    ctb = summary["critical_training_batch"]
    if ctb["batch"]:
        out.append(f"Critical training batch (largest B with r_N <= {1 + ctb['tolerance']:g}, "
                   f"lr rule {ctb['lr_rule']}): B={fmt(ctb['batch'])}.")
    else:
        out.append(f"No measured batch under lr rule {ctb['lr_rule']} has "
                   f"r_N <= {1 + ctb['tolerance']:g}.")
    cgb = summary["critical_generation_batch"]
    what = ("generation throughput" if cgb["metric"] == "gen_throughput"
            else "end-to-end throughput (no gen_s logged)")
    if cgb["batch"]:
        out.append(f"Critical generation batch ({what} gains < {cgb['min_gain']:.0%} per "
                   f"doubling): {cgb.get('batch_kind')}={fmt(cgb['batch'])}.")
    elif len(cgb["points"]) >= 2:
        last = cgb["points"][-2]
        out.append(f"{what.capitalize()} has not plateaued within the measured grid: the last "
                   f"gain per doubling is {last['gain_per_doubling']:+.0%} from B="
                   f"{fmt(last['batch'])} to {fmt(cgb['points'][-1]['batch'])}.")
    for key, g in (summary.get("grad_norm") or {}).items():
        who = key.split("_")[0].capitalize()
        s = (f"{who} grad-norm log-log slope over B={fmt(g['batches'][0])}..."
             f"{fmt(g['batches'][-1])} (lr rule {g['lr_rule']}) is {fmt(g['slope'], 2)}")
        if g.get("flattens_after"):
            s += (f"; the local slope exceeds {g['flat_threshold']:g} after "
                  f"B={fmt(g['flattens_after'])}.")
        else:
            s += f"; the local slope stays below {g['flat_threshold']:g} throughout."
        out.append(s)
    bs, coll = _per_batch(summary, "collection_s_per_step")
    if len(bs) >= 2:
        out.append(f"From B={fmt(bs[0])} to B={fmt(bs[-1])} ({bs[-1] / bs[0]:.3g}x responses "
                   f"per step) collection time per step grows {coll[-1] / coll[0]:.3g}x "
                   f"({fmt(coll[0])} s -> {fmt(coll[-1])} s).")
    inv_in = [n for n, x in runs.items() if (x.get("invariance") or {}).get("within") is True]
    inv_out = [n for n, x in runs.items() if (x.get("invariance") or {}).get("within") is False]
    if inv_in or inv_out:
        band = next((x["invariance"]["band"] for x in runs.values()
                     if (x.get("invariance") or {}).get("band") is not None), None)
        out.append(f"Learning curves within mean |dJ| <= {fmt(band)} of the reference curve: "
                   f"{', '.join(inv_in) or 'none'}; outside: {', '.join(inv_out) or 'none'}.")
    noise = summary.get("noise")
    if noise:
        out.append(f"Noise scale B_simple from the reference's micro-batch gradient norms: "
                   f"{fmt(noise['reference_b_simple'])} responses.")
    sig = [(n, x["sigmoid"]) for n, x in runs.items() if x.get("sigmoid")]
    if sig:
        out.append("Sigmoid fit asymptote A: " + ", ".join(
            f"{n} {fmt(s['A'])}" + (f" (N*={fmt(s['N_star'])} ± {fmt(s['N_star_std'], 2)})"
                                    if _ok(s.get("N_star")) else "") for n, s in sig) + ".")
    return out


# ----------------------------------------------------------------------------------- report


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
    names = set(summary["runs"])
    runs = [r for r in runs if r.name in names]

    drawn, missing = [], []
    p = lambda f: os.path.join(out_dir, f)
    drawn.append(plot_learning_curves(runs, summary, p("learning_curves.png")))
    for fname, fn, why in (
            ("grad_norm.png", plot_grad_norm,
             "fewer than 2 batches (same lr rule as the reference) log actor_grad_norm"),
            ("collection_time.png", plot_collection_time,
             "no run gives a batch and a time per step")):
        got = fn(summary, p(fname))
        (drawn.append(got) if got else missing.append(f"{fname}: {why}"))
    drawn.append(plot_time_to_target(summary, p("time_to_target.png")))
    drawn.append(plot_critical_batches(summary, p("critical_batches.png")))

    any_seeds = any(st["n_seeds"] > 1 for st in summary["groups"].values())
    md = [f"# Sweep report: time to target J* = {summary['target']:g}", ""]
    if summary.get("sweep_dir"):
        md.append(f"Sweep: `{summary['sweep_dir']}`. ")
    md += [f"Reference: `{summary['reference']}`. Best run: `{summary.get('best')}`. "
           f"Best config: `{summary.get('best_group')}`.", "",
           "T/T0 = r_N / r_q; a larger batch is faster iff r_q > r_N. q is mean end-to-end "
           "throughput (retained responses per second) over [0, N*].", "",
           "## Time to target" + (" (mean ± std over seeds)" if any_seeds else ""), "",
           format_table(summary), ""]
    if any_seeds:
        md += ["### Per run", "", format_table(summary, per_run=True), ""]
    md += ["## Measured facts", ""] + [f"- {s}" for s in facts(summary)] + [""]
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
                       tolerance: float = 0.1, fit_sigmoid: bool = False, *,
                       csv: Sequence[str] = (), columns: str | None = None,
                       out: str | None = None, **kwargs) -> dict:
    """analyze_sweep + summary.json + report, into ``out`` (default: the sweep dir, else the
    first CSV's directory). CSV runs (``csv`` paths read with the ``columns`` map) join the
    sweep. Returns the summary."""
    extra = [read_csv_run(c, columns) for c in csv]
    summary = analyze_sweep(sweep_dir, target, reference, tolerance, fit_sigmoid,
                            extra_runs=extra, **kwargs)
    out = out or sweep_dir or os.path.dirname(os.path.abspath(csv[0]))
    runs = (read_sweep(sweep_dir).runs if sweep_dir else []) + extra
    summary["summary_path"] = write_summary(out, summary)
    summary["report_path"] = write_report(sweep_dir, summary, runs=runs, out_dir=out)
    return summary
