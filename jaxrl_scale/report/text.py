"""The report's sentences: the Answer lines (power, verdicts, fastest set, critical batches),
the source findings as stored in the summary, partial rollout vs synchronous, further
details and the planner-vs-measured sections."""

from __future__ import annotations

import math
import os

from jaxrl_scale.numbers import fmt, fmt_ci
from jaxrl_scale.report.base import (N_WORDS, _algo_info, _algo_of, _algos, _configs, _desc,
                                     _is_ref, _level, _multi, _ok, _per_batch, _sorted_configs,
                                     n_unit)
from jaxrl_scale.report.design import design_lines
from jaxrl_scale.scaling import findings as findings_mod
from jaxrl_scale.scaling.summary import Summary, as_summary


def _power_line(summary: Summary, algo: str, prefix: str) -> str:
    a = _algo_info(summary, algo)
    se = a.eval_se
    src = a.eval_se_source
    t = a.target
    rule = a.target_rule
    start = a.start_score
    snr = a.signal_to_noise
    tgt = f"J* = {fmt(t)}"
    if rule:
        tgt += (f" (auto: {rule.get('rule')}; start {fmt(rule.get('start'))}, reach "
                f"{fmt(rule.get('reach'))})")
    ref = a.reference_config
    jit = a.curve_jitter_se
    s = f"{prefix}Power (reference {ref}): eval SE = {fmt(se)} ({src or 'unknown source'}); " \
        + (f"the curves jitter by {fmt(jit)} between evals (policy noise included; the "
           f"bootstrap never uses less); " if _ok(jit) else "") + \
        f"target {tgt}; reference start score {fmt(start)}; "
    verdict = a.eval_power   # decided by the typed summary, rendered here
    gap = t - start if _ok(t) and _ok(start) else None
    if verdict == "unknown":
        return s + "signal-to-noise unknown."
    if _ok(gap) and gap > 0:
        s += (f"SE / (J* - start) = {fmt(se / gap)} vs 1/{a.MIN_SNR:g} = {fmt(1 / a.MIN_SNR)} "
              f"(signal-to-noise {fmt(snr)}): ")
    else:
        s += f"the target is not above the start (J* - start = {fmt(gap)}): "
    s += "OK." if verdict == "OK" else "UNDERPOWERED: verdicts below may be noise."
    return s


def _ref_miss_line(summary: Summary, algo: str, prefix: str) -> str:
    a = _algo_info(summary, algo)
    t, best, se = a.target, a.reference_best_smoothed, a.eval_se
    s = f"{prefix}The reference {a.reference_config} did NOT reach the target J* = {fmt(t)}"
    if _ok(best) and _ok(t):
        s += f": its best smoothed score is {fmt(best)}, {fmt(t - best)} below the target"
        if _ok(se) and se > 0:
            s += f" ({fmt((t - best) / se, 2)} eval SEs of {fmt(se)})"
    return s + (". No time-to-target verdict is possible (no r_N, r_q, T/T0); the learning "
                "curves, throughput and grad norms below still stand.")




def _verdict_lines(summary: Summary, algo: str, prefix: str) -> list[str]:
    a = _algo_info(summary, algo)
    ref = a.reference_config
    items = [(g, st) for g, st in _sorted_configs(summary, algo) if not _is_ref(summary, g, st)]
    out = []
    lvl = _level(summary)
    by = {v: [(g, st) for g, st in items if st.verdict == v]
          for v in ("faster", "slower", "indistinguishable", "not reached")}
    def tt(g, st):
        if st.T_over_T0 is None and (st.T_over_T0_test or {}).get("log_ratio") is not None:
            return (f"{g} ({_desc(st)}): T/T0 >= {fmt(math.exp(st.T_over_T0_test['log_ratio']))}"
                    f" ({st.seeds - st.seeds_reached} of {st.seeds} seeds did not reach J*; "
                    "each counts at its budget, a lower bound)")
        return (f"{g} ({_desc(st)}): T/T0 = {fmt_ci(st.T_over_T0, st.T_over_T0_ci)}"
                + (" [fragile]" if st.fragile else ""))

    def order(kv):
        return (kv[1].T_over_T0 is None, kv[1].T_over_T0 or 0.0)

    out.append(f"{prefix}Faster than the reference {ref} (T/T0 below 1, Holm-adjusted over all configs at {lvl}): "
               + ("; ".join(tt(g, st) for g, st in sorted(by["faster"], key=order))
                  or "none") + ".")
    out.append(f"{prefix}Slower (T/T0 above 1, family-wise): "
               + ("; ".join(tt(g, st) for g, st in sorted(by["slower"], key=order))
                  or "none") + ".")
    lo, hi = (summary.familywise or {}).get("margin") or (0.8, 1.25)

    def same(g, st):   # TOST: the simultaneous interval inside the margin, or not shown
        return tt(g, st) + (f", equivalent within [{fmt(lo)}, {fmt(hi)}]" if st.alike_T else
                            f", not shown equivalent (its simultaneous interval leaves "
                            f"[{fmt(lo)}, {fmt(hi)}])")
    out.append(f"{prefix}Indistinguishable from the reference (no family-wise difference; "
               "that is not equality): "
               + ("; ".join(same(g, st) for g, st in by["indistinguishable"]) or "none") + ".")
    if by["not reached"]:
        def bound(st):   # the family's test on lower bounds, when it ran
            lr = (st.T_over_T0_test or {}).get("log_ratio")
            return (f" (T/T0 >= {fmt(math.exp(lr))}, the runs that missed counted at their "
                    "budget; not significantly above 1)" if lr is not None else "")
        out.append(f"{prefix}Not reached: " + "; ".join(
            f"{g} ({_desc(st)}): {st.seeds_reached}/{st.seeds} seeds "
            f"reached J*{bound(st)}" for g, st in by["not reached"]) + ".")
    if any(st.fragile for _, st in items):
        out.append(f"{prefix}[fragile]: the verdict's test statistic lies near the critical "
                   "value of its Holm step; two independent studies at such a truth give the "
                   "same verdict about half the time, so a rerun may well read otherwise "
                   "(docs/science.md, Reproducibility of a verdict).")
    return out


def _best_line(summary: Summary, algo: str, prefix: str) -> str:
    a = _algo_info(summary, algo)
    best = list(a.best_set)
    configs = _configs(summary)
    ref_ok = a.reference_reached

    def one(g):
        st = configs[g]
        s = f"{g} ({_desc(st)}, T = {fmt(st.T)} s"
        if ref_ok and _ok(st.T_over_T0):
            s += f", T/T0 = {fmt_ci(st.T_over_T0, st.T_over_T0_ci)}"
        return s + ")"

    if not best:
        return f"{prefix}No config reached J*: there is no fastest set."
    if not ref_ok:
        prefix += "Among the configs that reached J* on their own (no T/T0): "
    n_reached = sum(bool(st.reached) for _, st in _sorted_configs(summary, algo))
    if len(best) == 1 and n_reached <= 1:
        return f"{prefix}Fastest: {one(best[0])}, the only config that reached J*."
    missed = [g for g, st in _sorted_configs(summary, algo) if not st.reached]
    if missed and ref_ok:   # Hsu's MCB is over the configs whose every run reached J*
        prefix += (f"Among the {n_reached} configs whose every run reached J* ("
                   f"{', '.join(missed)} left out: some of their runs did not): ")
    if len(best) == 1:
        return f"{prefix}Fastest: {one(best[0])}, distinguishable from all others."
    return (f"{prefix}Fastest set ({len(best)} configs not distinguishable from the fastest, "
            f"{best[0]}; no single best): " + "; ".join(one(g) for g in best) + ".")


def _ctb_line(summary: Summary, algo: str, prefix: str) -> str:
    a = _algo_info(summary, algo)
    ctb = a.critical_training_batch
    tol = ctb.tolerance
    lim = 1 + tol if _ok(tol) else None
    pts: dict[float, list] = {}
    for p in ctb.points or []:
        pts.setdefault(p["batch"], []).append(p)

    def at(b, reached_only=False):
        """Every config measured at batch b (several when group sizes differ), with r_N."""
        return ", ".join(f"{p['config']} r_N = {fmt_ci(p.get('r_N'), p.get('r_N_ci'))}"
                         if p.get("reached") else f"{p['config']} not reached within the budget"
                         for p in pts.get(b, []))

    rule = ctb.lr_rule or "-"
    if not a.reference_reached:
        return (f"{prefix}Critical training batch: undetermined (the reference did not reach "
                "J*, so no r_N).")
    b0 = ctb.above_batch
    above = f" above B0 = {fmt(b0)}" if _ok(b0) else ""
    head = (f"{prefix}Critical training batch (lr rule {rule}, largest B{above} whose r_N "
            f"{_level(summary)} upper bound is <= {fmt(lim)}, every batch between qualifying): ")
    b = ctb.batch
    s = head + (f"B = {fmt(b)} ({at(b)})" if _ok(b) else
                f"none of the measured batches{above} qualifies")
    c = ctb.cost_detected_at
    if _ok(c):
        s += f"; a sample cost is detected at B = {fmt(c)} ({at(c)})"
    else:
        s += f"; no r_N lower bound exceeds the tolerance {fmt(lim)}"
        small = sorted(b for b, ps in pts.items()
                       if any(_ok((p.get("r_N_ci") or [None])[0]) and p["r_N_ci"][0] > 1
                              for p in ps))
        if small:   # detected, but below the tolerance: a cost, not its absence
            s += (", though r_N's interval lies above 1 at B = "
                  + ", ".join(f"{fmt(b)} ({at(b)})" for b in small)
                  + ": a sample cost smaller than the tolerance")
    return s + "."


def _cgb_line(cgb) -> str:
    """The critical generation batch sentence from the primary algorithm's step-cost fit."""
    pts = cgb.points or []
    kind = cgb.batch_kind or "batch"
    what = "collection (gen_s)" if cgb.metric == "gen_s" else \
        "step time (no gen_s logged)"
    if not (_ok(cgb.d0) and _ok(cgb.d1)):
        return (f"Critical generation batch: not estimated ({what} measured at "
                f"{len(pts)} distinct batch(es); the fit t_gen = d0 + d1*B needs 2).")
    fit = (f"t_gen = d0 + d1*B from {what}: d0 = {fmt_ci(cgb.d0, cgb.d0_ci)} s, "
           f"d1 = {fmt_ci(cgb.d1, cgb.d1_ci)} s per response")
    gain = cgb.min_gain
    rule = (f"a doubling adds < {gain:.0%} throughput" if _ok(gain) else "throughput plateaus")
    if not _ok(cgb.batch):
        return (f"Critical generation batch: none (d1 <= 0, the per-response cost is not "
                f"positive); {fit}.")
    if cgb.d0 <= 0:   # d0 / d1 would put it at 0: no fixed per-step cost was measured
        return (f"Critical generation batch: undefined (the intercept d0 is not positive: "
                f"generation time grows in proportion to the batch over the measured grid, "
                f"so no batch amortises a fixed cost); {fit}.")
    lo_b = min((p["batch"] for p in pts), default=None)
    grid = max((p["batch"] for p in pts), default=None)
    if cgb.within_grid:
        where = "within the measured grid"
    elif _ok(lo_b) and cgb.batch < lo_b:
        where = (f"below the measured grid (smallest measured {kind} = {fmt(lo_b)}: "
                 "generation throughput is already near its plateau there)")
    else:
        where = f"beyond the measured grid (largest measured {kind} = {fmt(grid)})"
    return (f"Critical generation batch ({kind} beyond which {rule}): "
            f"{fmt_ci(cgb.batch, cgb.batch_ci)}, {where}; {fit}{_mixed_note(cgb)}.")


def _mixed_note(cgb) -> str:
    if cgb.sync_batches >= 2:
        return ""
    return ("; CAUTION: B_gen varies only through gen_batch_ratio, so the fit sets partial-"
            "rollout (slot engine) rounds against synchronous ones rather than sampling one "
            "decode curve")


# --- source findings: decided in scaling/findings.py and stored in summary.json; rendered here.

def source_findings(summary) -> list[tuple[int, str, str, str]]:
    """[(number, claim, status, detail)] of the summary's findings (numbered in the order of
    `findings.IDS`; "[algo]" after the claim when the sweep has several algorithms). A summary
    recorded before findings were data has none (regenerate it from its logs)."""
    summary = as_summary(summary)
    multi = _multi(summary)
    out = []
    for f in summary.findings:
        k = findings_mod.IDS.index(f.id) + 1
        claim = f.claim + (f" [{f.algo}]" if multi and f.algo else "")
        out.append((k, claim, f.status, f.detail))
    return out


def _answer(summary: Summary) -> tuple[list[str], list[str]]:
    main = design_lines(summary)   # lr bracket, power, drift first
    algos = _algos(summary)
    multi = len(algos) > 1
    for algo in algos:
        a = _algo_info(summary, algo)
        prefix = f"[{algo}] " if multi else ""
        if not a.reference_reached:
            main.append(_ref_miss_line(summary, algo, prefix))
            main.append(_power_line(summary, algo, prefix))
            main.append(f"{prefix}Seeds that reached J* per config: " + "; ".join(
                f"{g} {st.seeds_reached}/{st.seeds}"
                for g, st in _sorted_configs(summary, algo)) + ".")
        else:
            main.append(_power_line(summary, algo, prefix))
            main += _verdict_lines(summary, algo, prefix)
        main.append(_best_line(summary, algo, prefix))
        main.append(_ctb_line(summary, algo, prefix))
    main.append(_cgb_line(summary.primary.critical_generation_batch))
    finds = [f"Source finding ({k}) {claim}: {status.upper()}: {why}."
             for k, claim, status, why in source_findings(summary)]
    return main, finds


PARTIAL_VERDICTS = {"faster": "FASTER (Holm over the partial-rollout comparisons)",
                    "slower": "SLOWER (Holm over the partial-rollout comparisons)",
                    "indistinguishable": "indistinguishable (no family-wise difference)"}
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


def partial_rollout_lines(summary: Summary) -> list[str]:
    """One line per config run with partial rollout (k > 1) against its synchronous twin:
    q ratio, r_N, T ratio with intervals and the verdict; empty without such configs."""
    return [_partial_line(x) for x in as_summary(summary).partial_rollout]


def facts(summary) -> list[str]:
    """The Answer lines of report.md: power, verdicts, fastest set, critical batches, the
    source findings and partial rollout vs synchronous, each number with its interval (from a
    `Summary` or summary.json's dict)."""
    summary = as_summary(summary)
    main, finds = _answer(summary)
    return main + finds + partial_rollout_lines(summary)


def _details(summary: Summary) -> list[str]:
    """Further measured numbers (not part of the answer)."""
    out = []
    configs = _configs(summary)
    for algo in _algos(summary):
        name = _algo_info(summary, algo).reference_config
        ref = configs.get(name)
        if ref is not None and ref.reached:
            out.append(f"{algo} reference {name} "
                       f"({_desc(ref)}): N0* = {fmt_ci(ref.N_star, ref.N_star_ci)} "
                       f"{N_WORDS[n_unit(summary)]}, q0 = {fmt_ci(ref.q, ref.q_ci)} "
                       f"{N_WORDS[n_unit(summary)]}/s, "
                       f"T0 = {fmt(ref.T)} s.")
    for algo in _algos(summary):
        for key, g in sorted(_algo_info(summary, algo).grad_norm.items()):
            flat = g.get("flattens_after")
            out.append(f"{algo} {key.split('_')[0]} grad norm vs batch "
                       f"(lr rule {g.get('lr_rule')}, "
                       f"B={fmt(g['batches'][0])}..{fmt(g['batches'][-1])}): log-log slope "
                       f"{fmt_ci(g.get('slope'), g.get('slope_ci'), 2)}; "
                       + (f"flattens after B={fmt(flat)}." if flat else "no flattening."))
    crit = [(g, st) for g, st in _sorted_configs(summary) if _ok(st.critic_b_simple)]
    if crit:
        out.append("Critic noise scale B_simple (seed mean, range): " + "; ".join(
            f"{g} {fmt(st.critic_b_simple)}"
            + (f" ({fmt(st.critic_b_simple_range[0])}..{fmt(st.critic_b_simple_range[1])})"
               if st.critic_b_simple_range else "") for g, st in crit) + ".")
    ur = {}
    for g, st in configs.items():
        if _ok(st.updates_ratio) and not _is_ref(summary, g, st):
            ur.setdefault((_algo_of(st), st.lr_rule or "-"), []).append(st.updates_ratio)
    for (algo, rule), v in sorted(ur.items()):
        span = fmt(min(v), 2) if fmt(min(v), 2) == fmt(max(v), 2) else (
            f"{fmt(min(v), 2)}-{fmt(max(v), 2)}")
        out.append(f"Updates to target relative to the reference ({algo}, lr rule {rule}): "
                   f"{span}x.")
    inv = [(g, st.invariance) for g, st in _sorted_configs(summary)
           if (st.invariance or {}).get("within") is not None]
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
    tf = summary.primary.critical_generation_batch.train_fit or {}
    if _ok(tf.get("gamma")):
        out.append("Update time per step t_train = overhead + gamma*B: overhead = "
                   f"{fmt_ci(tf.get('overhead'), tf.get('overhead_ci'))}"
                   f" s, gamma = {fmt_ci(tf.get('gamma'), tf.get('gamma_ci'))} s per response; "
                   "the fitted lines' r_q limit as B grows (a fit; finding (6) uses the "
                   "measured r_q) "
                   f"{fmt_ci(tf.get('r_q_cap'), tf.get('r_q_cap_ci'))}.")
    sig = [(g, st.sigmoid_A) for g, st in _sorted_configs(summary) if _ok(st.sigmoid_A)]
    if sig:
        out.append("Sigmoid fit asymptote A (seed mean): " + ", ".join(
            f"{g} {fmt(a)}" for g, a in sig) + ".")
    return out


def planner_lines(root: str, summary: Summary, path, drawn: list) -> list[str]:
    """A section per planner output in `root` (plan*.json, experiments/plan.py --json_out):
    its predictions of r_N, r_q and T/T0 beside the measured ones (scaling.planner.compare),
    and a figure of both, appended to `drawn`."""
    import glob
    import json
    from jaxrl_scale.scaling import plan_compare, planner
    md = []
    for plan_path in sorted(glob.glob(os.path.join(root, "plan*.json"))):
        with open(plan_path) as f:
            plan = json.load(f)
        rows = planner.compare(plan, summary)
        if not rows:
            continue
        counts = planner.compare_counts(rows)
        rec = plan["recommended"]
        fb = plan.get("first_block")
        probe = (f"the {len(fb['probe_runs'])} reference runs of warm-start block {fb['block']} "
                 "alone, as a plan made before the other blocks; " if fb else "")
        md += [f"## Planner predictions vs measured ({os.path.basename(plan_path)})", "",
               f"Probe at B0 = {fmt(plan['reference_batch'])} ({probe}"
               f"{plan.get('b_crit_rule', 'B_crit = B_simple')}): {plan.get('noise_of', 'actor')} "
               f"B_simple = {fmt_ci(plan['B_simple'], plan['B_simple_ci'])}; recommended "
               f"B = {fmt(rec['batch'])} (range {fmt(rec['range'][0])}..{fmt(rec['range'][1])}). "
               "✓ measured point inside the predicted interval, ~ intervals overlap, x disjoint.",
               "", plan_compare.separation_text(rec), ""]
        if plan.get("plan_first"):
            md += ["The study ran later warm-starts only where this plan kept a batch (--plan_"
                   "first): no runs of " + (", ".join(plan["plan_first"]["dropped"]) or "none")
                   + " after the first warm-start.", ""]
        md += [planner.format_compare(rows), "",
               "- " + "; ".join(f"{m}: {c['inside']}/{c['n']} inside, {c['overlap']}/{c['n']} "
                                f"overlap" for m, c in counts.items()), ""]
        stem = os.path.splitext(os.path.basename(plan_path))[0]
        drawn.append(planner.plot_plan(plan, path(stem + "_vs_measured.png"), rows))
    return md
