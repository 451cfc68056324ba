"""Leave-one-study-out validation of the planner's link (docs/science.md, The planner): for
each recorded study, the link is fitted on the other studies of its algorithm (PPO: on every
other study), the study's own probe (its reference runs) predicts r_N at its tested batches,
and the prediction meets what the study measured. r_q comes from the study's timing pass (its
summary's r_q and interval, drawn log-normal, widened by the spread between passes in
different machine states): the planner's own timing pass measures the same thing, so r_q is
not what is validated here, and T/T0 = r_N / r_q is validated through r_N. Beside it, the same with the
unfitted link B_crit = B_simple. Counts carry 90% Wilson intervals (over configs, which share a
study: optimistic; over studies). Run from the repository root:

    python results/planner_validation/loso.py [--held_out=NAME:DIR ...]
"""
import json
import math
import sys

import numpy as np
from scipy import stats as sps

from jaxrl_scale.numbers import fmt, fmt_ci
from jaxrl_scale.scaling import noise as snoise
from jaxrl_scale.scaling import planner, planner_link, stats

sys.path.insert(0, "results/planner_validation")
from fit_link import STUDIES, points  # noqa: E402

LEVEL = 0.9
# rms difference of log r_q between two timing passes of one study in different machine
# states (results/calibration/warm_starts.py, STATE): how far the planner's own pass may land
# from the study's
STATE = 0.045


def measured(path, algo, batches):
    with open(f"{path}/summary.json") as f:
        s = json.load(f)
    by_b = {}
    for g, c in s["configs"].items():
        if c.get("algo") == algo and float(c["batch"]) in batches and not c.get("is_reference"):
            by_b.setdefault(float(c["batch"]), c)
    return by_b


def predict(p, link, path, seed=0):
    """Rows for the candidates B0 + tested batches: predicted r_N, r_q, T/T0 with intervals,
    and the measured values; and the recommendation of planner.recommend."""
    meas = measured(path, p.algo, set(p.batches))
    cand = [p.batch0] + sorted(p.batches)
    bc, bc_R = planner_link.b_crit_draws(p.b_simple, p.b_simple_R, link, seed)
    b_C = np.array(cand)
    rng = np.random.default_rng(seed + 1)
    R = bc_R.size
    with np.errstate(invalid="ignore", divide="ignore"):
        rn_RC = np.asarray(snoise.predicted_r_n(b_C[None, :], p.batch0,
                                                np.maximum(bc_R, 1e-12)[:, None]), float)
        rn_C = np.asarray(snoise.predicted_r_n(b_C, p.batch0, max(bc, 1e-12)), float)
    rq_RC, rq_C = np.ones((R, b_C.size)), np.ones(b_C.size)
    for c, b in enumerate(cand[1:], start=1):
        m = meas[b]
        lo, hi = m["r_q_ci"]
        se = (math.log(hi) - math.log(lo)) / (2 * sps.norm.ppf(0.5 + LEVEL / 2))
        rq_C[c] = m["r_q"]
        rq_RC[:, c] = m["r_q"] * np.exp(math.hypot(se, STATE) * rng.standard_normal(R))
    t_RC = rn_RC / rq_RC
    rows = []
    for c, b in enumerate(cand):
        row = {"batch": b, "r_N": float(rn_C[c]), "r_N_ci": stats.quantile_ci(rn_RC[:, c], LEVEL),
               "T_over_T0": float(rn_C[c] / rq_C[c]),
               "T_over_T0_ci": stats.quantile_ci(t_RC[:, c], LEVEL)}
        if c:
            row.update(meas_r_N=meas[b]["r_N"], meas_T=meas[b]["T_over_T0"])
        else:
            row.update(meas_r_N=1.0, meas_T=1.0)
        rows.append(row)
    rec = planner.recommend(rows, t_RC, LEVEL)
    fastest = min(rows, key=lambda r: r["meas_T"] if r["meas_T"] is not None else math.inf
                  )["batch"]
    return rows, rec, fastest


def best_set_batches(path, algo):
    """The batches of the study's measured fastest set (Hsu's MCB, summary.json)."""
    with open(f"{path}/summary.json") as f:
        s = json.load(f)
    names = ((s.get("algos") or {}).get(algo) or {}).get("best_set") or s.get("best_set") or []
    return {float(s["configs"][g]["batch"]) for g in names if g in s["configs"]}


def wilson(k: int, n: int) -> str:
    """k/n with its 90% Wilson interval."""
    ci = sps.binomtest(k, n).proportion_ci(confidence_level=LEVEL, method="wilson")
    return f"{k}/{n} [{ci.low:.2f}, {ci.high:.2f}]"


def inside(x, ci):
    return ci[0] <= x <= ci[1]


def main(extra):
    pts = points()
    held = list(pts)
    if extra:
        more = {k: v for k, v in (e.split(":", 1) for e in extra)}
        new = points(more)
        held = new
        paths = {**STUDIES, **more}
    else:
        paths = STUDIES
    summary = {"fitted": [], "simple": []}
    print("| held-out study | algo | link (fitted without it) | B | r_N pred | r_N meas | "
          "T/T0 pred | T/T0 meas | recommended set | measured fastest |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for p in held:
        train = [q for q in pts if q.study != p.study and (q.algo == p.algo or p.algo != "grpo")]
        train = [q for q in train if q.algo == "grpo"] if p.algo == "grpo" else train
        for kind, link in (("fitted", planner_link.fit_link(train, p.algo)),
                           ("simple", planner_link.IDENTITY)):
            rows, rec, fastest = predict(p, link, paths[p.study])
            ok = [r for r in rows[1:] if r["meas_T"] is not None]
            cov = [inside(r["meas_T"], r["T_over_T0_ci"]) for r in ok]
            cov_n = [inside(r["meas_r_N"], r["r_N_ci"]) for r in ok]
            err = [abs(math.log(r["T_over_T0"] / r["meas_T"])) for r in ok]
            hit = fastest in rec["batches"]
            out_of_set = [r["batch"] for r in rows if r["batch"] not in rec["batches"]]
            best = best_set_batches(paths[p.study], p.algo)
            summary[kind].append(dict(study=p.study, algo=p.algo, cov_T=cov, cov_N=cov_n,
                                      err=err, hit=hit, set=rec["batches"], ruled_out=out_of_set,
                                      wrongly=[b for b in out_of_set if b in best]))
            if kind == "fitted":
                for i, r in enumerate(rows[1:]):
                    print(f"| {p.study if i == 0 else ''} | {p.algo if i == 0 else ''} | "
                          f"{('a = %.2f, sd %.2f, n %d' % (math.exp(link.mu), link.sd, link.n)) if i == 0 else ''} | "
                          f"{r['batch']:,.0f} | {fmt_ci(r['r_N'], r['r_N_ci'])} | {fmt(r['meas_r_N'])} | "
                          f"{fmt_ci(r['T_over_T0'], r['T_over_T0_ci'])} | {fmt(r['meas_T'])} | "
                          f"{', '.join(f'{b:.0f}' for b in rec['batches']) if i == 0 else ''} | "
                          f"{f'{fastest:.0f}' if i == 0 else ''} |")
    print()
    for kind, rs in summary.items():
        covT = [x for r in rs for x in r["cov_T"]]
        covN = [x for r in rs for x in r["cov_N"]]
        err = [x for r in rs for x in r["err"]]
        hits = [r["hit"] for r in rs]
        studies_T = [all(r["cov_T"]) for r in rs]
        print(f"- link {kind}: T/T0 covered {wilson(sum(covT), len(covT))} of configs, every "
              f"config of the study in {wilson(sum(studies_T), len(studies_T))} studies; r_N "
              f"covered {wilson(sum(covN), len(covN))}; median |log(pred/meas)| of T/T0 "
              f"{np.median(err):.3f}; recommended set holds the measured fastest in "
              f"{wilson(sum(hits), len(hits))} studies; "
              f"set sizes {[len(r['set']) for r in rs]}; batches ruled out "
              f"{sum(len(r['ruled_out']) for r in rs)}, of them in the study's measured "
              f"fastest set {sum(len(r['wrongly']) for r in rs)}")


if __name__ == "__main__":
    main([a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--held_out=")])
