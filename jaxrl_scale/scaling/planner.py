"""Batch-size planner: predict time to target at candidate batches from one probe run at the
reference batch B0 and a step-time fit, before running the sweep (docs/science.md, The
planner).

    r_N(B) = (1 + B/B_crit) / (1 + B0/B_crit),   B_crit ~ B_simple      (McCandlish)
    q(B)   = B / (t_gen(k B) / k + t_train(B)),  r_q(B) = q(B) / q(B0)
    t_gen(B_gen) = d0 + d1 B_gen,  t_train(B) = overhead + gamma B
    T/T0   = r_N / r_q

k = gen_batch_ratio (B_gen = k B_train; an update's collection is about 1/k of one generation
round with k B in flight, as in `step_cost.gen_seconds`). B_simple comes from the gradient-norm
fields the probe's training records carry (docs/api.md, Gradient-norm fields), over the updates
around the reference's N* (`noise.n_star_window`), with a moving-block bootstrap; the step-time
fit comes with a bootstrap of its four parameters. Replicate i of each is paired into one joint
draw (the two sources are independent), so every interval below propagates both.

Recommendation: the batch with the smallest predicted T/T0 (point prediction); its range is
every candidate not shown slower than it: B is in when the lower end of the ci_level interval of
the paired replicate ratio [T/T0](B) / [T/T0](B_best) is <= 1. Pairing matters: the B_simple
uncertainty moves all batches together, so comparing marginal intervals would call almost
everything indistinguishable.

Letters: U updates, R bootstrap replicates, C candidate batches. Numpy only (no JAX).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Sequence

import numpy as np

from jaxrl_scale.numbers import fmt_ci, is_number
from jaxrl_scale.scaling import io as sio
from jaxrl_scale.scaling import noise as snoise
from jaxrl_scale.scaling import planner_link
from jaxrl_scale.scaling.plan_compare import (  # noqa: F401  (the planner's API)
    METRICS, compare, compare_counts, format_compare, recommendation_check)
from jaxrl_scale.scaling import stats
from jaxrl_scale.scaling import step_cost
from jaxrl_scale.scaling.step_cost import PlanError  # noqa: F401  (raised here too)
from jaxrl_scale.scaling.io import Run

NETWORKS = ("actor", "critic")
RANGE_RULE = ("B is in the range when the lower end of the ci_level interval of the paired "
              "bootstrap ratio [T/T0](B) / [T/T0](B_best) is <= 1 (not shown slower than the "
              "batch with the smallest predicted T/T0)")




# ---------------------------------------------------------------------------------------------
# Throughput: timing entries -> (d0, d1, gamma, overhead) with a bootstrap -> r_q.


def timings_from_runs(runs: Sequence[Run], warmup: int = 2, steps: int = 3) -> list[dict]:
    """Timing-pass entries (the format of `experiment.timing.time_batches`) from runs' own
    step-time records: per run, the ``gen_s`` / ``train_s`` of updates warmup+1 ..
    warmup+steps (``steps`` = 0: every update after the warmup), pooled over the runs that
    share a batch. Stands in for a timing pass on the same hardware: the first updates of a
    run are what a pass of a few timed steps would see (the first one also compiles)."""
    by_batch: dict[float, dict] = {}
    for run in runs:
        if not run.batch:
            continue
        recs = sorted((r for r in run.train
                       if is_number(r.get("gen_s")) and is_number(r.get("train_s"))),
                      key=lambda r: r.get("step", 0))
        recs = recs[warmup:warmup + steps] if steps else recs[warmup:]
        if not recs:
            continue
        e = by_batch.setdefault(float(run.batch), {
            "batch": float(run.batch), "batch_gen": float(run.batch_gen or run.batch),
            "gen_s": [], "train_s": [], "runs": []})
        e["gen_s"] += [float(r["gen_s"]) for r in recs]
        e["train_s"] += [float(r["train_s"]) for r in recs]
        e["runs"].append(run.name)
    return [by_batch[b] for b in sorted(by_batch)]


def like_probe(runs: Sequence[Run], probe: Run) -> tuple[list[Run], str]:
    """The runs a timing pass of the probe's config would time: same algo, gen_batch_ratio and
    group size G (B varies through the prompts per update; a different G at equal B changes the
    step time, e.g. sequence lengths per prompt). Returns (runs, what was matched)."""
    g = sio.config_get(probe.config, "group_size", "G")
    keep = [r for r in runs if r.algo == probe.algo and r.gen_batch_ratio == probe.gen_batch_ratio
            and sio.config_get(r.config, "group_size", "G") == g]
    return keep, f"algo={probe.algo}, k={probe.gen_batch_ratio:g}, G={g}"


# ---------------------------------------------------------------------------------------------
# Noise scale of the probe.


def probe_n_star(runs: Sequence[Run], target: float) -> float:
    """Mean over the probe runs of N* (docs/science.md, The planner): the first crossing of
    ``target`` by the isotonic (monotone) fit of each run's eval curve, so one lucky eval does
    not set it."""
    vals = []
    for run in runs:
        n, s = run.eval_curve()
        if n.size:
            x = stats.first_crossing(n, stats.isotonic(s), target)
            if math.isfinite(x):
                vals.append(x)
    if not vals:
        raise PlanError("target", f"no probe run reaches J* = {target:g} (best eval score "
                        f"{max((max(run.eval_curve()[1], default=-math.inf) for run in runs)):g})",
                        "lower --target, or pass --n_star (responses) directly")
    return float(np.mean(vals))


def probe_noise(runs: Sequence[Run], who: str = "actor", n_star: float | None = None,
                half_width: float = 0.5, n_windows: int = 8, n_boot: int = 1000,
                block: int | None = None, level: float = stats.CI_LEVEL, seed: int = 0
                ) -> dict | None:
    """B_simple of one network over the probe runs' updates (pooled): in the N* window when
    ``n_star`` is given (the estimate the prediction uses), over the whole run, and its
    trajectory over training. None when no record carries the network's norm fields."""
    est = snoise.pooled_estimates(runs, who)
    if est["g2_U"].size == 0:
        return None
    boot = dict(n_boot=n_boot, block=block, level=level)
    whole = snoise.bootstrap_b_simple(est["g2_U"], est["trace_U"], est["run_U"], seed=seed,
                                      **boot)
    out = {"network": who, "b_small": float(np.median(est["b_small_U"])),
           "b_big": float(np.median(est["b_big_U"])),
           "whole_run": whole,
           "trajectory": snoise.noise_scale_trajectory(est, n_windows, seed=seed + 1, **boot)}
    if n_star is not None:
        lo, hi = snoise.n_star_window(n_star, half_width)
        win = snoise.noise_scale_window(est, lo, hi, seed=seed + 2, **boot)
        if win["n_updates"] < 2:
            raise PlanError("n_star", f"only {win['n_updates']} probe update(s) have responses in "
                            f"the N* window [{lo:g}, {hi:g}]", "pass an N* inside the probe "
                            "run, or widen --window")
        win.update(n_star=float(n_star), half_width=float(half_width))
        out["window"] = win
    else:
        out["window"] = dict(whole, n_star=None, half_width=None,
                             responses_lo=float(np.nanmin(est["responses_U"])),
                             responses_hi=float(np.nanmax(est["responses_U"])))
    return out


# ---------------------------------------------------------------------------------------------
# Prediction and recommendation.


def _pair(reps: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` replicates: as they are when there are n, else drawn with replacement."""
    reps = np.asarray(reps)
    return reps if reps.shape[0] == n else reps[rng.integers(0, reps.shape[0], n)]


def predict(batches: Sequence[float], batch0: float, b_crit: float, b_crit_R, theta_4,
            theta_R4, gen_batch_ratio: float = 1, level: float = stats.CI_LEVEL,
            seed: int = 0, external: step_cost.ExternalTime | None = None
            ) -> tuple[list[dict], dict]:
    """Point predictions and intervals of r_N, r_q, T/T0 at each candidate batch.

    b_crit_R [R] and theta_R4 [R', 4] are bootstrap replicates (R' != R: resampled to R); +inf
    B_crit (no detectable mean gradient) gives r_N = 1. Returns (rows, replicates) with
    replicates {"r_N_RC", "r_q_RC", "T_RC"} for `recommend`.
    """
    b_C = np.asarray(batches, float)
    # tr(Sigma) <= 0 (no detectable noise) means B_crit -> 0: r_N -> B / B0, perfect cost
    b_crit = max(float(b_crit), 1e-12)
    bc_R = np.maximum(np.asarray(b_crit_R, float), 1e-12)
    th_R4 = _pair(np.asarray(theta_R4, float).reshape(-1, 4), bc_R.size,
                  np.random.default_rng(seed))
    r_n = np.asarray(snoise.predicted_r_n(b_C, batch0, b_crit), float) * np.ones_like(b_C)
    r_q = step_cost.r_q(theta_4, b_C, batch0, gen_batch_ratio, external=external)
    with np.errstate(invalid="ignore"):
        r_n_RC = np.asarray(snoise.predicted_r_n(b_C[None, :], batch0, bc_R[:, None]), float)
        r_q_RC = step_cost.r_q(th_R4, b_C, batch0, gen_batch_ratio, external=external)
        t_RC = r_n_RC / r_q_RC
    rows = []
    for c, b in enumerate(b_C):
        rows.append({"batch": float(b), "r_N": float(r_n[c]),
                     "r_N_ci": stats.quantile_ci(r_n_RC[:, c], level),
                     "r_q": float(r_q[c]), "r_q_ci": stats.quantile_ci(r_q_RC[:, c], level),
                     "T_over_T0": float(r_n[c] / r_q[c]),
                     "T_over_T0_ci": stats.quantile_ci(t_RC[:, c], level)})
    return rows, {"r_N_RC": r_n_RC, "r_q_RC": r_q_RC, "T_RC": t_RC}


def recommend(rows: list[dict], t_RC: np.ndarray, level: float = stats.CI_LEVEL) -> dict:
    """The recommended batch (smallest predicted T/T0) and the range of candidates not shown
    slower than it (`RANGE_RULE`), with each one's paired ratio interval."""
    t_C = np.array([r["T_over_T0"] for r in rows], float)
    if not np.any(np.isfinite(t_C)):
        raise PlanError("batches", "no candidate batch has a defined prediction (step-time fit "
                        "gives t <= 0 everywhere)", "check the timings or the candidate batches")
    best = int(np.nanargmin(t_C))
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio_RC = t_RC / t_RC[:, best:best + 1]
    keep = []
    for c, row in enumerate(rows):
        ci = stats.quantile_ci(ratio_RC[:, c], level)
        row["vs_best_ci"] = ci
        row["in_range"] = bool(c == best or (math.isfinite(ci[0]) and ci[0] <= 1.0))
        if row["in_range"]:
            keep.append(row["batch"])
    return {"batch": rows[best]["batch"], "T_over_T0": rows[best]["T_over_T0"],
            "range": [min(keep), max(keep)], "batches": keep, "rule": RANGE_RULE}


def _separation(batches, b0, w, link, theta, theta_R4, k, level, seed, rec, t_RC,
                external=None) -> dict:
    """Per candidate in the recommended set but the best: `planner_link.separation` of its log
    T/T0 ratio to the best, each error source varied alone (the probe's B_simple bootstrap, the
    link's predictive draws, the step-time fit's bootstrap)."""
    point_bc = w["b_simple"] / math.exp(link.mu)
    _, bc_link = planner_link.b_crit_draws(w["b_simple"], np.full(len(w["reps"]),
                                                                  w["b_simple"]), link, seed)
    sources = {"probe": (np.asarray(w["reps"], float) / math.exp(link.mu), theta[None, :]),
               "link": (bc_link, theta[None, :]),
               "pass": (np.full(len(theta_R4), point_bc), theta_R4)}
    t_C = {}
    for name, (bc_R, th_R4) in sources.items():
        _, r = predict(batches, b0, point_bc, bc_R, theta, th_R4, k, level, seed, external)
        t_C[name] = np.log(r["T_RC"])
    rows, _ = predict(batches, b0, point_bc, [point_bc], theta, theta[None, :], k, level, seed,
                      external)
    best = batches.index(rec["batch"])
    out = {}
    for c, b in enumerate(batches):
        if b == rec["batch"] or b not in rec["batches"]:
            continue
        parts = {name: t[:, c] - t[:, best] for name, t in t_C.items()}
        with np.errstate(divide="ignore", invalid="ignore"):
            parts["joint"] = np.log(t_RC[:, c] / t_RC[:, best])
        parts["point"] = math.log(rows[c]["T_over_T0"] / rows[best]["T_over_T0"])
        out[f"{b:g}"] = planner_link.separation(parts, level)
    return out


def default_batches(batch0: float) -> list[float]:
    """B0/4 .. 8 B0 in doublings."""
    return [batch0 * 2.0 ** e for e in range(-2, 4)]


def _probe_batch(runs: Sequence[Run]) -> float:
    bs = sorted({r.batch for r in runs if r.batch})
    if len(bs) != 1:
        raise PlanError("probe_run", f"the probe runs must share one batch (B0), got "
                        f"{bs or 'none'}", "pass the seeds of one config (config.json with "
                        "batch_train or prompts_per_step x group_size)")
    return float(bs[0])


def _no_norms(runs: Sequence[Run], who: str) -> PlanError:
    return PlanError("probe_run", f"no training record of {runs[0].path or runs[0].name} carries "
                     f"{who}_grad_sqnorm_micro (>= 2 micro-batches) and {who}_grad_sqnorm",
                     "train the probe with --micro_batches=2 or more "
                     "(docs/api.md, Gradient-norm fields)")


def check_probe(runs: Sequence[Run], who: str = "actor", n_star: float | None = None,
                target: float | None = None) -> float:
    """PlanError for probe runs `batch_plan` cannot use (no runs, no shared batch B0, no
    gradient-norm fields of network `who`, a target no run reaches), read from the records
    alone, so a command refuses them before its throughput source (a timing pass) runs.
    Returns B0."""
    if not runs:
        raise PlanError("probe_run", "no probe run", "pass --probe_run=RUN_DIR")
    if who not in NETWORKS:
        raise PlanError("noise_of", f"{who!r} is not one of {NETWORKS}", "use actor or critic")
    b0 = _probe_batch(runs)
    if snoise.pooled_estimates(runs, who)["g2_U"].size == 0:
        raise _no_norms(runs, who)
    if n_star is not None and target is not None:
        raise PlanError("n_star", "both --n_star and --target given", "pass one of them")
    if target is not None:
        probe_n_star(runs, target)
    return b0


def batch_plan(runs: Sequence[Run], fit: dict, batches: Sequence[float] | None = None, *,
         who: str = "actor", n_star: float | None = None, target: float | None = None,
         half_width: float = 0.5, gen_batch_ratio: float | None = None, n_boot: int = 1000,
         block: int | None = None, n_windows: int = 8, level: float = stats.CI_LEVEL,
         seed: int = 0, link: planner_link.Link | None = None,
         external: step_cost.ExternalTime | None = None) -> dict:
    """Planner output (docs/api.md, plan.json) from probe runs at B0
    (seeds of one config: their updates are pooled) and a step-time fit (`fit_step_times`'
    output; a fit without "boot" has no throughput uncertainty).

    ``n_star`` (responses) or ``target`` (J*, N* from the probes' evals) sets the window
    whose B_simple gives B_crit; without either the whole run is the window. ``link``: how
    B_crit follows from the actor's B_simple (`planner_link`; None: the one fitted on the
    recorded studies of the probe's algorithm; the critic's B_crit is its B_simple).
    ``external``: time outside the model per update (a judge), added to every step time.
    """
    runs = list(runs)
    if not runs:
        raise PlanError("probe_run", "no probe run", "pass --probe_run=RUN_DIR")
    if who not in NETWORKS:
        raise PlanError("noise_of", f"{who!r} is not one of {NETWORKS}", "use actor or critic")
    b0 = _probe_batch(runs)
    batches = [float(b) for b in (batches or default_batches(b0))]
    if any(not (is_number(b) and b > 0) for b in batches):
        raise PlanError("batches", f"candidate batches must be positive numbers, got {batches}",
                        "pass e.g. --batches=64,128,256,512")
    if n_star is not None and target is not None:
        raise PlanError("n_star", "both --n_star and --target given", "pass one of them")
    if target is not None:
        n_star = probe_n_star(runs, target)
    if n_star is not None and not (is_number(n_star) and n_star > 0):
        raise PlanError("n_star", f"N* must be a positive number of responses, got {n_star}",
                        "pass the reference's responses to target")
    k = gen_batch_ratio if gen_batch_ratio is not None else runs[0].gen_batch_ratio
    if not (is_number(k) and k >= 1):
        raise PlanError("gen_batch_ratio", f"must be >= 1, got {k}", "1 = synchronous rollout")

    theta = step_cost.theta_of_fit(fit)
    theta_R4 = np.asarray(fit.get("boot", np.zeros((0, 4))), float).reshape(-1, 4)
    if theta_R4.shape[0] == 0:   # e.g. a roofline fit: no throughput uncertainty
        theta_R4 = theta[None, :]
    noise = {}
    for i, net in enumerate(NETWORKS):
        z = probe_noise(runs, net, n_star, half_width, n_windows, n_boot, block, level,
                        seed + 10 * i)
        if z is not None:
            noise[net] = z
    if who not in noise:
        raise _no_norms(runs, who)

    link = planner_link.link_for(runs[0].algo) if link is None else link
    by_net, reps = {}, {}
    for net, z in noise.items():
        w = z["window"]
        bc, bc_R = planner_link.b_crit_draws(w["b_simple"], w["reps"], link if net == "actor"
                                             else planner_link.IDENTITY, seed)
        rows, reps[net] = predict(batches, b0, bc, bc_R, theta, theta_R4, k, level, seed,
                                  external)
        rec = recommend(rows, reps[net]["T_RC"], level)
        if net == "actor":
            rec["separation"] = _separation(batches, b0, w, link, theta, theta_R4, k, level,
                                            seed, rec, reps[net]["T_RC"], external)
        by_net[net] = {"B_simple": w["b_simple"], "B_simple_ci": w["ci"], "predictions": rows,
                       "recommended": rec}
    main = by_net[who]
    warnings = []
    w = noise[who]["window"]
    if w["frac_unbounded"] and w["frac_unbounded"] > (1 - level) / 2:
        warnings.append(
            f"{who} |G|^2 is not above the noise in {w['frac_unbounded']:.0%} of the bootstrap "
            f"replicates of the window ({w['n_updates']} updates at B0 = {b0:g}): B_simple's "
            "interval is unbounded above and r_N's reaches down to 1 (this probe cannot "
            "exclude that larger batches cost no extra samples)")
    if not math.isfinite(w["b_simple"]):
        warnings.append(f"mean {who} |G|^2 over the window is <= 0: no sample cost is "
                        "predictable from this probe (r_N = 1); T/T0 is throughput only")
    out = {
        "reference_batch": b0,
        "B_simple": main["B_simple"], "B_simple_ci": main["B_simple_ci"],
        "predictions": main["predictions"],
        "recommended": main["recommended"],
        # extra fields
        "noise_of": who, "b_crit_rule": link.describe() if who == "actor" else
        planner_link.IDENTITY.describe(), "b_crit_link": dataclasses.asdict(link),
        "ci_level": level, "n_boot": n_boot, "gen_batch_ratio": k,
        "external_time": dataclasses.asdict(external) if external is not None else None,
        "algo": runs[0].algo, "lr_rule": runs[0].lr_rule,
        "group_size": sio.config_get(runs[0].config, "group_size", "G"),
        "probe_runs": [r.path or r.name for r in runs], "n_star": n_star, "target": target,
        "noise": {net: _noise_json(z) for net, z in noise.items()},
        "by_network": by_net,
        "critic_schedule": critic_schedule(main["recommended"]["batch"],
                                           by_net["critic"]["recommended"]["batch"])
        if "critic" in by_net else None,
        "throughput": dict(_fit_json(fit), check=step_cost.fit_check(fit["timings"], theta, b0)
                           if fit.get("timings") else None),
        "warnings": warnings,
    }
    return out


def _noise_json(z: dict) -> dict:
    strip = lambda d: {k: v for k, v in d.items() if k != "reps"}
    return {"network": z["network"], "b_small": z["b_small"], "b_big": z["b_big"],
            "window": strip(z["window"]), "whole_run": strip(z["whole_run"]),
            "trajectory": z["trajectory"]}


def _fit_json(fit: dict) -> dict:
    out = {k: v for k, v in fit.items() if k not in ("boot", "timings")
           and not isinstance(v, np.ndarray)}
    out["n_boot"] = int(np.asarray(fit["boot"]).shape[0]) if "boot" in fit else 0
    return out


def critic_schedule(batch: float, critic_batch: float) -> dict:
    """PPO's critic on its own schedule (TrainConfig.critic_minibatches): at the actor's
    recommended B, split each rollout into K = B / B_critic minibatches (K >= 1, rounded
    down to a power of two so it divides power-of-two prompt batches), so every critic update
    sees about the batch its own noise scale recommends (docs/science.md, Gradient noise
    scale: the two networks' critical batches differ)."""
    k = max(1, int(batch // max(critic_batch, 1.0)))
    k = 1 << (k.bit_length() - 1)
    return {"at_batch": float(batch), "critic_batch": float(critic_batch),
            "critic_minibatches": k, "critic_batch_per_update": float(batch) / k}



# ---------------------------------------------------------------------------------------------
# Figure and files.


def plot_plan(plan: dict, path: str, compare_rows: list[dict] | None = None) -> str:
    """PNG: predicted T/T0 (band: ci_level interval), r_N and r_q vs B on a log x axis, the
    recommended batch and range, measured T/T0 beside them when ``compare_rows`` is given;
    right panel: the B_simple trajectory over training with the N* window."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    pr = plan["predictions"]
    b = np.array([p["batch"] for p in pr])
    nan = lambda x: np.nan if x is None else x
    t = np.array([nan(p["T_over_T0"]) for p in pr], float)
    lo = np.array([nan(p["T_over_T0_ci"][0]) for p in pr], float)
    hi = np.array([nan(p["T_over_T0_ci"][1]) for p in pr], float)
    ax.fill_between(b, lo, hi, color="C0", alpha=0.2, label=f"T/T0 {plan['ci_level']:.0%}")
    ax.plot(b, t, "o-", color="C0", label="predicted T/T0")
    ax.plot(b, [p["r_N"] for p in pr], "--", color="C1", label="predicted r_N")
    ax.plot(b, [p["r_q"] for p in pr], ":", color="C2", label="predicted r_q")
    rec = plan["recommended"]
    ax.axvspan(rec["range"][0], rec["range"][1], color="C0", alpha=0.07)
    ax.axvline(rec["batch"], color="C0", lw=0.8)
    ax.axhline(1.0, color="k", lw=0.5)
    if compare_rows:
        rows = [r for r in compare_rows if r["T_over_T0_meas"] is not None]
        mb = np.array([r["batch"] for r in rows], float)
        mv = np.array([r["T_over_T0_meas"] for r in rows], float)
        ci = np.array([[nan(x) for x in (r["T_over_T0_meas_ci"] or [None, None])]
                       for r in rows], float).reshape(-1, 2)
        err = np.abs(np.stack([mv - ci[:, 0], ci[:, 1] - mv]))
        ax.errorbar(mb * 1.04, mv, yerr=np.nan_to_num(err, nan=0.0), fmt="s", color="C3",
                    ms=4, capsize=2, label="measured T/T0")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%.2g"))
    ax.set_xlabel("batch B (responses per update)")
    ax.set_ylabel("ratio to the reference")
    ax.set_title(f"B0 = {plan['reference_batch']:g}: recommended B = {rec['batch']:g} "
                 f"(range {rec['range'][0]:g}..{rec['range'][1]:g})", fontsize=9)
    ax.legend(fontsize=7)

    net = plan["noise"][plan["noise_of"]]
    tr, win = net["trajectory"], net["window"]
    fin = lambda x: x is not None and math.isfinite(x)
    vals = [v for w in tr + [win] for v in [w["b_simple"], *w["ci"]] if fin(v)]
    top = 3.0 * max(vals + [plan["reference_batch"]])
    for w in tr:
        x, (lo2, hi2) = w["responses_mid"], w["ci"]
        y = w["b_simple"] if fin(w["b_simple"]) else top
        lo2 = lo2 if fin(lo2) else top
        hi2 = hi2 if fin(hi2) else top
        ax2.plot([x, x], [lo2, hi2], color="C4", lw=1.5)
        ax2.plot([x], [y], "o" if fin(w["b_simple"]) else "^", color="C4", ms=5)
    ax2.plot([], [], "o-", color="C4", label="B_simple per window, interval")
    ax2.plot([], [], "^", color="C4", label="unbounded (|G|^2 <= 0)")
    if fin(win["b_simple"]) and win.get("responses_lo") is not None:
        ax2.hlines(win["b_simple"], win["responses_lo"], win["responses_hi"], color="C0",
                   label="N* window estimate")
    if win.get("n_star"):
        ax2.axvspan(win["responses_lo"], win["responses_hi"], color="C0", alpha=0.08)
        ax2.axvline(win["n_star"], color="C0", lw=0.8, label="N*")
    ax2.set_yscale("log")
    ax2.set_ylim(top=top * 1.3)
    ax2.axhline(plan["reference_batch"], color="k", lw=0.5, ls=":", label="B0")
    ax2.set_xlabel("cumulative responses")
    ax2.set_ylabel(f"{plan['noise_of']} B_simple")
    ax2.set_title(f"B_simple at N* window: {fmt_ci(plan['B_simple'], plan['B_simple_ci'])}",
                  fontsize=9)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def read_runs(paths: Sequence[str]) -> list[Run]:
    """Probe runs from run directories (config.json + metrics.jsonl)."""
    runs = []
    for p in paths:
        try:
            runs.append(sio.read_run(p))
        except FileNotFoundError:
            raise PlanError("probe_run", f"{p!r} has no metrics.jsonl", "pass a run directory "
                            "written by jaxrl-train (config.json + metrics.jsonl)") from None
    return runs


def sweep_runs(path: str) -> list[Run]:
    """Runs of a sweep directory, or of its ``logs/`` (a study's layout)."""
    logs = os.path.join(path, "logs")
    d = logs if os.path.isdir(logs) and not os.path.isfile(os.path.join(path, "metrics.jsonl")) \
        else path
    try:
        return sio.read_sweep(d).runs
    except FileNotFoundError:
        raise PlanError("step_times_from", f"{path!r} is not a directory", "pass a sweep "
                        "directory whose subdirectories are runs (or a study with logs/)") from None
