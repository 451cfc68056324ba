"""Throughput that machine drift cannot fake (issue 27, item 5). Pure numpy.

In-run q comes from each run's own step times, and a sweep runs each config's seeds back to
back: a slow spell of a shared machine lands on one config and moves its r_q. An interleaved
timing pass (`experiment.timing.time_batches`: every batch stepped once per round, in
alternating order) sees the same machine states for every batch, so its per-round ratios
cancel the drift. `interleaved_r_q` turns such a pass into r_q per config (paired over
rounds, Student t over rounds) that the T/T0 tests prefer; the in-run r_q stays as a
cross-check, and their disagreement is reported. Without a pass (logs alone), the summary says
that machine drift is not controlled.
"""

from __future__ import annotations

import json
import math
import os
from typing import Mapping, Sequence

import numpy as np

TIMING_FILE = "timing.json"
NOT_CONTROLLED = ("machine drift is not controlled: r_q comes from in-run step times, and each "
                  "config's seeds ran back to back, so a slow spell of the machine can land on "
                  "one config (no interleaved timing pass recorded)")


def read_timing(sweep_dir: str | None) -> list[dict] | None:
    """The entries of SWEEP_DIR/timing.json (a list, or {"entries": [...]}), else None."""
    if not sweep_dir:
        return None
    path = os.path.join(sweep_dir, TIMING_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        data = json.load(f)
    return data.get("entries") if isinstance(data, dict) else data


def _match(entries: Sequence[dict], st: dict) -> dict | None:
    k = st.get("gen_batch_ratio") or 1
    entries = [e for e in entries if e.get("algo") in (None, st.get("algo"))]
    same = [e for e in entries if e.get("batch") == st.get("batch")
            and (e.get("gen_batch_ratio") or 1) == k]
    g = [e for e in same if e.get("group_size") == st.get("group_size")]
    return (g or same or [None])[0]


def _per_step(e: dict) -> np.ndarray:
    s = e.get("step_s")
    if not s:
        s = np.add(e.get("gen_s") or [], e.get("train_s") or [])
    return np.asarray(s, float)


def paired_log_ratio(steps: np.ndarray, batch: float, steps0: np.ndarray, batch0: float
                     ) -> tuple[float, float, int]:
    """(mean over rounds of log(q / q0), its SE, df) from per-round step seconds."""
    r = min(steps.size, steps0.size)
    d = np.log(batch / steps[:r]) - np.log(batch0 / steps0[:r])
    d = d[np.isfinite(d)]
    if d.size < 2:
        return (float(d.mean()) if d.size else math.nan), math.nan, 0
    return float(d.mean()), float(d.std(ddof=1) / math.sqrt(d.size)), d.size - 1


def interleaved_r_q(timing: Sequence[dict] | None, configs: dict, refs: Mapping, level: float
                    ) -> tuple[dict, dict]:
    """(summary "drift" dict, {config: (log r_q, se, df)} for `familywise.sweep_tests`).

    refs: {algo: (reference config, runs)} as in the analysis. A config is matched to the
    pass's entry of its batch (and gen_batch_ratio, preferring its group size)."""
    if not timing:
        return {"controlled": False, "r_q_source": "in-run step times", "note": NOT_CONTROLLED,
                "configs": {}}, {}
    from jaxrl_scale.scaling.familywise import t_ppf
    out, offsets = {}, {}
    for algo, (ref, _) in refs.items():
        if ref not in configs:
            continue
        e0 = _match(timing, configs[ref])
        if e0 is None:
            continue
        for g, st in configs.items():
            if (st["algo"] or "?") != algo or g == ref:
                continue
            e = _match(timing, st)
            if e is None:
                continue
            lr, se, df = paired_log_ratio(_per_step(e), e["batch"], _per_step(e0), e0["batch"])
            if not math.isfinite(lr):
                continue
            row = {"r_q_interleaved": math.exp(lr), "rounds": df + 1,
                   "r_q_in_run": st.get("r_q")}
            if df > 0 and se > 0:
                c = t_ppf(1 - (1 - level) / 2, df)
                row["r_q_interleaved_ci"] = [math.exp(lr - c * se), math.exp(lr + c * se)]
                offsets[g] = (lr, se, df)
            if st.get("r_q"):
                row["in_run_over_interleaved"] = st["r_q"] / math.exp(lr)
            out[g] = row
    dis = [abs(math.log(x["in_run_over_interleaved"])) for x in out.values()
           if x.get("in_run_over_interleaved")]
    return {"controlled": bool(offsets),
            "r_q_source": "interleaved timing pass" if offsets else "in-run step times",
            "note": ("r_q (and so T/T0) from the interleaved timing pass; in-run r_q kept as "
                     "a cross-check" if offsets else NOT_CONTROLLED),
            "max_disagreement": math.exp(max(dis)) if dis else None,
            "configs": out}, offsets


def use_interleaved_r_q(configs: dict, drift: dict, offsets: Mapping) -> None:
    """Where T/T0 took r_q from the interleaved pass (`offsets`), the config's r_q and r_q_ci
    become that pass's too, so that T/T0 = r_N / r_q holds in every row of the report; the
    in-run r_q (seed-paired t) stays as r_q_in_run and r_q_in_run_ci, the cross-check."""
    for g in offsets:
        row, st = drift["configs"].get(g) or {}, configs.get(g)
        if st is None or row.get("r_q_interleaved_ci") is None:
            continue
        st["r_q_in_run"], st["r_q_in_run_ci"] = st.get("r_q"), st.get("r_q_ci")
        st["r_q"], st["r_q_ci"] = row["r_q_interleaved"], row["r_q_interleaved_ci"]
