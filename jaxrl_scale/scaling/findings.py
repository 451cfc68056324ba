"""The source's findings, decided as data (docs/api.md, Finding; docs/science.md, Time to
target).

Each finding is a `Finding` value: its id, status ("reproduced" / "not reproduced" /
"undetermined"), the claim, the test used, a one-line detail with the numbers, and the numbers
and intervals it rests on. The analysis stores them in summary.json; the report only renders
them. Tests decide from each comparison's own interval:

  * a difference is shown when the ratio's own interval excludes 1 (never from two intervals
    that do not overlap);
  * "alike" is an equivalence test: the ratio's interval lies inside [EQUIV_LO, EQUIV_HI]
    (never from two intervals that overlap: absence of evidence is not evidence);
  * "a larger batch reaches the target sooner" counts only batches above the reference's.

Pure numpy: no JAX.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import numpy as np

from jaxrl_scale.numbers import Interval, fmt, fmt_ci, is_number, or_none
from jaxrl_scale.scaling import stats

STATUSES = ("reproduced", "not reproduced", "undetermined")
EQUIV_LO, EQUIV_HI = 0.8, 1.25   # "alike": the ratio's interval inside this band

IDS = ("sqrt_lr_invariance", "fixed_lr_lags", "grad_norm_slope", "sublinear_collection",
       "equal_PG_alike", "larger_batch_faster")
CLAIMS = {
    "sqrt_lr_invariance": "sqrt-lr scaling keeps r_N near 1 over a range of batches",
    "fixed_lr_lags": "fixed lr lags sqrt lr at the same batch",
    "grad_norm_slope": "actor grad norm falls as B^-1/2, then flattens",
    "sublinear_collection": "collection time per step grows sublinearly in B (d0 > 0)",
    "equal_PG_alike": "equal P*G with different group sizes behave alike",
    "larger_batch_faster": "a larger batch reaches the target sooner (T/T0 < 1 at some B > B0)",
}


@dataclasses.dataclass(frozen=True)
class Finding:
    """One source finding, decided. ``numbers``: the comparisons it rests on, each a dict of
    plain numbers and [lo, hi] intervals; ``algo`` None for a hardware finding."""

    id: str
    status: str
    claim: str
    test: str
    detail: str
    algo: str | None = None
    numbers: tuple = ()

    def to_json(self) -> dict:
        return {"id": self.id, "status": self.status, "claim": self.claim, "test": self.test,
                "detail": self.detail, "algo": self.algo, "numbers": list(self.numbers)}

    @classmethod
    def from_json(cls, d: dict) -> "Finding":
        return cls(id=d["id"], status=d["status"], claim=d["claim"], test=d["test"],
                   detail=d.get("detail", ""), algo=d.get("algo"),
                   numbers=tuple(d.get("numbers") or ()))


def _ratio(st) -> float:   # st: summary.ConfigStats
    return st.gen_batch_ratio or 1


def _outcome(yes: int, no: int, undecided: int) -> str:
    """reproduced when every comparison supports it, not reproduced when every decided one
    contradicts it and none supports it, else undetermined."""
    if yes and not no and not undecided:
        return "reproduced"
    if no and not yes:
        return "not reproduced"
    return "undetermined"


def _ratio_ci(creps: dict, a: str, b: str, key: str, level: float) -> list:
    """Interval of the ratio a / b of the configs' bootstrap replicates of ``key``."""
    if a not in creps or b not in creps:
        return [None, None]
    lo, hi = stats.quantile_ci(stats.ratio(creps[a][key], creps[b][key]), level)
    return [or_none(lo), or_none(hi)]


# ----------------------------------------------------------------------------- per finding


class _Ctx:
    """What the findings of one algorithm read: its configs (sorted), reference, replicates."""

    def __init__(self, algo: str, info, configs: dict, creps: dict, level: float,
                 tolerance: float):
        self.algo, self.info, self.creps, self.level, self.tol = algo, info, creps, level, \
            tolerance
        self.ref_name = info.reference_config
        from jaxrl_scale.scaling.summary import ConfigStats   # summary imports Finding
        self.ref = configs.get(self.ref_name) or ConfigStats()
        self.ref_batch = self.ref.batch or 0
        self.reached = bool(info.reference_reached)
        self.items = sorted(((g, st) for g, st in configs.items() if (st.algo or "?") == algo),
                            key=lambda kv: (kv[1].batch or math.inf,
                                            kv[1].lr_rule or "", kv[0]))
        self.others = [(g, st) for g, st in self.items
                       if not st.is_reference and g != self.ref_name]


def sqrt_lr_invariance(c: _Ctx) -> tuple[str, str, str, list]:
    lim = 1 + c.tol
    test = (f"per sqrt-lr config above B0: r_N's {c.level:.0%} interval upper end <= {fmt(lim)}"
            f" (kept), lower end > {fmt(lim)} or not reached (sample cost)")
    if not c.reached:
        return "undetermined", test, "the reference did not reach J*, so no r_N", []
    sq = [(g, st) for g, st in c.others if st.lr_rule == "sqrt"
          and (st.batch or 0) > c.ref_batch and _ratio(st) == _ratio(c.ref)]
    if not sq:
        return "undetermined", test, "no sqrt-lr config at a batch above the reference's", []
    nums, aligned, cost, open_ = [], [], [], []
    for g, st in sq:
        iv = Interval.of(st.r_N_ci)
        d = f"B={fmt(st.batch)} r_N {fmt_ci(st.r_N, st.r_N_ci)}"
        if st.reached and is_number(iv.hi) and iv.hi <= lim:
            out = "kept"
            aligned.append((st.batch, d))
        elif st.reached and iv.above(lim):
            out = "cost"
            cost.append((st.batch, d))
        elif not st.reached:
            out = "not reached"
            cost.append((st.batch, f"B={fmt(st.batch)} not reached"))
        else:
            out = "open"
            open_.append((st.batch, d))
        nums.append({"config": g, "batch": st.batch, "reached": st.reached,
                     "r_N": st.r_N, "r_N_ci": st.r_N_ci, "outcome": out})
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
        return "reproduced", test, (f"sqrt lr keeps r_N within 1 + {c.tol:g} from "
                                    f"B={fmt(c.ref_batch)} up to B={fmt(top)} ({detail})"), nums
    if open_:
        return "undetermined", test, f"the intervals do not decide ({detail})", nums
    return "not reproduced", test, f"every larger sqrt-lr batch costs samples ({detail})", nums


def fixed_lr_lags(c: _Ctx) -> tuple[str, str, str, list]:
    test = (f"per batch with both rules: N*(fixed) / N*(sqrt), its own {c.level:.0%} bootstrap "
            "interval above 1 (lags) or below 1 (fixed needs fewer samples)")
    if not c.reached:
        return "undetermined", test, "the reference did not reach J*, so no r_N", []
    pairs = []
    for g, st in c.items:
        if st.lr_rule != "fixed" or st.batch == c.ref.batch:
            continue
        for h, sq in c.items:
            if (sq.lr_rule == "sqrt" and sq.batch == st.batch
                    and sq.group_size == st.group_size
                    and _ratio(sq) == _ratio(st)):
                pairs.append((g, st, h, sq))
    if not pairs:
        return "undetermined", test, ("no batch (other than the reference's, where both rules "
                                      "give the same lr) has both a fixed-lr and a sqrt-lr "
                                      "config"), []
    yes = no = und = 0
    det, nums = [], []
    for g, st, h, sq in pairs:
        ratio = or_none(st.N_star / sq.N_star) if st.reached and sq.reached \
            and is_number(st.N_star) and is_number(sq.N_star) else None
        ci = _ratio_ci(c.creps, g, h, "N", c.level)
        d = f"B={fmt(st.batch)}: N*(fixed) / N*(sqrt) = "
        if not st.reached and sq.reached:
            yes += 1
            out, d = "lags", d + "- (fixed not reached, sqrt reached: lags)"
        elif st.reached and not sq.reached:
            no += 1
            out, d = "fixed fewer", d + "- (fixed reaches, sqrt does not)"
        elif not st.reached:
            und += 1
            out, d = "neither reached", d + "- (neither reaches)"
        else:
            iv = Interval.of(ci)
            d += fmt_ci(ratio, ci)
            if iv.above(1.0):
                yes += 1
                out, d = "lags", d + " (above 1: lags)"
            elif iv.below(1.0):
                no += 1
                out, d = "fixed fewer", d + " (below 1: fixed needs fewer samples)"
            else:
                und += 1
                out, d = "undecided", d + " (the interval contains 1)"
        det.append(d)
        nums.append({"fixed_config": g, "sqrt_config": h, "batch": st.batch,
                     "N_ratio": ratio, "N_ratio_ci": ci, "outcome": out})
    status = _outcome(yes, no, 0)   # as the report had it: open pairs do not block
    if yes and no:
        det.append("(mixed)")
    return status, test, "; ".join(det), nums


def grad_norm_slope(c: _Ctx) -> tuple[str, str, str, list]:
    test = (f"log-log slope of the median actor grad norm vs B: its {c.level:.0%} interval "
            "contains -1/2")
    g = (c.info.grad_norm or {}).get("actor_grad_norm")
    if not g:
        return "undetermined", test, ("actor_grad_norm is not logged at 2+ batches of the "
                                      "reference's lr rule"), []
    ci = g.get("slope_ci")
    iv = Interval.of(ci)
    span = f"B={fmt(g['batches'][0])}..{fmt(g['batches'][-1])}, lr rule {g.get('lr_rule')}"
    flat = g.get("flattens_after")
    fl = (f"flattens after B={fmt(flat)} (local slope > {g.get('flat_threshold'):g})" if flat
          else f"no flattening within the grid (local slope stays <= {g.get('flat_threshold'):g})")
    s = f"log-log slope {fmt_ci(g.get('slope'), ci, 2)} over {span}; {fl}"
    nums = [{"slope": g.get("slope"), "slope_ci": ci, "flattens_after": flat,
             "batches": g["batches"]}]
    if iv.contains(-0.5):
        return "reproduced", test, s + "; the interval contains -1/2", nums
    if not is_number(iv.lo):
        return "undetermined", test, s + "; no interval", nums
    if flat and iv.below(0.0):
        return "undetermined", test, (s + "; the interval excludes -1/2, but the fit mixes the "
                                      "falling and the flat regime"), nums
    return "not reproduced", test, s + "; the interval excludes -1/2", nums


def _per_batch(configs: dict, key: str) -> tuple[list[float], list[float]]:
    """Config means of ``key`` per batch, synchronous rollout only."""
    by_b: dict[float, list[float]] = {}
    for st in configs.values():
        if is_number(st.batch) and is_number(getattr(st, key)) and getattr(st, key) > 0 \
                and _ratio(st) == 1:
            by_b.setdefault(st.batch, []).append(getattr(st, key))
    bs = sorted(by_b)
    return bs, [float(np.mean(by_b[b])) for b in bs]


def sublinear_collection(cgb, configs: dict, level: float) -> tuple[str, str, str, list]:
    """cgb: the primary algorithm's `records.CriticalGenerationBatch` (None: no fit)."""
    test = f"d0 of the fit t_gen = d0 + d1*B: its {level:.0%} interval above 0"
    if cgb is None:
        return "undetermined", test, ("no fit t_gen = d0 + d1*B (collection times at < 2 "
                                      "batches)"), []
    d0, ci = cgb.d0, cgb.d0_ci
    if not is_number(d0):
        return "undetermined", test, ("no fit t_gen = d0 + d1*B (collection times at < 2 "
                                      "batches)"), []
    iv = Interval.of(ci)
    nums = [{"d0": d0, "d0_ci": ci, "d1": cgb.d1, "d1_ci": cgb.d1_ci,
             "sync_batches": cgb.sync_batches}]
    if cgb.sync_batches < 2:
        return "undetermined", test, (f"synchronous collection times at < 2 batches (d0 = "
                                      f"{fmt_ci(d0, ci)} s comes from B_gen varied only "
                                      "through gen_batch_ratio, not from synchronous decode "
                                      "rounds)"), nums
    bs, coll = _per_batch(configs, "collection_s_per_step")
    growth = (f"; from B={fmt(bs[0])} to B={fmt(bs[-1])} ({bs[-1] / bs[0]:.3g}x responses) "
              f"collection time per step grows {coll[-1] / coll[0]:.3g}x" if len(bs) >= 2 else "")
    s = f"d0 = {fmt_ci(d0, ci)} s per step{growth}"
    if iv.above(0.0):
        return "reproduced", test, s + (" (d0 interval above 0: per-step collection time grows "
                                        "slower than B)"), nums
    if iv.below(0.0) or (is_number(iv.hi) and iv.hi <= 0):
        return "not reproduced", test, s + " (no fixed per-step cost)", nums
    return "undetermined", test, s + " (the d0 interval reaches 0)", nums


def equal_PG_alike(c: _Ctx) -> tuple[str, str, str, list]:
    test = (f"per pair with equal P*G: N*(a) / N*(b), its own {c.level:.0%} bootstrap interval "
            f"inside [{EQUIV_LO:g}, {EQUIV_HI:g}] (alike) or excluding 1 (differ)")
    by: dict[tuple, list] = {}
    for g, st in c.items:
        if st.group_size is not None and is_number(st.batch):
            by.setdefault((st.lr_rule, st.batch, _ratio(st)), []).append((g, st))
    pairs = []
    for _, xs in sorted(by.items(), key=lambda kv: (str(kv[0][0]), kv[0][1:])):
        for i in range(len(xs)):
            for j in range(i + 1, len(xs)):
                if xs[i][1].group_size != xs[j][1].group_size:
                    pairs.append((xs[i], xs[j]))
    if not pairs:
        return "undetermined", test, ("no two configs share algo, lr rule and P*G with "
                                      "different group sizes"), []
    if not c.reached:
        return "undetermined", test, "the reference did not reach J*, so no r_N", []
    yes = no = und = 0
    det, nums = [], []
    for (g, a), (h, b) in pairs:
        d = (f"B={fmt(a.batch)} lr {a.lr_rule}: G={a.group_size} vs "
             f"G={b.group_size}: N* ratio ")
        ratio = ci = None
        if not (a.reached and b.reached):
            und += 1
            out, d = "not both reached", d + "- (not both reached)"
        else:
            ratio = or_none(a.N_star / b.N_star) if b.N_star else None
            ci = _ratio_ci(c.creps, g, h, "N", c.level)
            iv = Interval.of(ci)
            d += fmt_ci(ratio, ci)
            if iv.inside(EQUIV_LO, EQUIV_HI):
                yes += 1
                out, d = "alike", d + f" (inside [{EQUIV_LO:g}, {EQUIV_HI:g}]: alike)"
            elif iv.excludes(1.0):
                no += 1
                out, d = "differ", d + " (excludes 1: differ)"
            else:
                und += 1
                out, d = "undecided", d + (f" (neither inside [{EQUIV_LO:g}, {EQUIV_HI:g}] "
                                           "nor excluding 1)")
        det.append(d)
        nums.append({"config_a": g, "config_b": h, "batch": a.batch,
                     "group_size_a": a.group_size, "group_size_b": b.group_size,
                     "N_ratio": ratio, "N_ratio_ci": ci, "outcome": out})
    if yes and no:
        det.append("(mixed)")
    return _outcome(yes, no, und), test, "; ".join(det), nums


def larger_batch_faster(c: _Ctx) -> tuple[str, str, str, list]:
    test = (f"configs at B > B0 = {fmt(c.ref_batch)}: verdict faster (T/T0's interval below "
            "1); the measured r_q bounds what a larger batch can gain")
    if not c.reached:
        return "undetermined", test, "the reference did not reach J*, so no T/T0", []
    larger = [(g, st) for g, st in c.others if (st.batch or 0) > c.ref_batch]
    nums = [{"config": g, "batch": st.batch, "T_over_T0": st.T_over_T0,
             "T_over_T0_ci": st.T_over_T0_ci, "r_N": st.r_N,
             "r_N_ci": st.r_N_ci, "r_q": st.r_q, "r_q_ci": st.r_q_ci,
             "verdict": st.verdict} for g, st in larger]
    cap = _cap_text(larger, c.info)
    if not larger:
        return "undetermined", test, (f"no config at a batch above the reference's "
                                      f"B0 = {fmt(c.ref_batch)}" + cap), nums
    fast = [(g, st) for g, st in larger if st.verdict == "faster"]
    if fast:
        return "reproduced", test, "faster: " + ", ".join(
            f"{g} T/T0 {fmt_ci(st.T_over_T0, st.T_over_T0_ci)}"
            for g, st in fast) + cap, nums
    maybe = [(g, st) for g, st in larger if st.verdict == "indistinguishable"
             and is_number(Interval.of(st.T_over_T0_ci).lo)
             and Interval.of(st.T_over_T0_ci).lo < 1]
    if maybe:
        return "undetermined", test, (
            "no larger batch is faster, but the interval of T/T0 reaches below 1 for "
            + ", ".join(f"{g} {fmt_ci(st.T_over_T0, st.T_over_T0_ci)}"
                        for g, st in maybe) + cap), nums
    return "not reproduced", test, ("no batch above B0 has T/T0 < 1 (all slower, not reached "
                                    "or at 1)" + cap), nums


def _cap_text(larger: list, info) -> str:
    """The r_q cap from the measured r_q of the batches above B0 (not from a fitted line whose
    intercept may be negative), and the update's share of a step at B0: measured (the regime
    line's median over the reference's runs), else from the fits."""
    meas = [(st.r_q, g, st) for g, st in larger if is_number(st.r_q)]
    if not meas:
        s = "; no measured r_q above B0"
    else:
        rq, g, st = max(meas, key=lambda m: m[0])
        s = (f"; the largest measured r_q above B0 is {fmt_ci(rq, st.r_q_ci)} ({g}), "
             "so a larger batch is faster only where r_N is below it")
    cgb, regime = info.critical_generation_batch, info.regime
    tf = (cgb.train_fit if cgb is not None else None) or {}
    share = regime.update_share if regime is not None else None
    if not is_number(share):
        share = tf.get("update_share_at_reference")
    if is_number(share):
        s += (f" (the update takes {share:.0%} of a step at the reference batch"
              + (": on this hardware the update, not generation, dominates each step"
                 if share > 0.5 else "") + ")")
    return s


PER_ALGO: dict[str, Callable[[_Ctx], tuple]] = {
    "sqrt_lr_invariance": sqrt_lr_invariance,
    "fixed_lr_lags": fixed_lr_lags,
    "grad_norm_slope": grad_norm_slope,
    "equal_PG_alike": equal_PG_alike,
    "larger_batch_faster": larger_batch_faster,
}


def source_findings(algos: dict, configs: dict, creps: dict, level: float, tolerance: float,
                    primary: str, cgb) -> list[Finding]:
    """Every finding in the order of `IDS` (algos: {algo: `summary.AlgoSummary`}; configs:
    {config: `summary.ConfigStats`}; cgb: the primary algorithm's
    `records.CriticalGenerationBatch`): per algorithm (primary first) where it is about
    learning, once for the hardware finding (sublinear collection, the primary algo's fit)."""
    order = sorted(algos, key=lambda a: (a != primary, a))
    ctx = {a: _Ctx(a, algos[a], configs, creps, level, tolerance) for a in order}
    out = []
    for fid in IDS:
        if fid == "sublinear_collection":
            status, test, detail, nums = sublinear_collection(cgb, configs, level)
            out.append(Finding(fid, status, CLAIMS[fid], test, detail, None, tuple(nums)))
            continue
        for a in order:
            status, test, detail, nums = PER_ALGO[fid](ctx[a])
            out.append(Finding(fid, status, CLAIMS[fid], test, detail, a, tuple(nums)))
    return out


def by_id(findings: list[Finding], fid: str, algo: str | None = None) -> Finding:
    """The finding ``fid`` (of ``algo`` when it is per algorithm)."""
    for f in findings:
        if f.id == fid and (algo is None or f.algo in (algo, None)):
            return f
    raise KeyError((fid, algo))


def as_findings(xs: Any) -> list[Finding]:
    return [x if isinstance(x, Finding) else Finding.from_json(x) for x in xs or ()]
