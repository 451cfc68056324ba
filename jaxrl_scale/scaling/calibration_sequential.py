"""Calibration of the sequential study (`scaling.sequential`) beside the fixed design: the
same simulated sweeps (`calibration.simulate_estimates`, with the warm-start interaction and
each warm-start's timing pass in its own machine state), the same decision function
(`familywise.sweep_tests`) at every look on the blocks run so far, and what each design costs.

Cost of a run: a reference run goes to the budget; another stops `stop_evals` evals after its
N* (the sweep's target stop), at most at the budget. A study's cost: its warm-starts (one SFT
each), runs and responses.
"""

from __future__ import annotations

import math

import numpy as np

from jaxrl_scale.scaling import calibration as cal
from jaxrl_scale.scaling import familywise
from jaxrl_scale.scaling import sequential as sq


def sequential_sweep(design: cal.Design, plan: sq.Plan, est: dict, units, i: int,
                     level: float) -> tuple[dict[str, sq.Decision], dict[str, int]]:
    """Simulated sweep i run as a sequential study: its decisions and the blocks each config
    ran ({config: blocks}; the reference's are the study's)."""
    names = [c[0] for c in design.configs]

    def test_at(W: int, open_: list[str]) -> dict[str, sq.Look]:
        configs, per_run, offsets, block_offsets = cal.sweep_inputs(
            design, est, units, i, level, blocks=W, keep=open_)
        fw = familywise.sweep_tests(configs, per_run, {}, {"grpo": names[0]}, level,
                                    offsets=offsets, block_offsets=block_offsets)
        return {g: look(W, fw["configs"][g].T_over_T0_test, not configs[g]["reached"])
                for g in open_ if g in fw["configs"]}

    dec, ran, _ = sq.run_looks(plan, names[1:], test_at)
    return dec, {**ran, names[0]: max(ran.values())}


def look(W: int, test: dict, censored: bool) -> sq.Look:
    """A Look from a FamilyTest's T_over_T0_test ({log_ratio, se, df})."""
    return sq.Look(W, _num(test.get("log_ratio")), _num(test.get("se")),
                   _num(test.get("df"), 0.0), censored=censored)


def _num(x, default=math.nan) -> float:
    return float(x) if x is not None else default


def run_responses(design: cal.Design, est: dict, i: int, c: int, n_runs: int,
                  reference: bool, stop_evals: int) -> float:
    """Responses the first n_runs runs of config c used in sweep i (the sweep's target stop)."""
    if reference:
        return float(n_runs * design.max_responses)
    n = est["N"][i, c, :n_runs]
    e = design.eval_every
    stop = np.where(np.isfinite(n), (np.ceil(np.nan_to_num(n) / e) + stop_evals) * e,
                    design.max_responses)
    return float(np.minimum(stop, design.max_responses).sum())


def sequential_rates(design: cal.Design, plan: sq.Plan, n_sweeps: int, seed: int = 0,
                     r_N: dict | None = None, q_ratio: dict | None = None,
                     level: float = 0.9, stop_evals: int = 3) -> dict:
    """Per arm (the truth r_N, q_ratio): the sequential study's and the fixed design's verdicts
    on the same n_sweeps simulated sweeps, their error rates and costs.

    Returns {"sequential": {config: {verdict: rate}}, "fixed": {...}, "fwer_sequential",
    "fwer_fixed" (any faster / slower against the truth's side), "wrong_stop" (equivalent
    with the truth outside the margin, or "not faster by the margin" with a truth below the
    futility bound), "looks" {look: share of sweeps that ended there}, "cost": {design:
    {"warm_starts", "runs", "responses"} means}}; every rate with its Wilson interval."""
    r_N, q_ratio = r_N or {}, q_ratio or {}
    rng = np.random.default_rng(seed)
    if design.warm_starts > 1 and plan.looks[-1] != design.warm_starts:
        raise ValueError(f"the plan's last look ({plan.looks[-1]} blocks) must be the "
                         f"design's warm-starts ({design.warm_starts})")
    est = cal.simulate_estimates(design, n_sweeps, rng, r_N, q_ratio)
    W = design.warm_starts
    units = (cal.simulate_pass_units(design, rng, q_ratio, n_sweeps * W).reshape(
        n_sweeps, W, len(design.configs), -1) if design.timing_blocks else None)
    names = [c[0] for c in design.configs]
    truth = {g: r_N.get(g, 1.0) / q_ratio.get(g, 1.0) for g in names}
    per_block = design.seeds if W > 1 else 1
    calls = {d: {g: [] for g in names[1:]} for d in ("sequential", "fixed")}
    wrong = {"sequential": [], "fixed": []}
    wrong_stop, ended = [], []
    cost = {d: {"warm_starts": [], "runs": [], "responses": []} for d in calls}
    for i in range(n_sweeps):
        dec, ran = sequential_sweep(design, plan, est, units, i, level)
        configs, per_run, offsets, block_offsets = cal.sweep_inputs(design, est, units, i,
                                                                    level)
        fw = familywise.sweep_tests(configs, per_run, {}, {"grpo": names[0]}, level,
                                    offsets=offsets, block_offsets=block_offsets)
        fixed = {g: fw["configs"][g].verdict if g in fw["configs"] else "not reached"
                 for g in names[1:]}
        for d, v in (("sequential", {g: x.verdict for g, x in dec.items()}), ("fixed", fixed)):
            for g in names[1:]:
                calls[d][g].append(v[g])
            wrong[d].append(any(v[g] == "faster" and truth[g] >= 1 or
                                v[g] == "slower" and truth[g] <= 1 for g in names[1:]))
        wrong_stop.append(any(
            x.verdict == "equivalent" and not plan.margin[0] <= truth[g] <= plan.margin[1]
            or x.verdict == "not faster by the margin" and truth[g] < (plan.futility or 0)
            for g, x in dec.items()))
        ended.append(max(ran.values()))
        for d, blocks in (("sequential", ran), ("fixed", {g: W if W > 1 else design.seeds
                                                          for g in names})):
            n_runs = {g: blocks[g] * per_block for g in names}
            cost[d]["warm_starts"].append(max(blocks.values()) if W > 1 else 1)
            cost[d]["runs"].append(sum(n_runs.values()))
            cost[d]["responses"].append(sum(
                run_responses(design, est, i, c, n_runs[g], c == 0, stop_evals)
                for c, g in enumerate(names)))
    return {"n_sweeps": n_sweeps, "seed": seed, "r_N": r_N, "q_ratio": q_ratio,
            "plan": {"looks": list(plan.looks), "spending": plan.spending,
                     "level": plan.level, "margin": list(plan.margin),
                     "futility": plan.futility},
            **{d: {g: {v: cal.rate([x == v for x in xs]) for v in sorted(set(xs))}
                   for g, xs in calls[d].items()} for d in calls},
            "fwer_sequential": cal.rate(wrong["sequential"]),
            "fwer_fixed": cal.rate(wrong["fixed"]),
            "wrong_stop": cal.rate(wrong_stop),
            "looks": {str(w): float(np.mean(np.equal(ended, w))) for w in sorted(set(ended))},
            "cost": {d: {k: float(np.mean(v)) for k, v in c.items()} for d, c in cost.items()}}
