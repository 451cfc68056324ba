"""The report's markdown tables: per config and per run, each number with its interval."""

from __future__ import annotations

import math

from jaxrl_scale.numbers import fmt, fmt_ci
from jaxrl_scale.report.base import (_algo_info, _algo_of, _is_ref, _multi, _ok, _sorted_configs)


def _table_verdict(summary: dict, g: str, st: dict) -> str:
    if _is_ref(summary, g, st):
        return "reference"
    if not _algo_info(summary, _algo_of(st)).get("reference_reached",
                                                 summary.get("reference_reached")):
        return "n/a (reference missed J*)"
    return st.get("verdict") or "-"


def format_table(summary: dict, per_run: bool = False) -> str:
    """Markdown table per config (seeds reached/total, B, lr rule, N*, q, r_N, r_q, T/T0 with
    intervals, verdict, share of updates whose grad norm was clipped, actor B_simple), or per run."""
    multi = _multi(summary)
    a_col = "algo | " if multi else ""
    lines = []
    if per_run:
        lines.append(f"| run | {a_col}seed | B | lr rule | reached | N* | q (resp/s) | r_N | r_q "
                     "| T/T0 | max score | clipped updates |")
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
                f"{fmt(x.get('clipped_update_fraction'))} |")
        return "\n".join(lines)
    lines.append(f"| config | {a_col}seeds reached | B | lr rule | N* | q (resp/s) | r_N | r_q | "
                 "T/T0 | verdict | clipped updates | B_simple (actor) |")
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
            f"{_table_verdict(summary, g, st)} | {fmt(st.get('clipped_update_fraction'))} | "
            f"{bs_txt} |")
    return "\n".join(lines)
