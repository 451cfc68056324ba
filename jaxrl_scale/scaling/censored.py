"""The family-wise test of configs some of whose runs did not reach the target, on lower
bounds (docs/science.md, Family-wise verdicts). Pure numpy."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from jaxrl_scale.scaling.familywise import _values, _with_pass, contrast, t_test


def censored_tests(configs: dict, per_run: dict, algo: str, pool: list[str], ref: str,
                    by_block: bool, var: dict, vals: dict, offsets: Mapping[str, Any],
                    block_offsets, level: float, fields: dict, tt_ref: dict
                    ) -> list[tuple[str, float]]:
    """The family's tests of configs some of whose runs did not reach the target (the
    reference did). Such a run's N* counts at the budget it ran, and its T at the time it
    ran: lower bounds, so the contrast of log T is a lower bound of the true one while its SE
    (the pooled sigma of the configs that reached, and the pass's r_q) does not depend on
    them. Rejecting "not slower" on the bounds is then a valid, conservative "slower";
    anything else stays "not reached". Fills fields/tt_ref; returns [(config, p)]."""
    out = []
    for g, st in configs.items():
        if (st["algo"] or "?") != algo or g in pool or st.get("is_reference"):
            continue
        xs = [per_run[r] for r in st["runs"]]
        if not xs or any(x.N_star is None and not x.censored_at for x in xs):
            continue
        one = {k: _values(configs, per_run, g, k, by_block) for k in ("N", "T")}
        if block_offsets:
            if not all(g in block_offsets.get(w, {}) for w in one["N"]):
                continue
            one["T"] = {w: y - block_offsets[w][g].log for w, y in one["N"].items()}
        key = "N" if g in offsets and not block_offsets else "T"
        v = var[key]
        if v["df"] <= 0 or not all(np.isfinite(y) for y in one[key].values()) or (
                v["paired"] and not set(v["seeds"]) <= set(one[key])):
            continue
        est, se = contrast({**vals[key], g: one[key]}, g, ref, v)
        df = v["df"]
        if key == "N":     # the one pass's r_q: log T = log N* - log r_q
            est, se, df = _with_pass((est, se), df, offsets[g].units)
        t = {**t_test(est, se, df, level), "method": ("paired t" if v["paired"] else
                                                      "pooled t")
             + " on lower bounds (a run that did not reach counts at its budget)"}
        fields[g] = {"T_over_T0": t, "lower_bound": True}
        tt_ref[g] = ref
        out.append((g, t["p"]))
    return out
