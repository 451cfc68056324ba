"""The report's markdown tables: per config and per run, each number with its interval."""

from __future__ import annotations

import math

from jaxrl_scale.numbers import fmt, fmt_ci
from jaxrl_scale.scaling.summary import ConfigStats, Summary, as_summary
from jaxrl_scale.report.base import (Q_HEAD, _algo_info, _algo_of, _is_ref, _multi, _ok,
                                     _sorted_configs, n_unit)


def _table_verdict(s: Summary, g: str, st: ConfigStats) -> str:
    if _is_ref(s, g, st):
        return "reference"
    if not _algo_info(s, _algo_of(st)).reference_reached:
        return "n/a (reference missed J*)"
    return (st.verdict or "-") + (" (fragile)" if st.fragile else "")


def format_table(summary, per_run: bool = False) -> str:
    """Markdown table per config (seeds reached/total, B, lr rule, N*, q, r_N, r_q, T/T0 with
    intervals, verdict, share of updates whose grad norm was clipped, actor B_simple), or per
    run; from a `Summary` or summary.json's dict."""
    summary = as_summary(summary)
    multi = _multi(summary)
    a_col = "algo | " if multi else ""
    lines = []
    # With a timing pass, the configs' r_q and T/T0 are the pass's; q and every per-run
    # ratio are the runs' own steps: the headers say which is which.
    passed = any(st.ratios.r_q_pass is not None for st in summary.configs.values())
    in_run = " (in run)" if passed else ""
    q_unit = Q_HEAD[n_unit(summary)]
    if per_run:
        lines.append(f"| run | {a_col}seed | B | lr rule | reached | N* | q ({q_unit}) | r_N | "
                     f"r_q{in_run} | T/T0{in_run} | max score | clipped updates |")
        lines.append("|" + "---|" * (12 + multi))
        items = sorted(summary.runs.items(),
                       key=lambda kv: (kv[1].algo or "", kv[1].batch or math.inf,
                                       kv[0]))
        for name, x in items:
            a = f"{x.algo or '-'} | " if multi else ""
            lines.append(
                f"| {name}{' (ref)' if x.is_reference else ''} | {a}"
                f"{x.seed if x.seed is not None else '-'} | {fmt(x.batch)} | "
                f"{x.lr_rule or '-'} | {'yes' if x.reached else 'no'} | "
                f"{fmt_ci(x.N_star, x.N_star_ci)} | "
                f"{fmt_ci(x.q, x.q_ci)} | {fmt(x.r_N)} | "
                f"{fmt(x.r_q)} | {fmt(x.T_over_T0)} | {fmt(x.max_score)} | "
                f"{fmt(x.clipped_update_fraction)} |")
        return "\n".join(lines)
    q_head, rq_head = (f"q in run ({q_unit})", "r_q (timing pass)") if passed else \
        (f"q ({q_unit})", "r_q")
    lines.append(f"| config | {a_col}seeds reached | B | lr rule | N* | {q_head} | r_N | "
                 f"{rq_head} | T/T0 | verdict | clipped updates | B_simple (actor) |")
    lines.append("|" + "---|" * (12 + multi))
    for g, st in _sorted_configs(summary):
        a = f"{_algo_of(st)} | " if multi else ""
        bs = st.actor_b_simple
        rng = st.actor_b_simple_range
        bs_txt = fmt(bs)
        if _ok(bs) and rng and st.seeds > 1 and rng[0] != rng[1]:
            bs_txt += f" ({fmt(rng[0])}..{fmt(rng[1])})"
        ref = " (ref)" if _is_ref(summary, g, st) else ""
        n_txt = (fmt_ci(st.N_star, st.N_star_ci) if st.reached
                 else "not reached")
        if st.refill:   # r_q from the runs themselves (their refill rounds included)
            n_txt += " refill"
        lines.append(
            f"| {g}{ref} | {a}{st.seeds_reached}/{st.seeds} | "
            f"{_batch_text(st)} | {st.lr_rule or '-'} | "
            f"{n_txt} | "
            f"{fmt_ci(st.q, st.q_ci)} | {fmt_ci(st.r_N, st.r_N_ci)} | "
            f"{fmt_ci(st.r_q, st.r_q_ci)} | "
            f"{fmt_ci(st.T_over_T0, st.T_over_T0_ci)} | "
            f"{_table_verdict(summary, g, st)} | {fmt(st.clipped_update_fraction)} | "
            f"{bs_txt} |")
    if any(st.batch_schedule for _, st in _sorted_configs(summary)):
        lines.append("\nB of a scheduled config (--batch_schedule): from its first batch to the "
                     "largest it trained at before N*, pooled over seeds (batch_trajectory.png "
                     "shows each run).")
    if any(st.refill for _, st in _sorted_configs(summary)):
        lines.append("\nrefill: dynamic sampling (--refill). N* counts retained responses, as "
                     "everywhere; the refill rounds' generation time is in q, and r_q is the "
                     "runs' own.")
    return "\n".join(lines)


def _batch_text(st) -> str:
    """B of a config; a scheduled config's first..largest batch before N*, with its kind."""
    if not st.batch_schedule:
        return fmt(st.batch)
    top = max((float(b) for b in (st.batch_fractions or {})), default=None)
    span = fmt(st.batch_start) + (f"..{fmt(top)}" if top and top != st.batch_start else "")
    return f"{span} ({st.batch_schedule})"
