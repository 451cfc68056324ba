"""Per config: the seed statistics and bootstrap ratios of a sweep's configs, the typed
`summary.ConfigStats` each is built into once (with its family-wise test and the timing
pass's r_q), and the critical training batch read from them (docs/science.md, Time to
target, Intervals and Critical batches). Numpy only, no JAX."""

from __future__ import annotations

import collections
import math
import re

import numpy as np

from jaxrl_scale.numbers import is_number, or_none
from jaxrl_scale.scaling import stats
from jaxrl_scale.scaling.io import Run, batch_from_config, scheduled
from jaxrl_scale.scaling.references import _group_size
from jaxrl_scale.scaling.schedule_plan import batch_fractions
from jaxrl_scale.scaling.summary import ConfigStats
from jaxrl_scale.scaling.values import BOOTSTRAP, NAMES, ConfigRatios, Ratio
from jaxrl_scale.scaling.verdicts import interval as _ci
from jaxrl_scale.scaling.verdicts import verdict as _verdict


# A config's name: <algo>_P<P>_G<G>_<rule>[_sched-<kind>][_u<u>][_e<E>][_k<k>], a run's adds
# _s<seed>. Every tag only where it differs from the default (no schedule, u = E = k = 1), so
# a study that adds an axis resumes from its old runs. The schedule tag comes right after
# the rule: stripping _k (scaling.io.strip_ratio) still names the synchronous twin, and _u /
# _e / _k keep the places scaling.io's patterns look for; P is the batch the schedule starts
# at.
SCHEDULE_TAG = "_sched-"
_NAME_RE = re.compile(r"^(?P<algo>[a-z0-9]+)_P(?P<P>\d+)_G(?P<G>\d+)_(?P<rule>[a-z]+)"
                      r"(?:_sched-(?P<schedule>[a-z]+))?(?:_u(?P<u>\d+))?(?:_e(?P<E>\d+))?"
                      r"(?:_k(?P<k>\d+))?(?:_s(?P<seed>\d+))?$")


def format_config_name(algo: str, P: int, G: int, rule: str, schedule: str = "none",
                       u: int = 1, E: int = 1, k: int = 1, seed: int | None = None) -> str:
    """The name of a config (seed None) or of one of its runs; `parse_config_name` reads it
    back. experiment/study.py's run_name writes the same names."""
    tag = (f"{SCHEDULE_TAG}{schedule}" if schedule not in ("", "none") else "") + (
        f"_u{u}" if u != 1 else "") + (f"_e{E}" if E != 1 else "") + (f"_k{k}" if k != 1 else "")
    return f"{algo}_P{P}_G{G}_{rule}{tag}" + ("" if seed is None else f"_s{seed}")


def parse_config_name(name: str) -> dict | None:
    """`format_config_name`'s arguments from a name it wrote ({"algo", "P", "G", "rule",
    "schedule", "u", "E", "k", "seed"}; schedule "none", u = E = k = 1 and seed None where
    the name has no tag); None for a name of another form."""
    m = _NAME_RE.match(name)
    if m is None:
        return None
    d = m.groupdict()
    return {"algo": d["algo"], "P": int(d["P"]), "G": int(d["G"]), "rule": d["rule"],
            "schedule": d["schedule"] or "none", "u": int(d["u"] or 1), "E": int(d["E"] or 1),
            "k": int(d["k"] or 1), "seed": None if d["seed"] is None else int(d["seed"])}


def _config_reps(names: list[str], reps: dict, rng) -> tuple[np.ndarray, np.ndarray]:
    """Replicates of the config's mean N* and mean q over its K seeds: seeds resampled with
    replacement (the same draws for both), each contributing its own replicate b."""
    N = np.stack([reps[n]["N"] for n in names])
    Q = np.stack([reps[n]["q"] for n in names])
    K, B = N.shape
    if K == 1:
        return N[0], Q[0]
    pick = rng.integers(0, K, size=(B, K))
    cols = np.arange(B)[:, None]
    return N[pick, cols].mean(axis=1), Q[pick, cols].mean(axis=1)


def config_stats(groups: dict[str, list[Run]], per_run: dict, reps: dict, refs: dict,
                 rng, level: float) -> tuple[dict, dict, dict]:
    """Per config: (seeds, N*, q with intervals and the bootstrap verdict; the bootstrap
    replicates; {config: {"r_N", "r_q", "T_over_T0": `values.Ratio`}} from the seed
    bootstrap against the config's reference)."""
    out, creps, boot = {}, {}, {}
    for g, rs in groups.items():
        names = [r.name for r in rs]
        xs = [per_run[n] for n in names]
        n_reached = sum(bool(x["reached"]) for x in xs)
        all_reached = n_reached == len(xs)
        N_b, q_b = _config_reps(names, reps, rng)
        N = float(np.mean([x["N_star"] for x in xs])) if all_reached else math.inf
        q = float(np.mean([x["q"] for x in xs if is_number(x["q"])])) if any(
            is_number(x["q"]) for x in xs) else math.nan
        creps[g] = {"N": N_b, "q": q_b, "T": stats.ratio(N_b, q_b)}
        st = {"algo": rs[0].algo, "batch": rs[0].batch, "batch_gen": rs[0].batch_gen,
              "gen_batch_ratio": rs[0].gen_batch_ratio, "lr_rule": rs[0].lr_rule,
              "group_size": _group_size(rs[0]),
              "seeds": len(xs), "seeds_reached": n_reached, "runs": names,
              "reached": all_reached, "N_star": or_none(N), "N_star_ci": _ci(N_b, level),
              "q": or_none(q), "q_ci": _ci(q_b, level),
              "T": or_none(N / q) if all_reached and q > 0 else None,
              "N_star_reached_mean": or_none(np.mean([x["N_star"] for x in xs
                                                       if x["reached"]])) if n_reached else None}
        if any(r.refill for r in rs):
            st["refill"] = True
        kind = scheduled(rs[0].config)
        if kind:   # its batch is a trajectory: the shares the timing pass integrates over
            st.update(batch_schedule=kind, batch_start=batch_from_config(rs[0].config),
                      batch_fractions=batch_fractions(
                          [r.train for r in rs], [x["N_star"] if x["reached"] else None
                                                  for x in xs]))
        for k in ("N_star", "q"):
            vals = [x[k] for x in xs if x["reached"] and is_number(x[k])]
            st[k + "_std"] = float(np.std(vals)) if len(vals) > 1 else None
        out[g] = st
    for algo, (ref_name, ref_runs) in refs.items():
        rg = ref_runs[0].group or ref_runs[0].name
        if ref_name in out:
            rst, rrep = out[ref_name], creps[ref_name]
        else:  # a single run as reference
            x = per_run[ref_name]
            rst = {"N_star": x["N_star"], "q": x["q"], "reached": x["reached"]}
            rrep = {"N": reps[ref_name]["N"], "q": reps[ref_name]["q"]}
        ref_ok = bool(rst["reached"])
        for g, st in out.items():
            if (st["algo"] or "?") != algo:
                continue
            st["reference"] = ref_name
            st["is_reference"] = g == ref_name or (g == rg and len(ref_runs) == len(st["runs"]))
            if not ref_ok:
                boot[g] = {k: Ratio(None, [None, None], BOOTSTRAP) for k in NAMES}
                st["verdict"] = "not reached"
                continue
            cr = creps[g]
            same = st["is_reference"]
            rn_b = np.ones_like(cr["N"]) if same else stats.ratio(cr["N"], rrep["N"])
            rq_b = np.ones_like(cr["q"]) if same else stats.ratio(cr["q"], rrep["q"])
            tt_b = stats.ratio(rn_b, rq_b)
            r_n = st["N_star"] / rst["N_star"] if st["reached"] and rst["N_star"] else None
            r_q = st["q"] / rst["q"] if is_number(st["q"]) and rst["q"] else None
            boot[g] = {"r_N": Ratio(or_none(r_n), _ci(rn_b, level), BOOTSTRAP),
                       "r_q": Ratio(or_none(r_q), _ci(rq_b, level), BOOTSTRAP),
                       "T_over_T0": Ratio(or_none(r_n / r_q) if is_number(r_n) and is_number(
                           r_q) else None, _ci(tt_b, level), BOOTSTRAP)}
            st["verdict"] = _verdict(st["reached"], boot[g]["T_over_T0"].ci)
            if st["batch"] and rst.get("batch"):
                st["updates_ratio"] = or_none(r_n * rst["batch"] / st["batch"]) if is_number(
                    r_n) else None
            creps[g]["r_N"] = rn_b
    return out, creps, boot


def compose_configs(configs: dict, boot: dict, tests: dict, passes: dict
                    ) -> dict[str, ConfigStats]:
    """Each config's ConfigStats, built once from the stages' own values: its seed statistics
    and bootstrap verdict (`config_stats`), its bootstrap ratios (``boot``), its family-wise
    test (``tests``: `values.FamilyTest`; its verdict is the config's, the bootstrap one
    stays as verdict_per_config) and the timing pass's r_q (``passes``: `values.Ratio`)."""
    out = {}
    for g, st in configs.items():
        f = tests.get(g)
        extra = {**f.fields(), "verdict_per_config": st.get("verdict")} if f else {}
        out[g] = ConfigStats(**{**st, **extra}, ratios=ConfigRatios(
            boot=boot.get(g, {}), t=f.ratios if f else {}, r_q_pass=passes.get(g)))
    return out


def single_run_reference(x: dict, run: Run) -> ConfigStats:
    """The reference as a ConfigStats when it is a single run, not a config."""
    return ConfigStats(algo=run.algo, lr_rule=run.lr_rule, batch=run.batch,
                       gen_batch_ratio=x.get("gen_batch_ratio"), reached=x["reached"],
                       N_star=x["N_star"], N_star_ci=x.get("N_star_ci"))


def critical_training_batch(configs: dict[str, ConfigStats], ref: ConfigStats,
                            tolerance: float) -> dict:
    """Largest B above the reference's B0 such that every measured B0 < B' <= B (reference's
    algo and lr rule) has the upper end of r_N's interval <= 1 + tolerance (None when the
    first batch above B0 fails: B0 itself passes by construction, r_N = 1, and says nothing);
    and the smallest B > B0 where a sample cost is detected (lower end > 1 + tolerance, or the
    target not reached within a budget that already exceeds (1 + tolerance) x N0*). Configs
    with the reference's gen_batch_ratio."""
    algo, rule, k = ref.algo, ref.lr_rule, ref.gen_batch_ratio
    # The reference's rollout only: partial rollout changes learning per response (stale
    # tokens), and is compared with its synchronous twin in `partial_rollout` instead.
    pts = sorted(((st.batch, g, st) for g, st in configs.items()
                  if st.algo == algo and st.lr_rule == rule and st.batch
                  and st.gen_batch_ratio == k),
                 key=lambda p: (p[0], p[1]))
    by_b: dict[float, list] = collections.defaultdict(list)
    for b, g, st in pts:
        by_b[b].append((g, st))
    ok_upto, detected = None, None
    lim = 1 + tolerance
    chain = True
    b0 = ref.batch or 0
    for b in sorted(by_b):
        if b <= b0:
            continue
        oks = []
        for g, st in by_b[b]:
            lo, hi = st.r_N_ci or [None, None]
            oks.append(bool(st.reached and hi is not None and hi <= lim))
            if detected is None and st.reached and lo is not None and lo > lim:
                detected = b
            if (detected is None and not st.reached and ref.N_star
                    and (st.responses_min or 0) > lim * ref.N_star_ci[1]):
                detected = b
        chain = chain and all(oks)
        if chain:
            ok_upto = b
    return {"batch": ok_upto, "cost_detected_at": detected, "tolerance": tolerance,
            "lr_rule": rule, "algo": algo, "above_batch": b0 or None,
            "points": [{"config": g, "batch": b, "r_N": st.r_N,
                        "r_N_ci": st.r_N_ci, "reached": st.reached}
                       for b, g, st in pts]}
