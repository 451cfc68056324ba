"""A recorded study replayed as a sequential one (`scaling.sequential`): its blocks taken in
the order they ran (warm-starts by their first seed, or seeds when the study had one
warm-start), the full analysis (`analysis.analyze_runs`) at each look on the blocks so far and
the configs still open, and what the runs it would have kept cost against all of them.

A non-reference run is charged up to the sweep's target stop (`stop_evals` evals after its
N*, at most what it ran), the reference runs and the runs that never reached in full, on both
sides, so the shares compare like with like on studies recorded before the target stop.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Sequence

from jaxrl_scale.scaling import sequential as sq
from jaxrl_scale.scaling.blocks import warm_start_blocks
from jaxrl_scale.scaling.io import Run, group_runs
from jaxrl_scale.scaling.references import resolve_references


LOOK_BOOT = 50


def block_order(runs: Sequence[Run]) -> tuple[dict[str, object], list]:
    """({run: its block}, blocks in the order they ran): warm-starts (w0, w1, ...) ordered by
    their smallest seed, or the seeds themselves for a one-warm-start study."""
    blocks = warm_start_blocks(runs)
    if blocks:
        first: dict[str, int] = {}
        for r in runs:
            b = blocks[r.name]
            first[b] = min(first.get(b, 1 << 30), r.seed if r.seed is not None else 1 << 30)
        return dict(blocks), sorted(first, key=lambda b: (first[b], b))
    of = {r.name: r.seed for r in runs}
    return of, sorted({s for s in of.values() if s is not None})


def run_cost(run: Run, n_star: float | None, reference: bool, stop_evals: int
             ) -> tuple[float, float]:
    """(responses, seconds of training and eval) of a run charged up to its target stop."""
    evals = [e for e in run.evals if e.get("responses") is not None]
    stop = math.inf
    if not reference and n_star is not None and math.isfinite(n_star):
        after = [e["responses"] for e in evals if e["responses"] >= n_star]
        if len(after) > stop_evals:
            stop = after[stop_evals]
    train = [t for t in run.train if t.get("responses", math.inf) <= stop] or run.train[:1]
    n = float(train[-1].get("responses", 0.0)) if train else 0.0
    secs = float(train[-1].get("time_s", 0.0)) if train else 0.0
    secs += sum(float(e.get("eval_s") or 0.0) for e in evals if e["responses"] <= stop)
    return n, secs


def decisions(runs: Sequence[Run], plan: sq.Plan, *, sweep_dir: str | None = None,
              **knobs) -> tuple[dict[str, sq.Decision], dict[str, int], dict]:
    """The rule on the looks the runs' blocks reach: (decisions, {config: blocks it ran},
    {"order": blocks in the order they ran, "of": {run: block}, "refs": reference configs,
    "history": {config: [Look]}}). ``knobs``: `analysis.Settings` fields. The tests are t
    tests on the blocks, which no bootstrap draw moves: each look's analysis draws only
    LOOK_BOOT replicates unless ``knobs`` says otherwise."""
    from jaxrl_scale.scaling.analysis import analyze_runs
    knobs = {"n_boot": LOOK_BOOT, **knobs}
    runs = list(runs)
    of, order = block_order(runs)
    rank = {b: i for i, b in enumerate(order)}
    refs = {name for name, _ in resolve_references(runs, None).values()}
    others = [g for g in group_runs(runs) if g not in refs]

    def test_at(W: int, open_: list[str]) -> dict[str, sq.Look]:
        s = analyze_runs(_subset(runs, of, rank, W, set(open_) | refs), "auto",
                         sweep_dir=sweep_dir, design="fixed", **knobs)
        out = {}
        for g in open_:
            c = s["configs"].get(g) or {}
            t = c.get("T_over_T0_test") or {}
            out[g] = sq.Look(W, _f(t.get("log_ratio")), _f(t.get("se")), _f(t.get("df"), 0.0),
                             censored="lower bound" in (c.get("test") or ""))
        return out

    dec, ran, history = sq.run_looks(plan, others, test_at, available=len(order))
    return dec, ran, {"order": order, "of": of, "refs": refs, "history": history}


def _subset(runs: Sequence[Run], of: dict, rank: dict, W: int, keep) -> list[Run]:
    """The runs of the first W blocks of the configs in ``keep``."""
    return [r for r in runs if of.get(r.name) in rank and rank[of[r.name]] < W
            and (r.group or r.name) in keep]


def replay(runs: Sequence[Run], plan: sq.Plan, *, sweep_dir: str | None = None,
           stop_evals: int = 3, **knobs) -> dict:
    """The sequential rule on recorded runs. Returns {"decisions": {config: Decision},
    "ran": {config: blocks}, "looks": [block counts looked at], "fixed": {config: verdict of
    the whole study}, "cost": {"sequential" | "fixed": {"blocks", "runs", "responses",
    "seconds"}}}. ``knobs``: `analysis.Settings` fields (e.g. n_boot)."""
    from jaxrl_scale.scaling.analysis import analyze_runs
    runs = list(runs)
    dec, ran, info = decisions(runs, plan, sweep_dir=sweep_dir, **knobs)
    order, of, refs = info["order"], info["of"], info["refs"]
    if len(order) < plan.looks[-1]:
        raise ValueError(f"the plan's last look needs {plan.looks[-1]} blocks; the study has "
                         f"{len(order)}")
    rank = {b: i for i, b in enumerate(order)}
    groups = group_runs(runs)
    full = analyze_runs(_subset(runs, of, rank, len(order), set(groups)), "auto",
                        sweep_dir=sweep_dir, design="fixed", **knobs)
    n_star = {n: x.get("N_star") for n, x in full["runs"].items()}
    study_blocks = max(ran.values()) if ran else plan.looks[-1]
    cost = {}
    for design, blocks in (("sequential", {**ran, **{g: study_blocks for g in refs}}),
                           ("fixed", {g: len(order) for g in groups})):
        used = [r for r in runs if (r.group or r.name) in blocks and of.get(r.name) in rank
                and rank[of[r.name]] < blocks[r.group or r.name]]
        cs = [run_cost(r, n_star.get(r.name), (r.group or r.name) in refs, stop_evals)
              for r in used]
        cost[design] = {"blocks": max(blocks.values()), "runs": len(used),
                        "responses": sum(c[0] for c in cs), "seconds": sum(c[1] for c in cs)}
    return {"decisions": dec, "ran": ran,
            "looks": [h.blocks for h in max(info["history"].values(), key=len)],
            "fixed": {g: (full["configs"].get(g) or {}).get("verdict") for g in ran},
            "cost": cost}


def recorded_plan(sweep_dir: str | None) -> sq.Plan | None:
    """The Plan of a study run with --design=sequential (its sweep.json), else None."""
    from jaxrl_scale.scaling.io import SWEEP_FILE, sweep_dirs
    dirs = sweep_dirs(sweep_dir)
    path = os.path.join(dirs[0], SWEEP_FILE) if len(dirs) == 1 else None
    if not path or not os.path.isfile(path):
        return None
    with open(path) as f:
        return sq.plan_of(json.load(f).get("sweep") or {})


def sequential_summary(runs: Sequence[Run], plan: sq.Plan, sweep_dir: str | None,
                       ci_level: float, target_fraction: float | None) -> dict:
    """A sequential study's decisions on its runs (`decisions`, the same the sweep took at
    its looks): summary.json "sequential" (docs/api.md, Summary)."""
    dec, ran, info = decisions(runs, plan, sweep_dir=sweep_dir, ci_level=ci_level,
                               target_fraction=target_fraction)
    return {"plan": {"looks": list(plan.looks), "spending": plan.spending,
                     "level": plan.level, "margin": list(plan.margin),
                     "futility": plan.futility},
            "blocks": len(info["order"]),
            "decisions": {g: dataclasses.asdict(d) for g, d in dec.items()},
            "runs": ran}


def with_sequential_verdicts(cstats: dict, seq: dict | None) -> dict:
    """Each config's verdict in a sequential study: its decision, faster / slower as such
    and every other decision "indistinguishable" (docs/api.md, Summary: sequential)."""
    if not seq:
        return cstats
    out = dict(cstats)
    for g, d in seq["decisions"].items():
        if g in out:
            out[g] = dataclasses.replace(out[g], verdict=d["verdict"] if d["verdict"] in (
                "faster", "slower") else "indistinguishable")
    return out


def _f(x, default=math.nan) -> float:
    return float(x) if x is not None else default
