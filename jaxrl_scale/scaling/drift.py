"""Throughput that machine drift cannot fake. Pure numpy.

In-run q comes from each run's own step times, and a sweep runs each config's seeds back to
back: a slow spell of a shared machine lands on one config and moves its r_q. A timing pass
(`experiment.timing.time_batches`: every batch stepped once per round, in a random order per
round) sees the same machine states for every batch, so its per-round ratios cancel the drift.

Why blocks. Rounds of one pass are not independent replicates of the pass: four passes of the
recorded default study, each with 8 rounds, gave r_q at B = 64 of 0.76-0.89 while each pass's
per-round interval was about +-7%. What a rerun changes (the process, the build of each Run,
the minutes of the machine) is shared by all rounds of a pass. So the pass runs in blocks, each
building every Run afresh at a later time, and r_q's interval is the between-block one: the
mean over blocks of each block's mean paired log ratio, with the spread of those block means
(Student t, blocks - 1 df). That spread includes everything a fresh build and a later minute
change, and the within-block noise. A pass recorded without blocks falls back to rounds as the
units (said so in the summary: the between-pass spread is then not measured).

`interleaved_r_q` turns a pass into r_q per config that the T/T0 tests use; the in-run r_q
stays as a cross-check, and where the two disagree beyond their intervals the summary names
the configs (`disagreements`). Without a pass (logs alone), the summary says that machine
drift is not controlled.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Mapping, Sequence

import numpy as np

from jaxrl_scale.scaling.values import TIMING_PASS, Ratio

TIMING_FILE = "timing.json"
NOT_CONTROLLED = ("machine drift is not controlled: r_q comes from in-run step times, and each "
                  "config's seeds ran back to back, so a slow spell of the machine can land on "
                  "one config (no interleaved timing pass recorded)")


@dataclasses.dataclass(frozen=True)
class PassRatio:
    """log r_q of one config from a timing pass: per-unit values (blocks, or rounds of a pass
    recorded without blocks), their mean, SE and df; `units` is aligned across the configs of
    one pass (unit i of every config saw the same block), so differences pair."""
    units: np.ndarray
    unit: str           # "block" or "round"

    @property
    def log(self) -> float:
        return float(np.mean(self.units))

    @property
    def df(self) -> int:
        return int(self.units.size - 1)

    @property
    def se(self) -> float:
        if self.units.size < 2:
            return math.nan
        return float(np.std(self.units, ddof=1) / math.sqrt(self.units.size))


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


def _blocks(e: dict, n: int) -> np.ndarray:
    b = e.get("block")
    return np.asarray(b, int)[:n] if b is not None and len(b) >= n else np.zeros(n, int)


def pass_ratio(e: dict, e0: dict) -> PassRatio:
    """log(q / q0) per unit from two entries of one pass (rounds aligned by position): the
    mean over each block's rounds when the pass has >= 2 blocks, else each round."""
    s, s0 = _per_step(e), _per_step(e0)
    r = min(s.size, s0.size)
    d = np.log(e["batch"] / s[:r]) - np.log(e0["batch"] / s0[:r])
    blk = _blocks(e, r)
    ok = np.isfinite(d)
    d, blk = d[ok], blk[ok]
    ids = np.unique(blk)
    if ids.size >= 2:
        return PassRatio(np.array([d[blk == i].mean() for i in ids]), "block")
    return PassRatio(d, "round")


def half_width(units: np.ndarray, level: float) -> float:
    """Half-width of the t interval at `level` of the mean of `units` (inf below 2 units)."""
    from jaxrl_scale.scaling.familywise import t_ppf
    p = PassRatio(np.asarray(units, float), "block")
    return t_ppf(1 - (1 - level) / 2, p.df) * p.se if p.df > 0 and p.se > 0 else math.inf


def blocks_to_stop(units: np.ndarray, min_blocks: int, tolerance: float, level: float) -> int:
    """The pass's stopping rule on per-block log r_q units [configs, blocks] (the blocks run so
    far, or all `max` of a simulation): the first n >= min_blocks at which every config's
    half-width over its first n blocks is <= tolerance, else all of them."""
    units = np.atleast_2d(units)
    for n in range(min_blocks, units.shape[1] + 1):
        if all(half_width(u[:n], level) <= tolerance for u in units):
            return n
    return units.shape[1]


def half_widths(entries: Sequence[dict], reference_batch: int, level: float) -> dict[int, float]:
    """{batch: half-width of log r_q's interval at `level`} against the entry of
    `reference_batch`: what the pass's stopping rule looks at (`experiment.timing`)."""
    e0 = next((e for e in entries if e["batch"] == reference_batch), None)
    return {int(e["batch"]): half_width(pass_ratio(e, e0).units, level)
            for e in entries if e0 is not None and e is not e0}


def interleaved_r_q(timing: Sequence[dict] | None, configs: dict, refs: Mapping, level: float,
                    in_run: Mapping[str, float | None] | None = None,
                    same_entry: bool = False) -> tuple[dict, dict[str, PassRatio]]:
    """(summary "drift" dict, {config: PassRatio} for `familywise.sweep_tests`).

    refs: {algo: (reference config, runs)} as in the analysis; in_run: {config: r_q from the
    runs' own step times} (the cross-check). A config is matched to the pass's entry of its
    batch (and gen_batch_ratio, preferring its group size). A config matched to the
    reference's own entry (the same batch, k and G: another loss or advantage at B0) has r_q
    1 exactly, units of zeros; with ``same_entry`` (a warm-start's own pass, where only the
    per-block log r_q is used) it is returned too, else left to its runs' own r_q."""
    in_run = in_run or {}
    if not timing:
        return {"controlled": False, "r_q_source": "in-run step times", "note": NOT_CONTROLLED,
                "configs": {}}, {}
    from jaxrl_scale.scaling.familywise import t_ppf
    out, offsets, units = {}, {}, set()
    # the pass times one rollout round per update: a refilled config's r_q (retained
    # responses per second, its refill rounds' time included) is its runs' own
    refilled = sorted(g for g, st in configs.items() if st.get("refill"))
    for algo, (ref, _) in refs.items():
        if ref not in configs or ref in refilled:
            continue
        e0 = _match(timing, configs[ref])
        if e0 is None:
            continue
        for g, st in configs.items():
            if (st["algo"] or "?") != algo or g == ref or g in refilled:
                continue
            if st.get("batch_schedule"):   # no one batch: the pass along its trajectory
                from jaxrl_scale.scaling.schedule_plan import pass_ratio_along
                p = pass_ratio_along(timing, st, e0)
            else:
                e = _match(timing, st)
                p = None if e is None else pass_ratio(e, e0)
            if p is None:
                continue
            if not p.units.size or not math.isfinite(p.log):
                continue
            if same_entry and not st.get("batch_schedule") and _match(timing, st) is e0:
                offsets[g] = p
                out[g] = {"r_q_interleaved": 1.0, "units": int(p.units.size), "unit": p.unit,
                          "r_q_in_run": in_run.get(g)}
                continue
            row = {"r_q_interleaved": math.exp(p.log), "units": int(p.units.size),
                   "unit": p.unit, "r_q_in_run": in_run.get(g)}
            if p.df > 0 and p.se > 0:
                c = t_ppf(1 - (1 - level) / 2, p.df)
                row["r_q_interleaved_ci"] = [math.exp(p.log - c * p.se),
                                             math.exp(p.log + c * p.se)]
                offsets[g] = p
                units.add(p.unit)
            if in_run.get(g):
                row["in_run_over_interleaved"] = in_run[g] / math.exp(p.log)
            out[g] = row
    dis = [abs(math.log(x["in_run_over_interleaved"])) for x in out.values()
           if x.get("in_run_over_interleaved")]
    note = NOT_CONTROLLED
    if offsets:
        note = ("r_q (and so T/T0) from the interleaved timing pass; in-run r_q kept as a "
                "cross-check")
        if units == {"round"}:
            note += ("; this pass has no blocks, so its interval is over rounds and does not "
                     "include the spread between passes")
        else:
            note += ("; r_q's interval is between blocks (each a fresh build at a later "
                     "time), so it includes the spread between passes")
    if offsets and refilled:
        note += (f"; {', '.join(refilled)} keep in-run r_q: the pass times one rollout round "
                 "per update, not the refill rounds of dynamic sampling")
    load = pass_load(timing)
    if offsets and load and load["loaded"]:
        note += (f"; CAUTION: the machine was loaded during the pass (1-minute load average "
                 f"{load['median']:.1f} on {load['cpus']} cores, median over blocks): r_q then "
                 "measures a shared machine, and moves with what else runs (results/"
                 "timing_passes); time it on a machine of its own")
    return {"controlled": bool(offsets),
            "r_q_source": "interleaved timing pass" if offsets else "in-run step times",
            "note": note, "unit": sorted(units)[0] if len(units) == 1 else None,
            "load": load,
            "max_disagreement": math.exp(max(dis)) if dis else None,
            "configs": out}, offsets


# Load average per core above which the pass shared its machine. Measured on 2 cores: the
# main job's pass alone 0.77 per core (median over blocks, results/sweep_default), with one
# busy loop beside it 1.45 (results/sweep_default/reruns/74eee37_busy); 1.5 missed the latter.
LOADED = 1.1


def pass_load(timing: Sequence[dict]) -> dict | None:
    """{"median", "max", "cpus", "loaded"} of the pass's 1-minute load averages (recorded
    after each block by `experiment.timing.time_blocks`); None for a pass without them. The
    pass alone keeps the load below one per core, so "loaded" means more than LOADED x
    cores: another job shared the machine."""
    e = next((x for x in timing if x.get("load_1min")), None)
    if e is None or not e.get("cpus"):
        return None
    x = np.asarray(e["load_1min"], float)
    med = float(np.median(x))
    return {"median": med, "max": float(x.max()), "cpus": int(e["cpus"]),
            "loaded": bool(med > LOADED * e["cpus"])}


def disagreements(in_run: Mapping[str, dict], offsets: Mapping[str, PassRatio]
                  ) -> dict[str, float]:
    """{config: p} of the two-sided Welch test of log(in-run r_q) - log(pass r_q), for the
    configs with both (in_run: {config: {"log_ratio", "se", "df"}}, the seed-paired t test
    of in-run log q)."""
    from jaxrl_scale.scaling.familywise import t_sf
    out = {}
    for g, p in offsets.items():
        t = in_run.get(g) or {}
        if not (t.get("se") and t.get("df") and p.df > 0):
            continue
        diff, se = t["log_ratio"] - p.log, math.sqrt(t["se"] ** 2 + p.se ** 2)
        den = t["se"] ** 4 / t["df"] + p.se ** 4 / p.df
        df = se ** 4 / den if den > 0 else t["df"]
        out[g] = float(min(1.0, 2 * t_sf(abs(diff) / se, df))) if se > 0 else math.nan
    return out


def with_disagreements(drift: dict, in_run: Mapping[str, dict],
                       offsets: Mapping[str, PassRatio], level: float) -> dict:
    """The drift record with each config's in-run vs pass test (in_run_vs_pass_p,
    in_run_vs_pass_disagree: p < 1 - level) and "disagree", the configs whose two r_q differ
    beyond their intervals (`disagreements`)."""
    pv = disagreements(in_run, offsets)
    rows = {g: ({**row, "in_run_vs_pass_p": pv[g], "in_run_vs_pass_disagree": bool(
        pv[g] < 1 - level)} if g in pv else row) for g, row in drift["configs"].items()}
    return {**drift, "configs": rows,
            "disagree": sorted(g for g, p in pv.items() if p < 1 - level)}


def pass_ratios(drift: dict, offsets: Mapping[str, PassRatio]) -> dict[str, Ratio]:
    """{config: the timing pass's r_q as a `values.Ratio`} where the pass gives an interval;
    T/T0's test used the same pass (`familywise.sweep_tests`)."""
    out = {}
    for g, p in offsets.items():
        row = drift["configs"].get(g) or {}
        if row.get("r_q_interleaved_ci") is not None:
            out[g] = Ratio(row["r_q_interleaved"], row["r_q_interleaved_ci"], TIMING_PASS,
                           log_ratio=p.log, se=p.se, df=p.df)
    return out
