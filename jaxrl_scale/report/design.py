"""The report's first lines about the design itself: the regime
the machine is in, the lr bracket, the power of the design under family-wise control, and
whether machine drift is controlled. They only render fields of the Summary, before any
verdict."""

from __future__ import annotations

from jaxrl_scale.numbers import fmt, fmt_ci
from jaxrl_scale.scaling.familywise import MAX_SEEDS
from jaxrl_scale.scaling.summary import Summary, as_summary


def _pct(x) -> str:
    return f"{100 * x:.0f}%"


def regime_lines(summary: Summary | dict) -> list[str]:
    """Per algorithm: generation-bound or update-bound at the reference batch, with the
    shares of a step and the fitted decode cost d0 + d1 B_gen (nothing when the logs have no
    generation and update times)."""
    s = as_summary(summary)
    out = []
    for algo, a in sorted(s.algos.items()):
        r = a.regime
        if r is None or r.regime == "unknown":   # summary.json keeps the reason; no line to act on
            continue
        g_lo, g_hi = r.gen_share_range
        u_lo, u_hi = r.update_share_range
        spread = (lambda lo, hi: f", {_pct(lo)}-{_pct(hi)} over {r.runs} runs"
                  if r.runs > 1 else "")
        line = (f"Regime [{algo}]: {r.regime} at the reference batch B = {fmt(r.batch)}: "
                f"generation {fmt(r.gen_s)} s ({_pct(r.gen_share)} of a step"
                f"{spread(g_lo, g_hi)}), update {fmt(r.update_s)} s "
                f"({_pct(r.update_share)}{spread(u_lo, u_hi)})")
        if r.d1 is not None:
            line += (f"; one decode round of B_gen sequences takes d0 + d1 B_gen, d0 = "
                     f"{fmt_ci(r.d0, r.d0_ci)} s, d1 = "
                     f"{fmt_ci(r.d1, r.d1_ci)} s")
        out.append(line + ".")
    return out


def lora_lines(summary: Summary | dict) -> list[str]:
    """Which configs trained LoRA adapters on a frozen base (their lr is the adapters')."""
    s = as_summary(summary)
    if not s.lora:
        return []
    cells = [f"{g} (rank {x['rank']}, alpha {fmt(x.get('alpha'))}, "
             f"{','.join(x.get('targets') or [])})" for g, x in sorted(s.lora.items())]
    n = len(s.configs)
    who = "every config" if len(cells) == n else f"{len(cells)} of {n} configs"
    return [f"LoRA: {who} trained adapters on a frozen base, their lr the adapters': "
            + "; ".join(cells) + "."]


def _seeds_per_lr(t: dict) -> int:
    return max((len(d) for d in t.get("per_seed") or []), default=1)


def _lr_curve(t: dict) -> str:
    """"score per lr: lr: score, ..." (one seed), or with the noise measured each lr's mean
    and the interval of best - lr."""
    if not t.get("noise_measured"):
        return "score per lr: " + ", ".join(f"{fmt(lr)}: {fmt(v)}"
                                            for lr, v in zip(t["grid"], t["scores"]))
    diff = {d["lr"]: d for d in t.get("diff_from_best") or []}
    cells = []
    for lr, v in zip(t["grid"], t["scores"]):
        d = diff.get(lr)
        if lr == t.get("best_mean_lr"):
            tail = "(best)"
        elif d is None or d.get("ci") is None:
            tail = "(failed)" if v is None else ""
        else:
            tail = (f"[{fmt(d['ci'][0], 2)}, {fmt(d['ci'][1], 2)}]"
                    + (" worse" if d.get("worse") else ""))
        cells.append(f"{fmt(lr)}: {fmt(v, 4)}" + (f" {tail}" if tail else ""))
    level = f"{100 * t.get('level', 0.9):.0f}%"
    return f"score per lr (mean, simultaneous {level} CI of best - lr): " + ", ".join(cells)


def lr_lines(summary: Summary | dict) -> list[str]:
    """One line per algorithm's lr tuning: the choice, its flat set and bracket (intervals
    when several seeds per lr measured the noise), or a WARNING when it is not bracketed."""
    s = as_summary(summary)
    by = s.lr_tuning_by_algo or ({s.primary_algo: s.lr_tuning} if s.lr_tuning else {})
    out = []
    for algo, t in sorted(by.items()):
        if not t or t.get("chosen") is None:
            continue
        curve, k = _lr_curve(t), _seeds_per_lr(t)
        lo, hi = t.get("bracket") or [None, None]
        if not t.get("noise_measured"):
            noise = f"{k} seed{'s' if k > 1 else ''} per lr: noise not measured"
            if t.get("bracketed"):
                out.append(f"Learning rate [{algo}]: base lr {fmt(t['chosen'])} tuned at the "
                           f"reference batch ({noise}), bracketed by worse values {fmt(lo)} "
                           f"and {fmt(hi)} ({curve}).")
            else:
                out.append(f"WARNING [{algo}]: the tuned base lr {fmt(t['chosen'])} is at the "
                           f"edge of the tuning grid ({noise}; {curve}), after "
                           f"{t.get('extensions', 0)} extensions: the optimum may lie outside "
                           "it, and batches scaled from it by the lr rule are confounded with "
                           "a mistuned lr.")
            continue
        f_lo, f_hi = t["flat"]
        if f_lo == f_hi:
            flat = f"{k} seeds per lr; no other lr within noise of the best mean"
        else:
            flat = (f"{k} seeds per lr; flat: {fmt(f_lo)}..{fmt(f_hi)} within noise, chosen by "
                    "rule: the middle of the flat set")
        if t.get("bracketed"):
            out.append(f"Learning rate [{algo}]: base lr {fmt(t['chosen'])} ({flat}), "
                       f"bracketed by significantly worse {fmt(lo)} and {fmt(hi)}; {curve}.")
        else:
            sides = " or ".join(e for e, b in (("below", lo), ("above", hi)) if b is None)
            out.append(f"WARNING [{algo}]: the tuned base lr {fmt(t['chosen'])} ({flat}) is "
                       f"not bracketed: no lr {sides} the best mean in the tuning grid is "
                       f"significantly worse, after {t.get('extensions', 0)} extensions "
                       f"({curve}): the optimum may lie outside the grid, and batches scaled "
                       "from it by the lr rule are confounded with a mistuned lr.")
    return out


def retune_lines(summary: Summary | dict) -> list[str]:
    """With the lr re-tuned at every batch (the source's recommendation): the lr each batch
    chose, what the sqrt rule from B0 gives there, and what the tuning cost against tuning at
    B0 alone."""
    s = as_summary(summary)
    out = []
    for algo, per in sorted((s.lr_tuning_per_batch or {}).items()):
        per = {int(B): t for B, t in per.items()}
        a = s.algos.get(algo)
        ref = s.configs.get(a.reference_config) if a else None
        B0 = ref.batch if ref else None
        lr0 = (per.get(int(B0)) or {}).get("chosen") if B0 else None
        cells = []
        for B, t in sorted(per.items()):
            cell = f"B={fmt(B)}: {fmt(t.get('chosen'))}"
            if not t.get("bracketed"):
                cell += " (edge of its grid)"
            if t.get("noise_measured") and t["flat"][0] != t["flat"][1]:
                cell += f" (flat {fmt(t['flat'][0])}..{fmt(t['flat'][1])})"
            if lr0 and B0 and B != B0:
                cell += f" (sqrt rule: {fmt(lr0 * (B / B0) ** 0.5)})"
            cells.append(cell)
        line = (f"Learning rate per batch [{algo}] (re-tuned at every batch, the source's "
                f"recommendation): " + "; ".join(cells))
        cost = {int(B): c for B, c in ((s.lr_tuning_cost or {}).get(algo) or {}).items()}
        if cost and B0 in cost:
            tot = {k: sum(c[k] for c in cost.values()) for k in ("runs", "responses", "wall_s")}
            line += (f". Tuning cost: {tot['runs']} runs, {fmt(tot['responses'])} responses, "
                     f"{fmt(tot['wall_s'] / 60)} min, against {cost[B0]['runs']} runs and "
                     f"{fmt(cost[B0]['wall_s'] / 60)} min at B0 alone")
        out.append(line + ".")
    return out


def power_lines(summary: Summary | dict) -> list[str]:
    """The smallest effect the design detects with 80% power, per algorithm."""
    s = as_summary(summary)
    out = []
    for algo, p in sorted((s.power or {}).items()):
        if not p or p.min_detectable_r_N is None:
            out.append(f"Power [{algo}]: unknown ({(p.reason if p else None) or 'no seed spread'}); "
                       "verdicts rest on the bootstrap alone.")
            continue
        pw = p.power_r_N or {}
        at = ", ".join(f"at {e}: {fmt(pw.get(e), 2)}" for e in ("1.15", "1.3", "1.5")
                       if pw.get(e) is not None)
        q = ""
        if p.pass_se is not None:
            q = (f"; r_q from the timing pass adds its error (SE of log r_q "
                 f"{fmt(p.pass_se, 2)}, {p.pass_df} df; from learning alone the "
                 f"design would detect r_N >= {fmt(p.min_detectable_r_N_learning_only)})")
        unit_note = " (each the mean of its seeds, the interaction included)" if p.units \
            else ""
        out.append(
            f"Power [{algo}]: with {p.seeds} {p.units or 'seeds'} per config and Holm over "
            f"{p.tests} "
            f"configs at family-wise error {fmt(p.alpha, 2)}, this design calls a config "
            f"slower with 80% power when its r_N >= {fmt(p.min_detectable_r_N)} at the "
            f"reference's throughput, and T/T0 >= {fmt(p.min_detectable_T_over_T0)} "
            f"(or <= {fmt(p.min_detectable_T_over_T0_below)}) (measured "
            f"spread of log N* between {p.units or 'seeds'}{unit_note}, eval "
            f"noise included: {fmt(p.sigma_log_N, 2)}, "
            f"{p.df} df{q}); power at r_N {at}." + _design_note(p) + _evals_note(p))
    return out


def warm_start_lines(summary: Summary | dict) -> list[str]:
    """What population the verdicts are about: the warm-starts, when the runs came from
    several (their interaction with the configs then in the error term), else the one."""
    s = as_summary(summary)
    out = []
    for algo, fam in sorted(((s.familywise or {}).get("families") or {}).items()):
        if fam.get("units") == "warm-starts":
            tau = fam.get("tau_log_N")
            t = (f"; warm-start x config interaction sd in log N* tau = {fmt(tau['tau'], 2)} "
                 f"[{fmt(tau['ci'][0], 2)}, {fmt(tau['ci'][1], 2)}], seed sd within a "
                 f"warm-start {fmt(tau['within_sd'], 2)}" if tau else
                 "; one seed per warm-start: tau and the seed noise form one error term")
            out.append(f"Warm-starts [{algo}]: {fam['warm_starts']} warm-starts, each a block "
                       f"of the test ({fam['df']} df): the verdicts are about the population "
                       f"of warm-starts{t}. {_block_targets(s, fam.get('reference'))}")
        else:
            out.append(f"Warm-starts [{algo}]: every run started from one warm-start, so the "
                       "verdicts hold for that warm-start: its interaction with the configs "
                       "is a fixed effect no seed count averages out. Runs from several "
                       "warm-starts (config.json init_checkpoint) are tested with the "
                       "warm-starts as blocks.")
    return out


def _block_targets(s: Summary, ref: str | None) -> str:
    """Each warm-start's own target (its reference runs' rule) and start score: the one
    target of the algorithm's line above pools warm-starts that start apart."""
    rows = {}
    for r in s.runs.values():
        if r.group == ref and r.block is not None:
            rows.setdefault(r.block, []).append((r.target, r.start_score))
    if not rows:
        return ""
    cells = [f"{b} {fmt(v[0][0])} (start {fmt(sum(x[1] for x in v) / len(v))})"
             for b, v in sorted(rows.items()) if v[0][0] is not None
             and all(x[1] is not None for x in v)]
    return "Targets per warm-start (each from its own reference runs): " + ", ".join(cells) \
        + "." if cells else ""


def _design_note(p) -> str:
    """What the measured spread asks of a design that detects r_N >= 1.3 ."""
    d = p.design_for_target or {}
    here, small = d.get("this_family") or {}, d.get("small_family") or {}
    if not here or (here.get("seeds") or 0) <= p.seeds and here.get("seeds"):
        return ""
    def cell(x):
        if not x.get("seeds"):
            return f"more than {MAX_SEEDS} seeds per config"
        return (f"{x['seeds']} seeds per config ({x['runs']} runs, "
                f"{fmt(x['runs_factor'], 2)}x this sweep's)")
    out = (f" To detect r_N >= {fmt(d['r_N'])} with 80% power at this spread it needs "
           f"{cell(here)}")
    if small:
        out += f", or {cell(small)} with the reference and {small['configs'] - 1} other configs"
    return out + " (`--seeds`; `--prompts` and the study's configs set the family)."


def _evals_note(p) -> str:
    """Whether N* was decided by evals (the analysis' power[algo]["evals_before_N_star"]):
    between two sparse evals N* comes from the monotone cubic's guess of the curve's bend."""
    e = p.evals_before_N_star
    if not e:
        return ""
    if not e["runs_below"]:
        return (f" N* decided by evals: every run has >= {e['needed']} evals before its N* "
                f"(fewest {e['min']}, median {fmt(e['median'])}).")
    return (f" Caution: {e['runs_below']} of {e['runs']} runs have fewer than {e['needed']} "
            f"evals before their N* (fewest {e['min']}, median {fmt(e['median'])}; "
            f"{', '.join(e['configs_below'])}), so their N* rests on the curve's shape between "
            "evals more than on evals, and r_N can lean toward 1 (its error on curves of known "
            "shape: results/n_star); evaluate more often (--eval_every_responses) or set the "
            "target later in the curve (--target_fraction) to decide N* by evals.")


def drift_lines(summary: Summary | dict) -> list[str]:
    s = as_summary(summary)
    d = s.drift
    if d is None or s.primary.reference_reached is False:   # no r_q to speak of
        return []
    line = f"Throughput: {d.note}"
    if d.controlled and d.max_disagreement:
        line += (f"; in-run and interleaved r_q differ by up to a factor "
                 f"{fmt(d.max_disagreement)}")
    if d.disagree:
        rows = d.configs
        line += ("; they disagree beyond their intervals (Welch test at "
                 f"{fmt(1 - s.ci_level, 2)}) for " + ", ".join(
                     f"{g} (in-run {fmt(rows[g].get('r_q_in_run'))}, pass "
                     f"{fmt_ci(rows[g].get('r_q_interleaved'), rows[g].get('r_q_interleaved_ci'))})"
                     for g in d.disagree) + ": the pass times the warm-start policy in "
                 "interleaved rounds, the runs time their own training")
    elif d.controlled and d.disagree is not None:
        line += "; they agree within their intervals for every config"
    return [line + "."]


SPENDING_NAMES = {"obf": "O'Brien-Fleming", "pocock": "Pocock"}


def sequential_lines(summary: Summary | dict) -> list[str]:
    """A sequential study's first lines: what it ran against the fixed design, and each
    config's decision with the look (and warm-starts) it came at and its repeated interval."""
    s = as_summary(summary)
    q = s.sequential
    if not q:
        return []
    plan, dec, ran = q["plan"], q["decisions"], q["runs"]
    W = plan["looks"][-1]
    seeds = {g: (s.configs[g].seeds or 0) for g in ran if g in s.configs}
    used = sum(seeds.values())
    ref_seeds = sum((st.seeds or 0) for g, st in s.configs.items() if st.is_reference)
    blocks = max(ran.values()) if ran else W
    per_block = {g: n / max(ran[g], 1) for g, n in seeds.items()}
    fixed = sum(per_block.values()) * W + ref_seeds / max(blocks, 1) * W
    out = [f"Sequential study ({SPENDING_NAMES.get(plan['spending'], plan['spending'])} "
           f"spending at level {fmt(plan['level'])}, looks after "
           f"{', '.join(map(str, plan['looks']))} warm-starts): it ran {blocks} of {W} "
           f"warm-starts and {used + ref_seeds} runs, against {fmt(fixed)} for the fixed "
           "design (every config from every warm-start)."]
    for g, d in sorted(dec.items()):
        rci = f" {fmt_ci(d['ratio'], d['rci'])}" if d.get("ratio") is not None else ""
        when = (f" at look {d['look']} ({d['blocks']} warm-starts)" if d.get("look")
                else f" after {ran.get(g, blocks)} warm-starts")
        out.append(f"{g}: {d['verdict']}{when}, T/T0{rci} (repeated interval).")
    return out


def design_lines(summary: Summary | dict) -> list[str]:
    """a sequential study's decisions, regime, lr bracket, power, drift: the lines the report
    opens with."""
    return (sequential_lines(summary) + regime_lines(summary) + lora_lines(summary)
            + lr_lines(summary)
            + retune_lines(summary) + power_lines(summary) + warm_start_lines(summary)
            + drift_lines(summary))
